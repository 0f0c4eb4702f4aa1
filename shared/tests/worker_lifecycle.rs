//! Worker lifecycle: a worker announces itself (identity, queue, state) on the reply queue at its first
//! batch and when it drains; the coordinator lists it with its health, warns of a release no live
//! worker serves, and refuses submissions pinned to a release whose workers all drain.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::aws_lambda_events::event::sqs::SqsEvent;
use stepline::contract::Contract;
use stepline::domain::{Code, ParentLink, StepError};
use stepline::envelope::{
    Identity, RequestHeader, WorkerAnnouncement, REASON_ATTRIBUTE, WORKER_KIND,
};
use stepline::handlers;
use stepline::release::{WorkerHealth, WorkerState};
use stepline::worker::{StepFunction, Worker};
use stepline::{Coordinator, CoordinatorError, SubmitRequest};

use common::{coordinator_of, settings, sqs, task_pipeline};

struct Echo;

#[async_trait]
impl StepFunction for Echo {
    async fn run(&self, _: &RequestHeader, input: Value) -> Result<Value, StepError> {
        Ok(input)
    }
}

const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:000000000000:shop-requests";

fn identity() -> Identity {
    Identity::of(&Contract::of(&task_pipeline("shop", &["a"])), "1")
}

/// A worker announcing itself on the reply queue `replies`, through `sender`.
fn worker(sender: Arc<RecordingSender>) -> Worker {
    Worker::new(identity(), sender, Arc::new(Echo))
        .with_concurrency(1)
        .with_announcements(Some(settings().queues.reply))
}

/// A batch from the worker's request queue (a message that is no request: dead-lettered, which
/// does not matter here).
fn batch() -> SqsEvent {
    let mut event = sqs("{}".into());
    event.records[0].event_source_arn = Some(QUEUE_ARN.into());
    event
}

/// The announcements `sender` sent to the reply queue, taken from it.
fn announcements(sender: &RecordingSender) -> Vec<String> {
    sender
        .drain()
        .into_iter()
        .filter(|(queue, m)| *queue == settings().queues.reply && m.body.contains(WORKER_KIND))
        .map(|(_, m)| m.body)
        .collect()
}

/// The coordinator handles `bodies` as its completion function does.
async fn deliver(coordinator: &Coordinator, bodies: Vec<String>) {
    for body in bodies {
        let response = handlers::completion(coordinator, sqs(body)).await;
        assert!(response.batch_item_failures.is_empty());
    }
}

async fn coordinator(sender: Arc<RecordingSender>) -> Coordinator {
    let store = Arc::new(InMemoryExecutionStore::default());
    coordinator_of(task_pipeline("shop", &["a"]), store, sender).await
}

