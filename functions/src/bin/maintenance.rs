//! Lambda function: scheduled maintenance (expiry sweeps), triggered every minute.

#[tokio::main]
async fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::run_maintenance().await
}
