//! Lambda function: the scheduled webhook dispatcher.

#[tokio::main]
async fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::run_delivery().await
}
