//! Lambda function: scheduled maintenance (expiry sweeps), triggered every minute.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run_maintenance())
}