fn submission() -> SubmitRequest {
    SubmitRequest {
        pipeline_id: "shop".into(),
        tenant: "t".into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_worker_announces_itself_at_its_first_batch_and_is_listed_healthy() {
    let sender = Arc::new(RecordingSender::default());
    let coordinator = coordinator(sender.clone()).await;
    assert_eq!(
        coordinator
            .release_warnings("shop", "1")
            .await
            .unwrap()
            .len(),
        1,
        "no worker serves release 1 yet"
    );
    let worker = worker(sender.clone());
    worker.handle(batch()).await;
    let sent = announcements(&sender);
    assert_eq!(sent.len(), 1, "one announcement at the first batch");
    let announcement: WorkerAnnouncement = serde_json::from_str(&sent[0]).unwrap();
    assert_eq!(
        (
            announcement.identity,
            announcement.queue.as_str(),
            announcement.state
        ),
        (identity(), "shop-requests", WorkerState::Healthy)
    );
    worker.handle(batch()).await;
    assert!(
        announcements(&sender).is_empty(),
        "not again before its period"
    );

    deliver(&coordinator, sent).await;
    let workers = coordinator.workers("shop").await.unwrap();
    assert_eq!(workers.len(), 1);
    let (record, health) = &workers[0];
    assert_eq!(health, &WorkerHealth::Healthy);
    assert_eq!(
        (record.release_version.as_str(), record.queue.as_str()),
        ("1", "shop-requests")
    );
    assert!(coordinator
        .release_warnings("shop", "1")
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn submissions_to_a_release_whose_workers_all_drain_are_refused() {
    let sender = Arc::new(RecordingSender::default());
    let worker = worker(sender.clone());
    worker.handle(batch()).await;
    worker.drain().await;
    let sent = announcements(&sender);
    assert_eq!(sent.len(), 2, "healthy, then draining");

    let coordinator = coordinator(sender.clone()).await;
    deliver(&coordinator, sent).await;
    assert_eq!(
        coordinator.workers("shop").await.unwrap()[0].1,
        WorkerHealth::Draining
    );
    let refused = coordinator.submit(submission()).await.unwrap_err();
    assert!(
        matches!(refused, CoordinatorError::ReleaseDraining { .. }),
        "{refused}"
    );
    assert_eq!(refused.code(), Code::ReleaseDraining);
    assert_eq!(refused.code().as_str(), "RELEASE_DRAINING");
    // A fan-out's child is started all the same: its parent waits for it, and a refusal would park
    // it for good. (Its link is the coordinator's own, signed; a link of anyone else's is stripped,
    // and that start refused like any other.)
    let key = coordinator
        .key_source()
        .expect("keys")
        .keys()
        .await
        .unwrap()
        .current()
        .clone();
    let link = ParentLink {
        execution_id: uuid::Uuid::from_u128(7),
        interaction: "item-0".into(),
        token: "t".into(),
        complete_to: settings().queues.reply,
        unit: None,
        step: 1,
        signature: None,
    };
    let child = |link: ParentLink| SubmitRequest {
        parent: Some(link),
        ..submission()
    };
    let started = coordinator
        .submit(child(link.clone().signed(&key, "t", "shop")))
        .await
        .unwrap();
    assert_eq!(
        coordinator.get(started.execution).await.unwrap().parent,
        Some(link.clone().signed(&key, "t", "shop"))
    );
    let unsigned = coordinator.submit(child(link)).await.unwrap_err();
    assert_eq!(unsigned.code(), Code::ReleaseDraining);

    // Another worker of the release starts. A coordinator reads the workers at most every
    // WORKERS_CACHED_MS: one that reads them now accepts the release again.
    let draining = {
        let worker = self::worker(sender.clone());
        worker.handle(batch()).await;
        worker.drain().await;
        announcements(&sender)
    };
    let serving = self::worker(sender.clone());
    serving.handle(batch()).await;
    let fresh = self::coordinator(sender.clone()).await;
    deliver(&fresh, draining).await;
    deliver(&fresh, announcements(&sender)).await;
    let health: Vec<WorkerHealth> = fresh
        .workers("shop")
        .await
        .unwrap()
        .into_iter()
        .map(|(_, h)| h)
        .collect();
    assert_eq!(health.len(), 2);
    assert!(health.contains(&WorkerHealth::Healthy) && health.contains(&WorkerHealth::Draining));
    assert!(fresh.submit(submission()).await.is_ok());
}

#[tokio::test]
async fn an_announcement_without_its_worker_is_dead_lettered_with_its_code() {
    let sender = Arc::new(RecordingSender::default());
    let coordinator = coordinator(sender.clone()).await;
    let forged = WorkerAnnouncement::new("", identity(), "q", WorkerState::Draining);
    let response =
        handlers::completion(&coordinator, sqs(serde_json::to_string(&forged).unwrap())).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "parked, not retried"
    );
    let parked: Vec<_> = sender
        .drain()
        .into_iter()
        .filter(|(queue, _)| *queue == settings().queues.reply_dlq)
        .collect();
    assert_eq!(parked.len(), 1);
    assert!(parked[0]
        .1
        .attributes
        .contains(&(REASON_ATTRIBUTE.to_string(), "INVALID_REQUEST".to_string())));
    assert!(coordinator.workers("shop").await.unwrap().is_empty());
}
