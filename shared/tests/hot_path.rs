//! The hot path: a worker's reply reaches the next step's request in two sequential calls (one
//! conditional write, one send) when the completing process committed the execution last, or, in any
//! other process, on the record sealed in the reply's token; it falls back to a read when its copy is
//! stale or the seal does not hold, never deciding on it otherwise.

mod common;

use std::sync::Arc;

use common::{last_request, reply, settings, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, InMemoryReleaseRegistry, RecordingSender};
use stepline::domain::{launch_id, PipelineDef, Status};
use stepline::envelope::{ReplyEnvelope, ReplyOutcome};
use stepline::ports::{ExecutionStore, SystemClock};
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

/// Another process of the same deployment (same registry and sealing keys as `coordinator`), with no
/// record cached, sending to `sender`.
fn another_process(
    store: &Arc<InMemoryExecutionStore>,
    coordinator: &Coordinator,
    sender: Arc<RecordingSender>,
) -> Coordinator {
    Coordinator::new(
        store.clone(),
        coordinator.registry().clone(),
        sender,
        Arc::new(SystemClock),
        settings(),
    )
    .with_keys(coordinator.key_source().expect("keys").clone())
}

#[tokio::test]
async fn any_process_decides_on_the_sealed_record_without_a_read() {
    let (store, sender, coordinator, id) = setup().await;
    let other = another_process(&store, &coordinator, sender.clone());
    // Every hop handled by a process that did not commit the record (the second by one just started):
    // the seal stands in for its cache.
    let fresh = another_process(&store, &coordinator, sender.clone());
    for (step, handler) in [(1u32, &other), (2, &fresh)] {
        let reply = reply_to_last_request(&sender);
        let (gets, writes) = (store.gets(), store.writes());
        let response = handlers::completion(handler, sqs(reply)).await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(store.gets() - gets, 0, "hop {step}: no read");
        assert_eq!(
            store.writes() - writes,
            1,
            "hop {step}: one conditional write"
        );
        assert_eq!(store.snapshot(id).unwrap().step, step);
    }
    assert_eq!(
        last_request(&sender).launch_id,
        launch_id(id, 2, 1),
        "the last step launched"
    );
}

/// `process` takes the reply `body` without a failure, reading the record from the store to do so.
async fn handled_by_reading(
    process: &Coordinator,
    store: &InMemoryExecutionStore,
    body: String,
    read: &str,
) {
    let gets = store.gets();
    assert!(handlers::completion(process, sqs(body))
        .await
        .batch_item_failures
        .is_empty());
    assert!(store.gets() > gets, "{read}");
}

#[tokio::test]
async fn a_seal_that_does_not_hold_or_is_stale_is_never_trusted() {
    // A process of another deployment (another key): the seal does not hold, it reads and advances.
    let (store, sender, _coordinator, id) = setup().await;
    let stranger = common::coordinator_of(def(), store.clone(), sender.clone()).await;
    let mut header = last_request(&sender);
    let answer = reply(&header, ReplyOutcome::Succeeded { output: json!({}) });
    handled_by_reading(&stranger, &store, answer, "read instead").await;
    assert_eq!(store.snapshot(id).unwrap().step, 1);

    // A sealed record tampered with: read instead; the reply's own token still authenticates it.
    let (store, sender, coordinator, id) = setup().await;
    let other = another_process(&store, &coordinator, sender.clone());
    header = last_request(&sender);
    let (token, sealed) = stepline::domain::seal::split_token(&header.reply_token);
    let mut body = sealed.expect("sealed").to_string();
    let middle = body.len() / 2;
    let flipped = if body[middle..].starts_with('A') {
        "B"
    } else {
        "A"
    };
    body.replace_range(middle..=middle, flipped);
    header.reply_token = format!("{token}.{body}");
    let forged = reply(&header, ReplyOutcome::Succeeded { output: json!({}) });
    handled_by_reading(&other, &store, forged, "read instead").await;
    assert_eq!(
        store.snapshot(id).unwrap().step,
        1,
        "advanced on the record read"
    );

    // A stale seal: the execution was cancelled after the launch; the conditional write fails, the
    // process reads, and the cancelled execution does not advance.
    let (store, sender, coordinator, id) = setup().await;
    let other = another_process(&store, &coordinator, sender.clone());
    let stale = reply_to_last_request(&sender);
    let mut record = store.snapshot(id).unwrap();
    let expected = record.version;
    record.status = Status::Cancelled;
    record.version += 1;
    store.replace(&record, expected).await.unwrap();
    handled_by_reading(&other, &store, stale, "the lost race made it read").await;
    let after = store.snapshot(id).unwrap();
    assert_eq!(
        (after.status, after.version),
        (Status::Cancelled, record.version)
    );
    assert!(
        sender.drain().iter().all(|(q, _)| q != "requests"),
        "nothing launched"
    );
}
