//! Example worker function (SQS request queue of the `orders` pipeline).

use std::sync::Arc;

use order_worker::{contract, OrderSteps};
use stepline_worker::lambda::run_worker;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    run_worker(contract(), Arc::new(OrderSteps)).await
}
