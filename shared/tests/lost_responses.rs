//! Writes whose response was lost. The SDK retries a request whose response never came; when the
//! first attempt was applied, the retry meets the version the write itself set and fails its
//! condition. The writer must know its own write (by the record's write id) and go on to send what it
//! decided, instead of taking it for someone else's and acknowledging the message as a duplicate.
//! And a duplicate submit must re-send a first request that may never have gone out.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use common::{coordinator_of, requests_sent, sqs, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::domain::{launch_id, PipelineDef, StepError};
use stepline::envelope::{LaunchWork, ReplyEnvelope, ReplyOutcome, RequestHeader};
use stepline::ports::{MessageSender, OutMessage, SendError, Sent};
use stepline::{handlers, Coordinator, SubmitRequest};
use uuid::Uuid;

/// Records what is sent; fails every send while `down` is set.
#[derive(Default)]
struct FlakySender {
    inner: RecordingSender,
    down: AtomicBool,
}

#[async_trait]
impl MessageSender for FlakySender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        if self.down.load(Ordering::SeqCst) {
            return messages
                .iter()
                .map(|_| {
                    Err(SendError {
                        queue: queue.into(),
                        reason: "down".into(),
                    })
                })
                .collect();
        }
        self.inner.send(queue, messages).await
    }
}

fn def() -> PipelineDef {
    task_pipeline("lossy", &["a", "b"])
}

fn submit_request() -> SubmitRequest {
    SubmitRequest {
        pipeline_id: "lossy".into(),
        tenant: "t".into(),
        input: json!({}),
        idempotency_key: Some("order-7".into()),
        ..Default::default()
    }
}

/// The headers of the requests sent so far.
fn requests(sender: &FlakySender) -> Vec<RequestHeader> {
    requests_sent(&sender.inner)
}

/// A coordinator over a fresh store and a flaky sender with one execution submitted: the store, the
/// sender, the coordinator, the execution and its first request.
async fn submitted() -> (
    Arc<InMemoryExecutionStore>,
    Arc<FlakySender>,
    Coordinator,
    Uuid,
    RequestHeader,
) {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(FlakySender::default());
    let coordinator = coordinator_of(def(), store.clone(), sender.clone()).await;
    let id = coordinator
        .submit(submit_request())
        .await
        .unwrap()
        .execution;
    let first = requests(&sender).pop().expect("the first request");
    (store, sender, coordinator, id, first)
}

#[tokio::test]
async fn a_reply_whose_commit_response_was_lost_still_sends_the_next_request() {
    let (store, sender, coordinator, id, first) = submitted().await;
    let reply = ReplyEnvelope::for_request(&first, ReplyOutcome::Succeeded { output: json!({}) });

    store.lose_next_response();
    let response =
        handlers::completion(&coordinator, sqs(serde_json::to_string(&reply).unwrap())).await;

    assert!(response.batch_item_failures.is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!((record.step, record.version), (1, 2), "applied once");
    let sent = requests(&sender);
    assert_eq!(sent.len(), 1, "the next request went out: {sent:?}");
    assert_eq!(sent[0].launch_id, launch_id(id, 1, 1));
}

#[tokio::test]
async fn a_submit_whose_create_response_was_lost_sends_its_first_request() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(FlakySender::default());
    let coordinator = coordinator_of(def(), store.clone(), sender.clone()).await;
    store.lose_next_response();

    let submitted = coordinator.submit(submit_request()).await.unwrap();

    assert!(!submitted.duplicate, "its own create, not someone else's");
    let sent = requests(&sender);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].launch_id, launch_id(submitted.execution, 0, 1));
}

#[tokio::test]
async fn a_duplicate_submit_re_sends_a_first_request_that_may_not_have_gone_out() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(FlakySender::default());
    let coordinator = coordinator_of(def(), store.clone(), sender.clone()).await;
    // The first submitter commits, then its send fails (as if it died before sending).
    sender.down.store(true, Ordering::SeqCst);
    let first = coordinator.submit(submit_request()).await.unwrap();
    sender.down.store(false, Ordering::SeqCst);
    assert!(requests(&sender).is_empty());

    let again = coordinator.submit(submit_request()).await.unwrap();

    assert!(again.duplicate);
    assert_eq!(again.execution, first.execution);
    let sent = requests(&sender);
    assert_eq!(sent.len(), 1, "re-sent at once");
    assert_eq!(sent[0].launch_id, launch_id(first.execution, 0, 1));
    assert_eq!(
        store.snapshot(first.execution).unwrap().version,
        1,
        "re-sending writes nothing"
    );

    // Once the execution moved on, a duplicate submit sends nothing.
    let reply = ReplyEnvelope::for_request(&sent[0], ReplyOutcome::Succeeded { output: json!({}) });
    handlers::completion(&coordinator, sqs(serde_json::to_string(&reply).unwrap())).await;
    requests(&sender);
    coordinator.submit(submit_request()).await.unwrap();
    assert!(requests(&sender).is_empty());
}

#[tokio::test]
async fn a_lost_write_written_over_before_its_read_back_is_known_by_its_lease_and_its_launch_sent()
{
    let (store, sender, coordinator, id, first) = submitted().await;
    // A retryable failure: the retry is scheduled under a fresh lease and its launch work enqueued.
    let error = StepError::new("FLAKY", "try again", true);
    let reply = ReplyEnvelope::for_request(&first, ReplyOutcome::Failed { error });

    store.overwrite_after_the_next_replace();
    let response =
        handlers::completion(&coordinator, sqs(serde_json::to_string(&reply).unwrap())).await;

    assert!(response.batch_item_failures.is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.version, 3, "the reply's write and the one over it");
    let lease = record.lease.clone().expect("the retry's lease");
    let launches: Vec<LaunchWork> = sender
        .inner
        .drain()
        .into_iter()
        .filter(|(q, _)| q == "launch")
        .map(|(_, m)| serde_json::from_str(&m.body).unwrap())
        .collect();
    assert_eq!(
        launches,
        vec![LaunchWork {
            execution_id: id,
            generation: record.generation,
            token: lease.token,
        }],
        "the retry's launch went out under the lease the write took"
    );
}
