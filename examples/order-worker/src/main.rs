//! Example worker function (SQS request queue of the `orders` pipeline).

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use order_worker::OrderSteps;
use stepline::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use stepline::config::WorkerConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let worker = Arc::new(stepline::aws::worker(
        &stepline::aws::sdk_config().await,
        &WorkerConfig::from_env()?,
        &order_worker::contract(),
        Arc::new(OrderSteps),
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let worker = worker.clone();
        async move { Ok::<SqsBatchResponse, lambda_runtime::Error>(worker.handle(event.payload).await) }
    }))
    .await
}
