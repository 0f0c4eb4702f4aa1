//! Size limits end in a typed, final failure, never in a retry loop: a step whose outcome makes the
//! execution record too large for the store fails with `ITEM_TOO_LARGE` and is dead-lettered.

mod common;

use std::sync::Arc;

use common::{last_request, reply, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::domain::{Code, Status, StepError};
use stepline::envelope::ReplyOutcome;
use stepline::{handlers, Coordinator};
use uuid::Uuid;

/// A store refusing records over 20 KB, and an execution of two steps launched on it.
async fn launched() -> (
    Arc<InMemoryExecutionStore>,
    Arc<RecordingSender>,
    Coordinator,
    Uuid,
) {
    let store = Arc::new(InMemoryExecutionStore::default().with_item_limit(20_000));
    let (sender, coordinator, id) =
        submitted(task_pipeline("limits", &["a", "b"]), store.clone()).await;
    (store, sender, coordinator, id)
}

#[tokio::test]
async fn an_output_too_large_for_the_record_fails_the_step_with_item_too_large_at_once() {
    let (store, sender, coordinator, id) = launched().await;
    let output = json!({"blob": "x".repeat(30_000)});
    let body = reply(&last_request(&sender), ReplyOutcome::Succeeded { output });

    let response = handlers::completion(&coordinator, sqs(body.clone())).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "the reply is not retried: {response:?}"
    );
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    let error = record.error.clone().expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(!error.retryable);
    assert!(error.message.contains("output"), "{}", error.message);
    let sent = sender.drain();
    assert!(
        sent.iter()
            .any(|(q, m)| q == "execution-dlq" && m.body.contains("ITEM_TOO_LARGE")),
        "dead-lettered with its code: {sent:?}"
    );
    assert!(
        !sent.iter().any(|(q, _)| q == "reply-dlq"),
        "the reply itself is not poison"
    );

    // The same reply delivered again is the duplicate of what was applied: acknowledged, no write.
    let writes = store.writes();
    let again = handlers::completion(&coordinator, sqs(body)).await;
    assert!(again.batch_item_failures.is_empty());
    assert_eq!(store.writes(), writes);
    assert_eq!(store.snapshot(id).unwrap().version, record.version);
}

#[tokio::test]
async fn an_error_too_large_for_the_record_fails_with_item_too_large_naming_the_workers_code() {
    let (store, sender, coordinator, id) = launched().await;
    let error = StepError::new("HUGE", "e".repeat(15_000), false);
    let body = reply(&last_request(&sender), ReplyOutcome::Failed { error });

    let response = handlers::completion(&coordinator, sqs(body)).await;
    assert!(response.batch_item_failures.is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    let error = record.error.expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(error.message.contains("HUGE"), "{}", error.message);

    // Nothing is stuck: the failed execution reads as it is, and an operator can re-drive it.
    assert_eq!(coordinator.get(id).await.unwrap().status, Status::Failed);
    let version = store.snapshot(id).unwrap().version;
    let redriven = coordinator
        .redrive(handlers::RedriveRequest {
            execution_id: id,
            expected_version: version,
            reason: "smaller outputs deployed".into(),
        })
        .await
        .unwrap();
    assert_eq!(redriven.status, Status::Queued);
}
