//! Worker function of the restaurant-approval example.

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use restaurant_approval::RestaurantSteps;
use stepline::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use stepline::config::WorkerConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let worker = Arc::new(stepline::aws::worker(
        &stepline::aws::sdk_config().await,
        &WorkerConfig::from_env()?,
        &restaurant_approval::contract(),
        Arc::new(RestaurantSteps),
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let worker = worker.clone();
        async move { Ok::<SqsBatchResponse, lambda_runtime::Error>(worker.handle(event.payload).await) }
    }))
    .await
}
