//! Fixtures shared by the coordinator tests over in-memory ports.

use std::sync::Arc;

use stepline::adapters::InMemoryReleaseRegistry;
use stepline::aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use stepline::domain::{PipelineDef, StepDef};
use stepline::envelope::{ReplyEnvelope, ReplyOutcome, RequestHeader};
use stepline::ports::{ExecutionStore, MessageSender, SystemClock};
use stepline::{Coordinator, Settings};

/// A pipeline of task steps named `steps`, every one on the `requests` queue.
pub fn task_pipeline(pipeline_id: &str, steps: &[&str]) -> PipelineDef {
    let step = |id: &&str| StepDef::task(*id, "requests").timeout_secs(60);
    PipelineDef::new(pipeline_id, "1", steps.iter().map(step))
}

/// Settings whose queues are plain names (what the recording sender records).
pub fn settings() -> Settings {
    Settings::named()
}

/// A coordinator on the system clock over `store` and `sender`, `def`'s release registered and active.
pub async fn coordinator_of(
    def: PipelineDef,
    store: Arc<dyn ExecutionStore>,
    sender: Arc<dyn MessageSender>,
) -> Coordinator {
    let registry = registry_of(def).await;
    Coordinator::new(store, registry, sender, Arc::new(SystemClock), settings())
        .with_keys(Arc::new(stepline::adapters::MemoryKeys::default()))
        .with_ledger(Arc::new(stepline::adapters::InMemoryFanOutLedger::default()))
}

/// A release registry holding `def`'s release, registered and active.
pub async fn registry_of(def: PipelineDef) -> Arc<InMemoryReleaseRegistry> {
    Arc::new(InMemoryReleaseRegistry::activated([def], "test").await)
}

/// A coordinator over `store` and a recording sender with one execution of `def` submitted (its
/// first step launched: the request is in the sender).
#[allow(dead_code)]
pub async fn submitted(
    def: PipelineDef,
    store: Arc<stepline::adapters::InMemoryExecutionStore>,
) -> (
    Arc<stepline::adapters::RecordingSender>,
    Coordinator,
    uuid::Uuid,
) {
    let sender = Arc::new(stepline::adapters::RecordingSender::default());
    let pipeline_id = def.pipeline_id.clone();
    let coordinator = coordinator_of(def, store, sender.clone()).await;
    let request = stepline::SubmitRequest {
        pipeline_id,
        tenant: "t".into(),
        input: serde_json::json!({}),
        ..Default::default()
    };
    let execution = coordinator.submit(request).await.unwrap().execution;
    (sender, coordinator, execution)
}

/// Submits an execution of `pipeline_id` for tenant `t` with an empty input; its id.
#[allow(dead_code)]
pub async fn submit_to(coordinator: &Coordinator, pipeline_id: &str) -> uuid::Uuid {
    let request = stepline::SubmitRequest {
        pipeline_id: pipeline_id.into(),
        tenant: "t".into(),
        input: serde_json::json!({}),
        ..Default::default()
    };
    coordinator.submit(request).await.unwrap().execution
}

/// The header of the last request sent to the `requests` queue (what a worker would answer).
#[allow(dead_code)]
pub fn last_request(sender: &stepline::adapters::RecordingSender) -> RequestHeader {
    requests_sent(sender).pop().expect("a request")
}

/// The headers of the requests sent to the `requests` queue since the last look.
#[allow(dead_code)]
pub fn requests_sent(sender: &stepline::adapters::RecordingSender) -> Vec<RequestHeader> {
    sender
        .drain()
        .into_iter()
        .filter(|(queue, _)| queue == "requests")
        .map(|(_, m)| {
            let body: serde_json::Value = serde_json::from_str(&m.body).unwrap();
            serde_json::from_value(body["header"].clone()).unwrap()
        })
        .collect()
}

/// A worker's reply to `header` with `outcome`, as it travels.
#[allow(dead_code)]
pub fn reply(header: &RequestHeader, outcome: ReplyOutcome) -> String {
    serde_json::to_string(&ReplyEnvelope::for_request(header, outcome)).unwrap()
}

/// An SQS event of one message.
pub fn sqs(body: String) -> SqsEvent {
    let mut message = SqsMessage::default();
    message.message_id = Some("m1".into());
    message.receipt_handle = Some("receipt-m1".into());
    message.body = Some(body);
    let mut event = SqsEvent::default();
    event.records.push(message);
    event
}
