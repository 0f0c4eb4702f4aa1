//! The lifecycle outbox: events recorded with a commit, published, confirmed, and dropped when they
//! cannot be published.

use stepline::domain::execution::LifecycleKind;
use stepline::domain::machine::{EVENTS_DROPPED, MAX_PUBLISH_ATTEMPTS};
use stepline::domain::{Action, Event, Execution, Skip};

use crate::fixtures::*;

#[test]
fn an_outbox_that_is_never_confirmed_is_retried_less_often_then_dropped_and_noted() {
    let m = Machine::of(three_steps());
    let mut record = m.unpublished();
    let mut writes = 0;
    let mut last_gap = 0;
    loop {
        let now = record.publish_by.expect("still due");
        let at = lifecycle_ctx(now.millis(), 100 + writes);
        let (next, actions) = m.commit_in(&record, &at, &Event::Claim);
        writes += 1;
        if next.events.is_empty() {
            assert!(actions.is_empty());
            break;
        }
        assert_eq!(actions, vec![Action::PublishEvents]);
        let gap = next.publish_by.unwrap().since(now).as_millis();
        assert!(
            gap >= last_gap && gap > 0,
            "backs off: {gap} after {last_gap}"
        );
        last_gap = gap;
        record = next;
        assert!(
            writes < 100,
            "an unpublishable outbox must not be rewritten forever"
        );
    }
    assert_eq!(writes, u128::from(MAX_PUBLISH_ATTEMPTS));
    let done = record_after_drop(&m, &record);
    assert!(done.events.is_empty());
    assert_eq!(done.publish_by, None);
    assert_eq!(done.due_at(), None, "leaves the due index");
    let incident = done.incidents.last().expect("the drop is noted");
    assert_eq!(incident.code, EVENTS_DROPPED);
}

/// The claim that drops `record`'s outbox (its last publication attempt is used up).
fn record_after_drop(m: &Machine, record: &Execution) -> Execution {
    let mut exhausted = record.clone();
    exhausted.publish_attempts = MAX_PUBLISH_ATTEMPTS - 1;
    let at = lifecycle_ctx((record.publish_by.unwrap()).millis(), 999);
    m.commit_in(&exhausted, &at, &Event::Claim).0
}

#[test]
fn an_outbox_is_dropped_at_once_when_lifecycle_events_are_switched_off() {
    let m = Machine::of(three_steps());
    let record = m.unpublished();
    let (next, actions) = m.commit(
        &record,
        (record.publish_by.unwrap()).millis(),
        5,
        &Event::Claim,
    );
    assert!(actions.is_empty());
    assert!(next.events.is_empty());
    assert_eq!(next.due_at(), None);
    assert!(next
        .incidents
        .last()
        .unwrap()
        .detail
        .contains("switched off"));
}

#[test]
fn a_commit_with_lifecycle_events_on_fills_the_outbox_and_publishes_it() {
    let m = Machine::of(three_steps());
    let (done, actions) = m.succeed_in(&lifecycle_ctx(T0 + 10_000, 30));
    let kinds: Vec<_> = done
        .events
        .iter()
        .map(|e| (e.seq, e.kind, e.step))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (0, LifecycleKind::StepSucceeded, Some(2)),
            (1, LifecycleKind::ExecutionSucceeded, Some(2)),
        ]
    );
    assert!(done.events.iter().all(|e| e.at == ts(T0 + 10_000)));
    assert_eq!(done.event_seq, 2);
    assert_eq!(actions, vec![Action::PublishEvents]);
    assert_eq!(
        done.due_at(),
        Some(ts(T0 + 10_000 + LEASE_MS)),
        "due until the events are confirmed published"
    );
    // Lifecycle events off: nothing in the outbox, nothing to publish.
    let (quiet, actions) = m.succeed_in(&ctx(T0 + 10_000, 30));
    assert!(quiet.events.is_empty() && actions.is_empty());
}

#[test]
fn events_published_leave_the_outbox_and_a_redelivery_is_a_duplicate() {
    let m = Machine::of(three_steps());
    let (done, _) = m.succeed_in(&lifecycle_ctx(T0 + 10_000, 30));
    let first = Event::EventsPublished { through: 0 };
    let (half, actions) = m.commit_in(&done, &lifecycle_ctx(T0 + 10_050, 31), &first);
    assert!(actions.is_empty(), "a confirmation publishes nothing");
    assert_eq!(half.events.len(), 1);
    assert_eq!(half.events[0].seq, 1);
    assert_eq!(half.publish_by, done.publish_by, "the rest is still due");
    assert_eq!(m.skipped(&half, T0 + 10_060, 32, &first), Skip::Duplicate);
    let rest = Event::EventsPublished { through: 1 };
    let (published, _) = m.commit(&half, T0 + 10_070, 33, &rest);
    assert!(published.events.is_empty());
    assert_eq!(
        (published.publish_by, published.publish_attempts),
        (None, 0)
    );
    assert_eq!(published.due_at(), None, "leaves the due index");
    assert_eq!(
        m.skipped(&published, T0 + 10_080, 34, &rest),
        Skip::Duplicate
    );
}
