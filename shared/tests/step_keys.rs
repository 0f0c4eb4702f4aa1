//! The step key a request carries for the step's side effects: the same for every attempt of the
//! step, after a retry and after a re-drive, where the launch id changes; another step's or another
//! execution's key is another.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{reply, sqs, submit_to, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::domain::{PipelineDef, RetryPolicy, Status, StepError};
use stepline::envelope::{ReplyOutcome, RequestHeader};
use stepline::handlers::{self, RedriveRequest};
use stepline::Coordinator;

/// Two steps, two attempts each, retried 1 ms after a failure.
fn def() -> PipelineDef {
    let mut def = task_pipeline("keys", &["charge", "ship"]);
    for step in &mut def.steps {
        step.retry = RetryPolicy::doubling(2, 1, 1);
    }
    def
}

/// Carries out what the coordinator sent since the last look, as its queues' consumers would:
/// launch work goes to the launch function (until the retry it waits for is due); the requests sent
/// to workers are returned.
async fn deliver(coordinator: &Coordinator, sender: &RecordingSender) -> Vec<RequestHeader> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut requests = Vec::new();
    let mut pending = sender.drain();
    while let Some((queue, message)) = pending.pop() {
        match queue.as_str() {
            "requests" => {
                let body: serde_json::Value = serde_json::from_str(&message.body).unwrap();
                requests.push(serde_json::from_value(body["header"].clone()).unwrap());
            }
            "launch" => loop {
                let response = handlers::launch(coordinator, sqs(message.body.clone())).await;
                assert!(response.batch_item_failures.is_empty(), "launch work taken");
                let sent = sender.drain();
                if !sent.is_empty() {
                    pending.extend(sent);
                    break;
                }
                // The retry it carries is not due yet: it comes again.
                assert!(Instant::now() < deadline, "the retry never launched");
                tokio::time::sleep(Duration::from_millis(5)).await;
            },
            _ => {}
        }
    }
    requests
}

async fn answer(coordinator: &Coordinator, request: &RequestHeader, outcome: ReplyOutcome) {
    let response = handlers::completion(coordinator, sqs(reply(request, outcome))).await;
    assert!(response.batch_item_failures.is_empty(), "reply applied");
}

fn failed(retryable: bool) -> ReplyOutcome {
    ReplyOutcome::Failed {
        error: StepError::new("DECLINED", "the card was declined", retryable),
    }
}

#[tokio::test]
async fn a_step_keeps_its_key_across_retries_and_re_drives_and_no_other_step_shares_it() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let (sender, coordinator, id) = submitted(def(), store.clone()).await;
    let first = deliver(&coordinator, &sender)
        .await
        .pop()
        .expect("a request");
    assert_eq!((first.step_index, first.attempt), (0, 1));
    assert_eq!(first.step_key.len(), 32, "a key: {first:?}");

    // Attempt 2, after a retryable failure: another launch id, the same key.
    answer(&coordinator, &first, failed(true)).await;
    let second = deliver(&coordinator, &sender).await.pop().expect("a retry");
    assert_eq!((second.step_index, second.attempt), (0, 2));
    assert_ne!(second.launch_id, first.launch_id);
    assert_eq!(second.step_key, first.step_key);

    // The execution fails; re-driven, the step runs again under the same key.
    answer(&coordinator, &second, failed(false)).await;
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    coordinator
        .redrive(RedriveRequest {
            execution_id: id,
            expected_version: record.version,
            reason: "card replaced".into(),
            release_version: None,
        })
        .await
        .unwrap();
    let third = deliver(&coordinator, &sender)
        .await
        .pop()
        .expect("a re-driven attempt");
    assert_eq!(third.step_index, 0);
    assert!(third.attempt > second.attempt);
    assert_ne!(third.launch_id, second.launch_id);
    assert_eq!(third.step_key, first.step_key);

    // The next step has a key of its own.
    answer(
        &coordinator,
        &third,
        ReplyOutcome::Succeeded { output: json!({}) },
    )
    .await;
    let next = deliver(&coordinator, &sender)
        .await
        .pop()
        .expect("the next step");
    assert_eq!(next.step_index, 1);
    assert_eq!(next.step_key.len(), 32);
    assert_ne!(next.step_key, first.step_key);

    // Another execution's first step has another key.
    let other = submit_to(&coordinator, "keys").await;
    let theirs = deliver(&coordinator, &sender)
        .await
        .pop()
        .expect("its request");
    assert_eq!((theirs.execution_id, theirs.step_index), (other, 0));
    assert_ne!(theirs.step_key, first.step_key);
}
