//! Launch function (SQS launch queue): saves a step as `launching`, then sends it to its worker.

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use stepline::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use stepline::config::CoordinatorConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let coordinator = Arc::new(stepline::aws::coordinator(
        &stepline::aws::lambda_sdk_config(),
        &CoordinatorConfig::from_env()?,
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let coordinator = coordinator.clone();
        async move {
            Ok::<SqsBatchResponse, lambda_runtime::Error>(
                stepline::handlers::launch(&coordinator, event.payload).await,
            )
        }
    }))
    .await
}
