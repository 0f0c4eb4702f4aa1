//! Operator function (invoked directly): re-drive or cancel one execution, replay the execution DLQ,
//! or move a coordinator queue's dead letters back. Payload: `{"action": "redrive" | "cancel" |
//! "replay" | "move", ...}` (see `stepline::handlers::OperatorRequest`).

use std::sync::Arc;

use lambda_runtime::{service_fn, LambdaEvent};
use stepline::adapters::SqsDeadLetterQueue;
use stepline::config::CoordinatorConfig;
use stepline::handlers::{DeadLetterQueues, OperatorRequest};

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let sdk = stepline::aws::lambda_sdk_config();
    let config = CoordinatorConfig::from_env()?;
    let coordinator = Arc::new(stepline::aws::coordinator(&sdk, &config));
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let start = config
        .start_dlq_url
        .as_ref()
        .map(|url| Arc::new(SqsDeadLetterQueue::new(sqs.clone(), url)));
    let queues = Arc::new([
        SqsDeadLetterQueue::new(sqs.clone(), &config.execution_dlq_url),
        SqsDeadLetterQueue::new(sqs.clone(), &config.launch_dlq_url),
        SqsDeadLetterQueue::new(sqs, &config.reply_dlq_url),
    ]);
    lambda_runtime::run(service_fn(|event: LambdaEvent<OperatorRequest>| {
        let (coordinator, queues, start) = (coordinator.clone(), queues.clone(), start.clone());
        async move {
            let dlqs = DeadLetterQueues {
                execution: &queues[0],
                launch: &queues[1],
                reply: &queues[2],
                start: start.as_deref().map(|q| q as _),
            };
            stepline::handlers::operator(&coordinator, &dlqs, event.payload).await
        }
    }))
    .await
}
