//! The worker runtime against in-memory fakes: replies, typed dead-lettering, cancel notices,
//! in-process deduplication, heartbeats with visibility extension, and concurrency within a batch.
//!
//! The heartbeat tests run on real time with short intervals: `start_paused` needs tokio's `test-util`
//! feature, which this crate does not enable. Their assertions only need one beat to fit in a step that
//! lasts many intervals.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline::adapters::RecordingSender;
use stepline::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use stepline::domain::payload::PayloadRef;
use stepline::domain::{StepError, Timestamp};
use stepline::envelope::{
    Identity, ReplyEnvelope, ReplyOutcome, RequestEnvelope, RequestHeader, CANCEL_KIND,
    DETAIL_ATTRIBUTE, REASON_ATTRIBUTE, REQUEST_KIND, SOURCE_ATTRIBUTE,
};
use stepline::ports::{MessageSender, OutMessage, SendError, Sent};
use stepline::worker::{
    default_heartbeat_interval, parse_queue_arn, visibility_timeout_for, Heartbeat, StepFunction,
    VisibilityExtender, Worker,
};
use uuid::Uuid;

const REPLY_QUEUE: &str = "https://sqs.test/123456789012/replies";
const DLQ: &str = "https://sqs.test/123456789012/requests-dlq";
const SOURCE_ARN: &str = "arn:aws:sqs:eu-west-1:123456789012:requests";

fn identity() -> Identity {
    Identity {
        pipeline_id: "orders".into(),
        contract_version: "sha256:c0ffee".into(),
        release_version: "7".into(),
    }
}

fn header(launch: u128) -> RequestHeader {
    RequestHeader {
        kind: REQUEST_KIND.into(),
        identity: identity(),
        tenant: "acme".into(),
        execution_id: Uuid::from_u128(1000 + launch),
        step_id: "charge".into(),
        step_index: 2,
        attempt: 1,
        launch_id: Uuid::from_u128(launch),
        step_key: String::new(),
        reply_to: REPLY_QUEUE.into(),
        // Far enough that the default heartbeat never fires in a fast test.
        deadline: Timestamp::now() + Duration::from_secs(600),
        reply_token: format!("token-{launch}"),
    }
}

fn message(id: &str, body: impl Into<String>) -> SqsMessage {
    let mut m = SqsMessage::default();
    m.message_id = Some(id.into());
    m.receipt_handle = Some(format!("handle-{id}"));
    m.event_source_arn = Some(SOURCE_ARN.into());
    m.body = Some(body.into());
    m
}

fn request(id: &str, header: &RequestHeader, payload: &Value) -> SqsMessage {
    let body = serde_json::to_string(&RequestEnvelope {
        header: header.clone(),
        payload,
    })
    .unwrap();
    message(id, body)
}

fn cancel(id: &str, launch: u128) -> SqsMessage {
    let mut h = header(launch);
    h.kind = CANCEL_KIND.into();
    request(id, &h, &Value::Null)
}

fn event(records: Vec<SqsMessage>) -> SqsEvent {
    let mut e = SqsEvent::default();
    e.records = records;
    e
}

