//! Example worker function (SQS request queue of the `orders` pipeline).

use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline_worker::lambda::run_worker(
        order_worker::contract(),
        Arc::new(order_worker::OrderSteps),
    )
    .await
}
