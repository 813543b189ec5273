//! Lambda function: UpdateOperatorKey.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run("update-operator-key"))
}
