//! Lambda function: GetUsage.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run("get-usage"))
}
