//! Lambda function: GetActionKind.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run("get-action-kind"))
}