fn failed_ids(response: &SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

fn attribute<'a>(m: &'a OutMessage, name: &str) -> Option<&'a str> {
    m.attributes
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn status(body: &str) -> String {
    serde_json::from_str::<Value>(body).unwrap()["outcome"]["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Echoes its input; sleeps first if the input says so; panics on `{"panic": true}`; fails on
/// `{"fail": true}`. Records every call and the most steps ever running at once.
#[derive(Default)]
struct Steps {
    calls: Mutex<Vec<(Uuid, Value)>>,
    running: AtomicUsize,
    max_running: AtomicUsize,
}

impl Steps {
    fn calls(&self) -> Vec<(Uuid, Value)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl StepFunction for Steps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        self.calls
            .lock()
            .unwrap()
            .push((request.launch_id, input.clone()));
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        if let Some(ms) = input["sleep_ms"].as_u64() {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        self.running.fetch_sub(1, Ordering::SeqCst);
        if input["panic"] == json!(true) {
            panic!("step blew up");
        }
        if input["fail"] == json!(true) {
            return Err(StepError::new("CARD_DECLINED", "declined", false));
        }
        Ok(json!({ "echo": input }))
    }
}

#[derive(Default)]
struct Extender {
    calls: Mutex<Vec<(String, String, i32)>>,
}

#[async_trait]
impl VisibilityExtender for Extender {
    async fn extend(&self, arn: &str, handle: &str, seconds: i32) -> Result<(), String> {
        self.calls
            .lock()
            .unwrap()
            .push((arn.into(), handle.into(), seconds));
        Ok(())
    }
}

/// Records like `RecordingSender` but refuses everything sent to one queue.
struct RefusingSender {
    refused: String,
    attempts: AtomicUsize,
    inner: RecordingSender,
}

#[async_trait]
impl MessageSender for RefusingSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        if queue == self.refused {
            self.attempts.fetch_add(messages.len(), Ordering::SeqCst);
            return messages
                .iter()
                .map(|_| {
                    Err(SendError {
                        queue: queue.into(),
                        reason: "access denied".into(),
                    })
                })
                .collect();
        }
        self.inner.send(queue, messages).await
    }
}

fn worker() -> (Worker, Arc<RecordingSender>, Arc<Steps>) {
    let sender = Arc::new(RecordingSender::default());
    let steps = Arc::new(Steps::default());
    let worker = Worker::new(identity(), sender.clone(), steps.clone());
    (worker, sender, steps)
}

/// A worker whose sender refuses everything sent to `refused`.
fn refusing_worker(refused: &str) -> (Worker, Arc<RefusingSender>) {
    let sender = Arc::new(RefusingSender {
        refused: refused.into(),
        attempts: AtomicUsize::new(0),
        inner: RecordingSender::default(),
    });
    let worker = Worker::new(identity(), sender.clone(), Arc::new(Steps::default()));
    (worker, sender)
}

/// A worker under `heartbeat` (the default when `None`) whose visibility extensions are recorded.
fn extending_worker(
    heartbeat: Option<Heartbeat>,
) -> (Worker, Arc<RecordingSender>, Arc<Steps>, Arc<Extender>) {
    let (worker, sender, steps) = worker();
    let extender = Arc::new(Extender::default());
    let worker = match heartbeat {
        Some(heartbeat) => worker.with_heartbeat(heartbeat),
        None => worker,
    };
    (
        worker.with_visibility(extender.clone()),
        sender,
        steps,
        extender,
    )
}

/// The outcome status of every reply sent so far, in order.
fn statuses(sender: &RecordingSender) -> Vec<String> {
    sender
        .drain()
        .iter()
        .map(|(_, m)| status(&m.body))
        .collect()
}

#[tokio::test]
async fn a_request_runs_and_is_replied_to_its_reply_queue() {
    let (worker, sender, steps) = worker();
    let h = header(1);
    let input = json!({"order": 42});

    let response = worker.handle(event(vec![request("m1", &h, &input)])).await;

    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.calls(), vec![(h.launch_id, input.clone())]);
    let sent = sender.drain();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (queue, reply) = &sent[0];
    assert_eq!(queue, REPLY_QUEUE);
    assert!(reply.attributes.is_empty());
    let envelope: ReplyEnvelope = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        envelope,
        ReplyEnvelope::for_request(
            &h,
            ReplyOutcome::Succeeded {
                output: json!({"echo": input})
            }
        )
    );
}

#[tokio::test]
async fn a_step_failure_is_a_failed_reply_not_a_batch_failure() {
    let (worker, sender, _) = worker();
    let h = header(2);

    let response = worker
        .handle(event(vec![request("m1", &h, &json!({"fail": true}))]))
        .await;

    assert!(failed_ids(&response).is_empty());
    let sent = sender.drain();
    assert_eq!(sent.len(), 1);
    let envelope: ReplyEnvelope = serde_json::from_str(&sent[0].1.body).unwrap();
    assert_eq!(
        envelope.outcome,
        ReplyOutcome::Failed {
            error: StepError::new("CARD_DECLINED", "declined", false)
        }
    );
}

