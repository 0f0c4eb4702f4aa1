//! The hot path: a worker's reply reaches the next step's request in two sequential calls (one
//! conditional write, one send) when the completing process committed the execution last, and falls
//! back to a read when its copy is stale, never deciding on it otherwise.

mod common;

use std::sync::Arc;

use common::{last_request, reply, settings, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, InMemoryReleaseRegistry, RecordingSender};
use stepline::domain::{launch_id, PipelineDef, Status};
use stepline::envelope::{ReplyEnvelope, ReplyOutcome};
use stepline::ports::SystemClock;
use stepline::{handlers, Coordinator};
use uuid::Uuid;

fn def() -> PipelineDef {
    task_pipeline("hot", &["a", "b", "c"])
}

/// A reply for the request last sent to `requests`.
fn reply_to_last_request(sender: &RecordingSender) -> String {
    let header = last_request(sender);
    let output = json!({"done": header.step_id});
    reply(&header, ReplyOutcome::Succeeded { output })
}

async fn setup() -> (
    Arc<InMemoryExecutionStore>,
    Arc<RecordingSender>,
    Coordinator,
    Uuid,
) {
    let store = Arc::new(InMemoryExecutionStore::default());
    let (sender, coordinator, id) = submitted(def(), store.clone()).await;
    // The submit launched the first step itself: its request is what it sent.
    assert_eq!(store.writes(), 1, "one write: the create");
    (store, sender, coordinator, id)
}

#[tokio::test]
async fn a_reply_to_the_process_that_launched_the_step_costs_one_write_and_one_send() {
    let (store, sender, coordinator, id) = setup().await;
    let reply = reply_to_last_request(&sender);
    let (gets, writes) = (store.gets(), store.writes());

    let response = handlers::completion(&coordinator, sqs(reply)).await;

    assert!(response.batch_item_failures.is_empty());
    assert_eq!(store.gets() - gets, 0, "no read on the hot path");
    assert_eq!(store.writes() - writes, 1, "one conditional write");
    let sent = sender.drain();
    assert_eq!(sent.len(), 1, "one send: the next request");
    let next: serde_json::Value = serde_json::from_str(&sent[0].1.body).unwrap();
    assert_eq!(next["header"]["launchId"], launch_id(id, 1, 1).to_string());
    // And again for the next hop, to the end.
    let reply = serde_json::to_string(&ReplyEnvelope::for_request(
        &serde_json::from_value(next["header"].clone()).unwrap(),
        ReplyOutcome::Succeeded { output: json!({}) },
    ))
    .unwrap();
    let gets = store.gets();
    handlers::completion(&coordinator, sqs(reply)).await;
    assert_eq!(store.gets(), gets);
    assert_eq!(store.snapshot(id).unwrap().step, 2);
}

#[tokio::test]
async fn a_stale_copy_is_never_trusted() {
    let (store, sender, coordinator, id) = setup().await;
    let reply = reply_to_last_request(&sender);
    // Someone else cancels the execution after this process launched the step.
    let other = Coordinator::new(
        store.clone(),
        Arc::new(InMemoryReleaseRegistry::default()),
        Arc::new(RecordingSender::default()),
        Arc::new(SystemClock),
        settings(),
    );
    let mut record = store.snapshot(id).unwrap();
    let expected = record.version;
    record.status = Status::Cancelled;
    record.version += 1;
    other.store().replace(&record, expected).await.unwrap();
    let gets = store.gets();

    let response = handlers::completion(&coordinator, sqs(reply)).await;

    assert!(response.batch_item_failures.is_empty());
    assert!(store.gets() > gets, "the lost race made it read");
    let after = store.snapshot(id).unwrap();
    assert_eq!(
        after.status,
        Status::Cancelled,
        "a cancelled execution does not advance"
    );
    assert_eq!(after.version, record.version);
    assert!(
        sender.drain().iter().all(|(q, _)| q != "requests"),
        "nothing launched"
    );
}
