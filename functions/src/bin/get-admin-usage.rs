//! Lambda function: GetAdminUsage.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run("get-admin-usage"))
}
