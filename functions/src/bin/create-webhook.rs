//! Lambda function: CreateWebhook.

#[tokio::main]
async fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::run(cycles_shared::Operation::CreateWebhook).await
}
