//! Liveness after loss: a committed step whose next request may not have gone out is sent again as
//! soon as the message that committed it comes back unacknowledged (SQS `ApproximateReceiveCount`
//! above 1), not at the step's deadline. Step timeouts here are 300 s and no time passes: what
//! recovers, recovers without any deadline. A fresh copy of an applied reply sends nothing.

mod common;

use std::sync::Arc;

use common::{last_request, reply, requests_sent, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::domain::{launch_id, PipelineDef};
use stepline::envelope::{ReplyOutcome, RequestHeader};
use stepline::{handlers, Coordinator};
use uuid::Uuid;

fn def() -> PipelineDef {
    let mut def = task_pipeline("live", &["a", "b", "c"]);
    for step in &mut def.steps {
        step.timeout_secs = 300;
    }
    def
}

async fn setup() -> (
    Arc<InMemoryExecutionStore>,
    Arc<RecordingSender>,
    Coordinator,
    Uuid,
    String,
) {
    let store = Arc::new(InMemoryExecutionStore::default());
    let (sender, coordinator, id) = submitted(def(), store.clone()).await;
    let header = last_request(&sender);
    let reply = reply(&header, ReplyOutcome::Succeeded { output: json!({}) });
    (store, sender, coordinator, id, reply)
}

/// `body` delivered again after it was left unacknowledged (its second receive).
fn redelivered(body: String) -> stepline::aws_lambda_events::event::sqs::SqsEvent {
    received(body, 2)
}

/// `body` at its `count`th receive.
fn received(body: String, count: u32) -> stepline::aws_lambda_events::event::sqs::SqsEvent {
    let mut event = sqs(body);
    event.records[0]
        .attributes
        .insert("ApproximateReceiveCount".into(), count.to_string());
    event
}

fn launch_ids(requests: &[RequestHeader]) -> Vec<Uuid> {
    requests.iter().map(|r| r.launch_id).collect()
}

/// A successful reply to `request`.
fn answer(request: &RequestHeader) -> String {
    reply(request, ReplyOutcome::Succeeded { output: json!({}) })
}

#[tokio::test]
async fn a_reply_whose_write_lost_every_response_sends_the_next_request_when_it_comes_again() {
    let (store, sender, coordinator, id, reply) = setup().await;
    store.lose_every_response_of_the_next_write();

    let first = handlers::completion(&coordinator, sqs(reply.clone())).await;

    // The write was applied, but the completion could not know: the reply comes back.
    assert_eq!(first.batch_item_failures.len(), 1, "the reply is retried");
    assert_eq!(store.snapshot(id).unwrap().step, 1, "the write was applied");
    assert!(requests_sent(&sender).is_empty(), "nothing was sent");

    let again = handlers::completion(&coordinator, redelivered(reply.clone())).await;

    assert!(again.batch_item_failures.is_empty());
    let sent = requests_sent(&sender);
    assert_eq!(
        launch_ids(&sent),
        [launch_id(id, 1, 1)],
        "the next step's request, under its launch id, without waiting for its deadline"
    );
    let record = store.snapshot(id).unwrap();
    assert_eq!((record.step, record.attempt, record.resends), (1, 1, 0));
    // And the execution runs on from it.
    handlers::completion(&coordinator, sqs(answer(&sent[0]))).await;
    assert_eq!(store.snapshot(id).unwrap().step, 2);
}

#[tokio::test]
async fn a_send_that_fails_after_its_commit_leaves_its_message_to_come_again_and_then_goes_out() {
    let (store, sender, coordinator, id, reply) = setup().await;
    sender.fail_next_send_to("requests");

    let first = handlers::completion(&coordinator, sqs(reply.clone())).await;

    assert_eq!(store.snapshot(id).unwrap().step, 1, "the commit held");
    assert!(requests_sent(&sender).is_empty(), "the send failed");
    assert_eq!(
        first.batch_item_failures.len(),
        1,
        "the message is not acknowledged: its send did not happen"
    );

    let again = handlers::completion(&coordinator, redelivered(reply)).await;

    assert!(again.batch_item_failures.is_empty());
    assert_eq!(launch_ids(&requests_sent(&sender)), [launch_id(id, 1, 1)]);
}

#[tokio::test]
async fn a_redelivered_reply_re_sends_only_while_its_next_step_is_unanswered_and_a_fresh_copy_never(
) {
    let (store, sender, coordinator, id, reply) = setup().await;
    handlers::completion(&coordinator, sqs(reply.clone())).await;
    let sent = requests_sent(&sender);
    assert_eq!(launch_ids(&sent), [launch_id(id, 1, 1)]);
    let version = store.snapshot(id).unwrap().version;
    // A fresh copy of the reply (an SQS duplicate, or the worker re-sending its stored reply): it
    // proves nothing was lost, and sends nothing (else one duplicate would cascade down the steps).
    handlers::completion(&coordinator, sqs(reply.clone())).await;
    assert!(requests_sent(&sender).is_empty());
    // The reply back unacknowledged while step b is unanswered: the request goes again, under the
    // same launch id (the worker deduplicates), and nothing is written.
    handlers::completion(&coordinator, redelivered(reply.clone())).await;
    assert_eq!(launch_ids(&requests_sent(&sender)), [launch_id(id, 1, 1)]);
    assert_eq!(store.snapshot(id).unwrap().version, version);
    // Step b answered: the execution moved on, and the old reply changes and sends nothing.
    handlers::completion(&coordinator, sqs(answer(&sent[0]))).await;
    requests_sent(&sender);
    let version = store.snapshot(id).unwrap().version;
    handlers::completion(&coordinator, redelivered(reply)).await;
    assert!(requests_sent(&sender).is_empty());
    assert_eq!(store.snapshot(id).unwrap().version, version);
}

#[tokio::test]
async fn a_message_left_to_come_again_comes_back_in_seconds_not_at_the_visibility_timeout() {
    let (store, sender, coordinator, _, reply) = setup().await;

    // A lost response, then a failed send: each time the reply is left unacknowledged, and brought
    // back in 2 s at its first receive, 8 s at its second.
    store.lose_every_response_of_the_next_write();
    let first = handlers::completion(&coordinator, received(reply.clone(), 1)).await;
    assert_eq!(first.batch_item_failures.len(), 1);
    sender.fail_next_send_to("requests");
    let second = handlers::completion(&coordinator, received(reply.clone(), 2)).await;
    assert_eq!(second.batch_item_failures.len(), 1);
    assert_eq!(
        sender.redeliveries(),
        [
            ("replies".to_string(), "receipt-m1".to_string(), 2),
            ("replies".to_string(), "receipt-m1".to_string(), 8)
        ],
        "each retried message is made visible again on its own queue, by its receipt handle"
    );

    // From the third receive on, the queue's visibility timeout spaces the retries (an outage of
    // the store is outlasted before the redrive policy dead-letters the message).
    sender.fail_next_send_to("requests");
    let third = handlers::completion(&coordinator, received(reply.clone(), 3)).await;
    assert_eq!(third.batch_item_failures.len(), 1);
    assert_eq!(
        sender.redeliveries().len(),
        2,
        "nothing shortened at the third receive"
    );

    // An acknowledged message is not touched.
    handlers::completion(&coordinator, received(reply, 4)).await;
    assert_eq!(sender.redeliveries().len(), 2);
}
