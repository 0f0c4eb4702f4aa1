//! Redrive function (operator-invoked): re-drives one FAILED or DLQ execution.

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use stepline::config::CoordinatorConfig;
use stepline::handlers::RedriveRequest;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let coordinator = Arc::new(stepline::aws::coordinator(
        &stepline::aws::sdk_config().await,
        &CoordinatorConfig::from_env()?,
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<RedriveRequest>| {
        let coordinator = coordinator.clone();
        async move { stepline::handlers::redrive(&coordinator, event.payload).await }
    }))
    .await
}
