//! The due index as a running execution uses it: its entry, written at its creation, stays where it is
//! while its hops move the step deadline on (never later than due); a sweep that finds it early moves
//! it to when the execution is due, taking no lease; a sweep once it is due claims it.

mod common;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use common::{last_request, registry_of, reply, settings, sqs, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, RecordingSender};
use stepline::domain::Timestamp;
use stepline::envelope::ReplyOutcome;
use stepline::ports::{Clock, SystemClock};
use stepline::{handlers, Coordinator};
use uuid::Uuid;

const T0: i64 = 1_800_000_000_000;
const TIMEOUT_MS: i64 = 60_000;

/// A clock the test sets.
struct SetClock(AtomicI64);

impl SetClock {
    fn set(&self, at: i64) {
        self.0.store(at, Ordering::SeqCst);
    }
}

impl Clock for SetClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
    fn token(&self) -> Uuid {
        SystemClock.token()
    }
    fn jitter(&self) -> f64 {
        0.0
    }
}

#[tokio::test]
async fn an_entry_kept_early_is_moved_by_the_sweep_that_finds_it_and_claimed_once_due() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let registry = registry_of(task_pipeline("due", &["a", "b", "c"])).await;
    let sender = Arc::new(RecordingSender::default());
    let clock = Arc::new(SetClock(AtomicI64::new(T0)));
    let coordinator = Coordinator::new(
        store.clone(),
        registry,
        sender.clone(),
        clock.clone(),
        settings(),
    );
    let id = common::submit_to(&coordinator, "due").await;
    let created = store.snapshot(id).unwrap();
    let kept = created.due_at().expect("due");
    assert_eq!(created.index_due(), Some(kept));

    // Step a ends 10 s later: the deadline moves on, the entry stays.
    clock.set(T0 + 10_000);
    let answer = reply(
        &last_request(&sender),
        ReplyOutcome::Succeeded { output: json!({}) },
    );
    assert!(handlers::completion(&coordinator, sqs(answer))
        .await
        .batch_item_failures
        .is_empty());
    sender.drain(); // step b's request
    let hopped = store.snapshot(id).unwrap();
    assert_eq!(hopped.step, 1);
    assert_eq!(
        hopped.due_at(),
        Some(Timestamp::from_millis(T0 + 10_000 + TIMEOUT_MS))
    );
    assert_eq!(hopped.index_due(), Some(kept), "the entry stayed");

    // A sweep finds it at its entry, before it is due: it moves the entry and takes no lease.
    clock.set(kept.millis() + 1);
    let report = coordinator.claim_due(None).await.unwrap();
    assert_eq!(
        (report.claimed, report.moved),
        (0, 1),
        "moved, not claimed: {report:?}"
    );
    let moved = store.snapshot(id).unwrap();
    assert_eq!(moved.index_due(), moved.due_at());
    assert_eq!(
        (moved.generation, moved.lease.is_none()),
        (hopped.generation, true)
    );
    assert!(sender.drain().is_empty(), "nothing sent");
    // The next sweep before it is due does not find it.
    let report = coordinator.claim_due(None).await.unwrap();
    assert_eq!((report.due, report.claimed, report.moved), (0, 0, 0));

    // Once due (step b never answered), a sweep claims it: one lease, one generation.
    clock.set(T0 + 10_000 + TIMEOUT_MS + 1);
    let report = coordinator.claim_due(None).await.unwrap();
    assert_eq!((report.claimed, report.moved), (1, 0), "{report:?}");
    let claimed = store.snapshot(id).unwrap();
    assert_eq!(claimed.generation, hopped.generation + 1);
    assert!(claimed.lease.is_some());
}
