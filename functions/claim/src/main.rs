//! Claim function (EventBridge schedule): sweeps the due-time index and takes leases on due executions.

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use stepline::aws_lambda_events::event::eventbridge::EventBridgeEvent;
use stepline::config::CoordinatorConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let coordinator = Arc::new(stepline::aws::coordinator(
        &stepline::aws::lambda_sdk_config(),
        &CoordinatorConfig::from_env()?,
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<EventBridgeEvent>| {
        let coordinator = coordinator.clone();
        // The sweep stops in time to send what it claimed before the invocation's deadline.
        let deadline = i64::try_from(event.context.deadline).ok();
        async move { stepline::handlers::claim_within(&coordinator, event.payload, deadline).await }
    }))
    .await
}