#[tokio::test]
async fn an_identity_mismatch_is_dead_lettered_with_its_reason_and_never_run() {
    let (worker, sender, steps) = worker();
    let worker = worker.with_dead_letter_queue(DLQ);
    let mut h = header(3);
    h.identity.release_version = "8".into();
    let m = request("m-foreign", &h, &json!({"order": 1}));
    let original = m.body.clone().unwrap();

    let response = worker.handle(event(vec![m])).await;

    assert!(
        failed_ids(&response).is_empty(),
        "dead-lettered, so acknowledged"
    );
    assert!(steps.calls().is_empty(), "the step must not run");
    let sent = sender.drain();
    assert_eq!(
        sent.len(),
        2,
        "the dead letter and a failure reply: {sent:?}"
    );
    let (_, dead) = sent
        .iter()
        .find(|(queue, _)| queue == DLQ)
        .expect("dead-lettered");
    assert_eq!(dead.body, original);
    assert_eq!(attribute(dead, REASON_ATTRIBUTE), Some("IDENTITY_MISMATCH"));
    // The coordinator is told at once, with a non-retryable failure: no attempt is burnt on timeouts.
    let (_, reply) = sent
        .iter()
        .find(|(queue, _)| queue == &h.reply_to)
        .expect("failure reply");
    let reply: stepline::envelope::ReplyEnvelope = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(reply.launch_id, h.launch_id);
    match reply.outcome {
        stepline::envelope::ReplyOutcome::Failed { error } => {
            assert_eq!(error.code, "IDENTITY_MISMATCH");
            assert!(!error.retryable);
        }
        other => panic!("expected a failure, got {other:?}"),
    }
    assert_eq!(attribute(dead, SOURCE_ATTRIBUTE), Some("m-foreign"));
    let detail = attribute(dead, DETAIL_ATTRIBUTE).unwrap();
    assert!(
        detail.contains("orders release 8") && detail.contains("orders release 7"),
        "{detail}"
    );
}

