//! Operator function (invoked directly): re-drive or cancel one execution, or replay the execution DLQ.
//! Payload: `{"action": "redrive" | "cancel" | "replay", ...}` (see `stepline::handlers::OperatorRequest`).

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use stepline::adapters::SqsDeadLetterQueue;
use stepline::config::CoordinatorConfig;
use stepline::handlers::OperatorRequest;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let sdk = stepline::aws::sdk_config().await;
    let config = CoordinatorConfig::from_env()?;
    let coordinator = Arc::new(stepline::aws::coordinator(&sdk, &config));
    let dead_letters = Arc::new(SqsDeadLetterQueue::new(
        aws_sdk_sqs::Client::new(&sdk),
        &config.execution_dlq_url,
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<OperatorRequest>| {
        let (coordinator, dead_letters) = (coordinator.clone(), dead_letters.clone());
        async move {
            stepline::handlers::operator(&coordinator, dead_letters.as_ref(), event.payload).await
        }
    }))
    .await
}
