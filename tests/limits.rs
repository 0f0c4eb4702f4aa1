//! Size limits on the emulator: a worker's large error is stored once, and a step whose outcome would
//! make the execution item exceed DynamoDB's 400 KB fails at once with `ITEM_TOO_LARGE` and is
//! dead-lettered with its context, where the refused write used to be retried until its reply
//! dead-lettered and the execution timed out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde_json::Value;
use stepline::adapters::SqsSender;
use stepline::domain::{Code, Status, StepError};
use stepline::envelope::{DeadLetterEnvelope, RequestHeader};
use stepline::ports::{MessageSender, OutMessage};
use stepline::worker::StepFunction;
use stepline_suite::TestStack;

/// Fails the first step with an error message of 210 KB: a reply SQS and the coordinator take, more
/// than half of what an item holds.
struct HugeError;

#[async_trait]
impl StepFunction for HugeError {
    async fn run(&self, _request: &RequestHeader, _input: Value) -> Result<Value, StepError> {
        Err(StepError::new("HUGE", "e".repeat(210_000), false))
    }
}

/// A stack of the example pipeline whose worker fails with [`HugeError`].
async fn failing_stack(prefix: &str) -> anyhow::Result<TestStack> {
    let mut stack = TestStack::new(prefix, |_| {}).await?;
    stack.start(Arc::new(HugeError))?;
    Ok(stack)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_worker_error_is_stored_once_and_fails_the_execution_with_its_code(
) -> anyhow::Result<()> {
    let stack = failing_stack("limits-error").await?;
    let id = stack.submit(order_worker::sample_order(1)).await?;
    let record = stack.wait_dead_lettered(id).await?;
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.attempt, 1,
        "failed on its first reply, not after timeouts"
    );
    let error = record.error.expect("an error");
    assert_eq!(
        (error.code.as_str(), error.message.len()),
        ("HUGE", 210_000)
    );
    assert_eq!(
        record.steps[0].error.as_ref().map(|e| e.code.as_str()),
        Some("HUGE")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_too_large_for_the_item_fails_the_execution_with_item_too_large(
) -> anyhow::Result<()> {
    let stack = failing_stack("limits").await?;
    // An input of 200 KB, kept in the record until the first step succeeds, beside the 210 KB error.
    let mut input = order_worker::sample_order(1);
    input["note"] = Value::String("n".repeat(200_000));
    let id = stack.submit(input).await?;
    let record = stack.wait_dead_lettered(id).await?;
    assert_eq!(record.status, Status::Failed);
    let error = record.error.expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(error.message.contains("HUGE"), "{}", error.message);
    assert_eq!(
        record.attempt, 1,
        "failed on its first reply, not after timeouts"
    );

    // Dead-lettered with its context; the reply itself was not poison.
    let (_, dlq) = stack.local.stack.queue("ExecutionDeadLetterQueue")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        if let Some(message) = stepline_local::receive(&stack.sqs(), dlq).await?.pop() {
            break message;
        }
        anyhow::ensure!(Instant::now() < deadline, "no dead-letter envelope in 30 s");
    };
    let envelope: DeadLetterEnvelope =
        serde_json::from_str(message.body.as_deref().unwrap_or_default())?;
    assert_eq!(envelope.execution_id, id);
    assert_eq!(
        envelope.error.map(|e| e.code),
        Some(Code::ItemTooLarge.as_str().to_string())
    );
    assert_eq!(stack.queue_depth("ReplyDeadLetterQueue").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_sent_together_are_split_into_batches_that_fit() -> anyhow::Result<()> {
    // Ten replies of 120 KB: 1.2 MB in one SendMessageBatch is refused as a whole (over the batch
    // limit), and a sender that groups by count alone fails all ten, every time it retries.
    let stack = TestStack::new("limits-batch", |_| {}).await?;
    let (_, url) = stack.local.stack.queue("ReplyQueue")?;
    let messages: Vec<OutMessage> = (0..10)
        .map(|i| OutMessage::new(format!("{i}{}", "r".repeat(120_000))))
        .collect();
    let results = SqsSender::new(stack.sqs()).send(url, &messages).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| {
            r.as_ref()
                .err()
                .map(|e| e.reason.chars().take(120).collect())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 10 not sent: {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(stack.queue_depth("ReplyQueue").await?, 10);
    Ok(())
}