#[tokio::test]
async fn an_undecodable_body_is_dead_lettered_as_undecodable() {
    let (worker, sender, steps) = worker();
    let worker = worker.with_dead_letter_queue(DLQ);

    let response = worker
        .handle(event(vec![message("m-junk", "{not json")]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert!(steps.calls().is_empty());
    let sent = sender.drain();
    assert_eq!(sent.len(), 1);
    let (queue, dead) = &sent[0];
    assert_eq!(queue, DLQ);
    assert_eq!(dead.body, "{not json");
    assert_eq!(attribute(dead, REASON_ATTRIBUTE), Some("UNDECODABLE"));
    assert_eq!(attribute(dead, SOURCE_ATTRIBUTE), Some("m-junk"));
    assert!(!attribute(dead, DETAIL_ATTRIBUTE).unwrap().is_empty());
}

#[tokio::test]
async fn a_request_without_payload_or_of_unknown_kind_is_undecodable() {
    let (worker, sender, steps) = worker();
    let worker = worker.with_dead_letter_queue(DLQ);
    let no_payload = json!({ "header": header(4) }).to_string();
    let mut odd = header(5);
    odd.kind = "stepline.other.v9".into();

    let response = worker
        .handle(event(vec![
            message("m-nopayload", no_payload),
            request("m-odd", &odd, &json!({})),
        ]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert!(steps.calls().is_empty());
    let sent = sender.drain();
    let reasons: Vec<_> = sent
        .iter()
        .map(|(q, m)| {
            (
                q.as_str(),
                attribute(m, SOURCE_ATTRIBUTE).unwrap(),
                attribute(m, REASON_ATTRIBUTE).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        vec![
            (DLQ, "m-nopayload", "UNDECODABLE"),
            (DLQ, "m-odd", "UNDECODABLE")
        ]
    );
}

#[tokio::test]
async fn without_a_dead_letter_queue_rejects_are_batch_item_failures() {
    let (worker, sender, steps) = worker();
    let mut foreign = header(6);
    foreign.identity.pipeline_id = "invoices".into();
    let good = header(7);

    let response = worker
        .handle(event(vec![
            request("m-foreign", &foreign, &json!({})),
            message("m-junk", "[]"),
            request("m-good", &good, &json!({"ok": 1})),
        ]))
        .await;

    assert_eq!(failed_ids(&response), vec!["m-foreign", "m-junk"]);
    assert_eq!(steps.calls().len(), 1, "only the good request runs");
    let sent = sender.drain();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, REPLY_QUEUE);
}

#[tokio::test]
async fn a_failed_dead_letter_send_falls_back_to_a_batch_item_failure() {
    let (worker, sender) = refusing_worker(DLQ);
    let worker = worker.with_dead_letter_queue(DLQ);

    let response = worker
        .handle(event(vec![
            message("m-junk", "nope"),
            request("m-good", &header(8), &json!({})),
        ]))
        .await;

    assert_eq!(failed_ids(&response), vec!["m-junk"]);
    assert_eq!(
        sender.attempts.load(Ordering::SeqCst),
        1,
        "the DLQ was tried"
    );
    let sent = sender.inner.drain();
    assert_eq!(sent.len(), 1, "the reply still goes out: {sent:?}");
    assert_eq!(sent[0].0, REPLY_QUEUE);
}

#[tokio::test]
async fn a_failed_reply_is_a_batch_item_failure() {
    let (worker, sender) = refusing_worker(REPLY_QUEUE);

    let response = worker
        .handle(event(vec![request("m1", &header(9), &json!({}))]))
        .await;

    assert_eq!(failed_ids(&response), vec!["m1"]);
    assert_eq!(sender.attempts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_cancel_notice_stops_a_later_request_for_its_launch() {
    let (worker, sender, steps) = worker();

    let response = worker.handle(event(vec![cancel("m-cancel", 10)])).await;
    assert!(failed_ids(&response).is_empty());
    assert!(sender.drain().is_empty(), "a cancel notice has no reply");

    let response = worker
        .handle(event(vec![
            request("m-cancelled", &header(10), &json!({})),
            request("m-other", &header(11), &json!({})),
        ]))
        .await;

    assert!(
        failed_ids(&response).is_empty(),
        "acknowledged, not retried"
    );
    assert_eq!(
        steps.calls().iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![Uuid::from_u128(11)],
        "only the launch that was not cancelled runs"
    );
    let sent = sender.drain();
    assert_eq!(sent.len(), 1);
    let envelope: ReplyEnvelope = serde_json::from_str(&sent[0].1.body).unwrap();
    assert_eq!(envelope.launch_id, Uuid::from_u128(11));
}

#[tokio::test]
async fn a_cancel_notice_earlier_in_the_same_batch_applies() {
    let (worker, sender, steps) = worker();

    let response = worker
        .handle(event(vec![
            cancel("m-cancel", 12),
            request("m-cancelled", &header(12), &json!({})),
        ]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert!(steps.calls().is_empty());
    assert!(sender.drain().is_empty());
}

#[tokio::test]
async fn a_cancel_notice_without_payload_is_read_and_one_for_another_release_is_ignored() {
    let (worker, sender, steps) = worker();
    let worker = worker.with_dead_letter_queue(DLQ);
    let mut bare = header(13);
    bare.kind = CANCEL_KIND.into();
    let mut foreign = header(14);
    foreign.kind = CANCEL_KIND.into();
    foreign.identity.release_version = "6".into();

    let response = worker
        .handle(event(vec![
            message("m-bare", json!({ "header": bare }).to_string()),
            request("m-foreign", &foreign, &Value::Null),
        ]))
        .await;
    assert!(failed_ids(&response).is_empty());
    assert!(sender.drain().is_empty(), "neither is dead-lettered");

    worker
        .handle(event(vec![
            request("r13", &header(13), &json!({})),
            request("r14", &header(14), &json!({})),
        ]))
        .await;
    assert_eq!(
        steps.calls().iter().map(|(l, _)| *l).collect::<Vec<_>>(),
        vec![Uuid::from_u128(14)]
    );
}

#[tokio::test]
async fn a_redelivered_launch_resends_the_identical_reply_without_running_again() {
    let (worker, sender, steps) = worker();
    let h = header(20);
    let m = request("m1", &h, &json!({"order": 5}));

    worker.handle(event(vec![m.clone()])).await;
    let first = sender.drain();
    let mut again = m;
    again.message_id = Some("m1-redelivered".into());
    let response = worker.handle(event(vec![again])).await;
    let second = sender.drain();

    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.calls().len(), 1, "the step ran once");
    assert_eq!(first.len(), 1);
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].0, REPLY_QUEUE);
    assert_eq!(
        second[0].1.body.as_bytes(),
        first[0].1.body.as_bytes(),
        "byte for byte"
    );
}

#[tokio::test]
async fn a_failed_reply_is_not_rerun_on_redelivery() {
    let (worker, sender, steps) = worker();
    let h = header(21);
    let step = json!({"fail": true});

    worker.handle(event(vec![request("m1", &h, &step)])).await;
    worker.handle(event(vec![request("m2", &h, &step)])).await;

    assert_eq!(steps.calls().len(), 1);
    let sent = sender.drain();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].1.body, sent[1].1.body);
    assert_eq!(status(&sent[1].1.body), "FAILED");
}

#[tokio::test]
async fn the_same_launch_twice_in_one_batch_runs_once() {
    let (worker, sender, steps) = worker();
    let delivery = |id: &str| request(id, &header(22), &json!({"sleep_ms": 20}));

    let response = worker
        .handle(event(vec![delivery("m1"), delivery("m2")]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.calls().len(), 1);
    assert_eq!(sender.drain().len(), 1);
}

#[tokio::test]
async fn the_reply_cache_forgets_the_oldest_launch_beyond_its_capacity() {
    let (worker, sender, steps) = worker();
    let worker = worker.with_dedup_capacity(1);
    let (a, b) = (header(23), header(24));

    for m in [
        request("a", &a, &json!({})),
        request("b", &b, &json!({})),
        request("a-again", &a, &json!({})),
        request("a-thrice", &a, &json!({})),
    ] {
        worker.handle(event(vec![m])).await;
    }

    let launches: Vec<u128> = steps.calls().iter().map(|(l, _)| l.as_u128()).collect();
    assert_eq!(
        launches,
        vec![23, 24, 23],
        "a was evicted by b, then cached again"
    );
    assert_eq!(sender.drain().len(), 4);
}

#[tokio::test]
async fn a_slow_step_sends_heartbeats_and_extends_visibility_before_its_reply() {
    let interval = Duration::from_millis(20);
    let (worker, sender, steps, extender) = extending_worker(Some(Heartbeat::Every(interval)));
    let h = header(30);

    let response = worker
        .handle(event(vec![request(
            "m-slow",
            &h,
            &json!({"sleep_ms": 400}),
        )]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.calls().len(), 1);
    let sent = sender.drain();
    assert!(
        sent.len() >= 2,
        "at least one heartbeat and the reply: {sent:?}"
    );
    let (last, beats) = sent.split_last().unwrap();
    assert_eq!(
        status(&last.1.body),
        "SUCCEEDED",
        "the final reply comes last"
    );
    for (queue, beat) in beats {
        assert_eq!(queue, REPLY_QUEUE);
        let envelope: ReplyEnvelope = serde_json::from_str(&beat.body).unwrap();
        assert_eq!(
            envelope,
            ReplyEnvelope::for_request(&h, ReplyOutcome::Running)
        );
        assert!(beat.body.contains(r#""status":"RUNNING""#), "{}", beat.body);
    }
    let calls = extender.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), beats.len(), "one extension per heartbeat");
    for (arn, handle, seconds) in calls {
        assert_eq!(arn, SOURCE_ARN);
        assert_eq!(handle, "handle-m-slow");
        assert_eq!(seconds, visibility_timeout_for(interval));
    }
}

#[tokio::test]
async fn the_default_heartbeat_follows_the_deadline() {
    let (worker, sender, _, extender) = extending_worker(None);
    let mut h = header(31);
    // A third of 3.3 s: one beat at ~1.1 s into a 1.6 s step.
    h.deadline = Timestamp::now() + Duration::from_millis(3_300);

    worker
        .handle(event(vec![request("m1", &h, &json!({"sleep_ms": 1_600}))]))
        .await;

    assert_eq!(statuses(&sender), vec!["RUNNING", "SUCCEEDED"]);
    assert_eq!(extender.calls.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn heartbeats_can_be_turned_off() {
    let (worker, sender, _, extender) = extending_worker(Some(Heartbeat::Off));
    let mut h = header(32);
    h.deadline = Timestamp::now(); // the default would beat every second

    worker
        .handle(event(vec![request("m1", &h, &json!({"sleep_ms": 1_200}))]))
        .await;

    assert_eq!(statuses(&sender), vec!["SUCCEEDED"]);
    assert!(extender.calls.lock().unwrap().is_empty());
}

#[test]
fn the_default_interval_is_a_third_of_the_time_left_and_at_least_a_second() {
    assert_eq!(
        default_heartbeat_interval(
            Timestamp::from_millis(31_000),
            Timestamp::from_millis(1_000)
        ),
        Duration::from_secs(10)
    );
    assert_eq!(
        default_heartbeat_interval(Timestamp::from_millis(3_000), Timestamp::from_millis(1_500)),
        Duration::from_secs(1)
    );
    assert_eq!(
        default_heartbeat_interval(Timestamp::from_millis(1_000), Timestamp::from_millis(9_000)),
        Duration::from_secs(1)
    );
    assert_eq!(visibility_timeout_for(Duration::from_secs(10)), 50);
    assert_eq!(
        visibility_timeout_for(Duration::from_secs(86_400)),
        43_200,
        "SQS's limit"
    );
}

#[test]
fn queue_arns_name_the_owner_account_and_queue() {
    assert_eq!(
        parse_queue_arn("arn:aws:sqs:eu-west-1:123456789012:requests.fifo"),
        Some(("123456789012", "requests.fifo"))
    );
    assert_eq!(parse_queue_arn("arn:aws:sns:eu-west-1:1:topic"), None);
    assert_eq!(parse_queue_arn("requests"), None);
}

#[tokio::test]
async fn the_steps_of_a_batch_run_concurrently_within_the_limit() {
    let slow = |n: u128| request(&format!("m{n}"), &header(n), &json!({"sleep_ms": 50}));

    let (worker, sender, steps) = worker();
    let response = worker.handle(event((40..45).map(slow).collect())).await;
    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.max_running.load(Ordering::SeqCst), 5);
    assert_eq!(sender.drain().len(), 5);

    let (worker, sender, steps) = worker_limited(2);
    worker.handle(event((50..55).map(slow).collect())).await;
    assert_eq!(steps.max_running.load(Ordering::SeqCst), 2);
    // Replies keep the batch's order whatever order the steps finished in.
    let launches: Vec<u128> = sender
        .drain()
        .iter()
        .map(|(_, m)| {
            serde_json::from_str::<ReplyEnvelope>(&m.body)
                .unwrap()
                .launch_id
                .as_u128()
        })
        .collect();
    assert_eq!(launches, vec![50, 51, 52, 53, 54]);
}

fn worker_limited(limit: usize) -> (Worker, Arc<RecordingSender>, Arc<Steps>) {
    let (worker, sender, steps) = worker();
    (worker.with_concurrency(limit), sender, steps)
}

#[tokio::test]
async fn a_panicking_step_fails_only_its_own_message_and_can_run_again() {
    let (worker, sender, steps) = worker();
    let boom = header(60);

    let response = worker
        .handle(event(vec![
            request("m-boom", &boom, &json!({"panic": true})),
            request("m-fine", &header(61), &json!({})),
        ]))
        .await;

    assert_eq!(failed_ids(&response), vec!["m-boom"]);
    let sent = sender.drain();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        serde_json::from_str::<ReplyEnvelope>(&sent[0].1.body)
            .unwrap()
            .launch_id,
        Uuid::from_u128(61)
    );
    // The crashed launch is neither cached nor left marked as running: its redelivery runs it again.
    worker
        .handle(event(vec![request("m-boom-2", &boom, &json!({}))]))
        .await;
    assert_eq!(steps.calls().len(), 3);
    assert_eq!(sender.drain().len(), 1);
}

/// A worker claim-checking payloads over 1 KiB into an in-memory bucket.
fn claim_checking_worker() -> (
    Worker,
    Arc<RecordingSender>,
    Arc<Steps>,
    stepline::claims::ClaimCheck,
) {
    let (worker, sender, steps) = worker();
    let store = Arc::new(stepline::adapters::InMemoryPayloadStore::default());
    let claims = stepline::claims::ClaimCheck::new(store, "payloads", 1024);
    (
        worker.with_claim_check(claims.clone()),
        sender,
        steps,
        claims,
    )
}

fn reply_outcome(sender: &RecordingSender) -> ReplyOutcome {
    let sent = sender.drain();
    assert_eq!(sent.len(), 1, "{sent:?}");
    serde_json::from_str::<ReplyEnvelope>(&sent[0].1.body)
        .unwrap()
        .outcome
}

#[tokio::test]
async fn step_code_sees_a_claim_checked_input_resolved_and_its_large_output_travels_as_a_reference()
{
    let (worker, sender, steps, claims) = claim_checking_worker();
    let h = header(40);
    let input = json!({"rows": "r".repeat(5_000)});
    let reference = claims.offload(h.execution_id, input.clone()).await.unwrap();
    assert!(PayloadRef::of(&reference).is_some());

    let response = worker
        .handle(event(vec![request("m1", &h, &json!({"doc": reference}))]))
        .await;

    assert!(failed_ids(&response).is_empty());
    assert_eq!(steps.calls(), vec![(h.launch_id, json!({"doc": input}))]);
    let ReplyOutcome::Succeeded { output } = reply_outcome(&sender) else {
        panic!("a success")
    };
    assert!(PayloadRef::of(&output).is_some(), "{output}");
    assert_eq!(
        claims.resolve(output).await.unwrap(),
        json!({"echo": {"doc": input}})
    );
}

#[tokio::test]
async fn a_reference_that_does_not_resolve_fails_the_attempt_for_good_without_running_the_step() {
    let (checking, sender, steps, _) = claim_checking_worker();
    let h = header(41);
    let forged = PayloadRef {
        bucket: "payloads".into(),
        key: "payloads/none".into(),
        size: 3,
        sha256: "00".into(),
    };
    checking
        .handle(event(vec![request("m1", &h, &forged.to_value())]))
        .await;
    assert!(steps.calls().is_empty());
    let ReplyOutcome::Failed { error } = reply_outcome(&sender) else {
        panic!("a failure")
    };
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("PAYLOAD_UNRESOLVABLE", false)
    );

    // A worker without a payload bucket cannot resolve one either, and says so.
    let (plain, sender, steps) = worker();
    plain
        .handle(event(vec![request("m2", &header(42), &forged.to_value())]))
        .await;
    assert!(steps.calls().is_empty());
    let ReplyOutcome::Failed { error } = reply_outcome(&sender) else {
        panic!("a failure")
    };
    assert_eq!(error.code, "PAYLOAD_UNRESOLVABLE");
}

#[tokio::test]
async fn without_a_payload_bucket_an_output_too_large_to_send_fails_the_attempt_for_good() {
    let (worker, sender, _) = worker();
    let input = json!({"rows": "r".repeat(300_000)});
    let response = worker
        .handle(event(vec![request("m1", &header(43), &input)]))
        .await;
    assert!(
        failed_ids(&response).is_empty(),
        "answered, not retried into a loop"
    );
    let ReplyOutcome::Failed { error } = reply_outcome(&sender) else {
        panic!("a failure")
    };
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("PAYLOAD_TOO_LARGE", false)
    );
}
