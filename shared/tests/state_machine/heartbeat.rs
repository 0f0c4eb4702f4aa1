//! `Heartbeat`: a running attempt's sign of life extends its deadline.

use stepline::domain::history::{Entry, What};
use stepline::domain::{Event, Skip};

use crate::fixtures::*;

#[test]
fn heartbeat_of_current_attempt_extends_its_deadline_and_changes_nothing_else() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let at = LAUNCHED_AT + 50_000;

    let (next, actions) = m.commit(&record, at, 3, &heartbeat(0, 1));

    assert!(actions.is_empty());
    let mut expected = record.clone();
    expected.version += 1;
    expected.updated_at = ts(at);
    expected.wake_at = Some(ts(at + TIMEOUT_MS[0]));
    expected.history.push(Entry {
        after_ms: at - record.created_at.millis(),
        what: What::Heartbeat {
            step: 0,
            attempt: 1,
            count: 1,
        },
    });
    assert_eq!(next, expected);
    // A second one counts on in the same entry.
    let later = at + 1_000;
    let (again, _) = m.commit(&next, later, 4, &heartbeat(0, 1));
    assert_eq!(again.history.len(), next.history.len());
    assert_eq!(
        again.history.last().unwrap(),
        &Entry {
            after_ms: later - record.created_at.millis(),
            what: What::Heartbeat {
                step: 0,
                attempt: 1,
                count: 2
            }
        }
    );
    // The sweeper no longer finds it due at the original deadline (its entry moves on).
    let moved = m.found_early(&next, DEADLINE0, 4);
    assert_eq!(moved.index_due(), next.due_at());
    assert_eq!(m.skipped(&moved, DEADLINE0, 5, &Event::Claim), Skip::NotDue);
}

#[test]
fn heartbeat_of_an_attempt_that_is_not_current_is_skipped() {
    let m = Machine::of(three_steps());
    let (waiting, actions) = m.timed_out();
    let (at, tok) = (TIMED_OUT_AT + 100, 7);
    assert_eq!(m.skipped(&waiting, at, tok, &heartbeat(0, 1)), Skip::Stale);

    let (second, _) = m.commit(&waiting, TIMED_OUT_AT + 2_000, 7, &launch_work_of(&actions));
    let (at, tok) = (TIMED_OUT_AT + 3_000, 8);
    assert_eq!(
        m.skipped(&second, at, tok, &heartbeat(0, 1)),
        Skip::Stale,
        "superseded"
    );
    assert_eq!(
        m.skipped(&second, at, tok, &heartbeat(0, 3)),
        Skip::Stale,
        "not launched"
    );
    assert_eq!(
        m.skipped(&second, at, tok, &heartbeat(1, 1)),
        Skip::Stale,
        "other step"
    );

    let done = m.succeeded();
    assert_eq!(
        m.skipped(&done, T0 + 20_000, 9, &heartbeat(2, 1)),
        Skip::Terminal
    );
}
