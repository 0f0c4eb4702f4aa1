//! `Cancel`: a live execution ends as CANCELLED; the worker of an in-flight launch is told.

use stepline::domain::{launch_id, Action, Event, Rejection, Skip, Status, StepError};

use crate::fixtures::*;

#[test]
fn cancel_of_running_execution_cancels_it_and_clears_due_time() {
    let m = Machine::of(three_steps());
    let record = m.running();

    let (next, actions) = m.cancel_running("customer withdrew the order");

    assert_eq!(next.status, Status::Cancelled);
    assert_eq!(
        actions,
        vec![Action::NotifyCancel {
            step: 0,
            launch_id: launch_id(EXEC, 0, 1),
        }],
        "the worker of the in-flight launch is told"
    );
    assert_eq!(next.due_at(), None);
    assert_eq!(next.wake_at, None);
    assert_eq!(next.launch_id, None);
    assert_eq!(next.lease, None);
    assert_eq!(
        next.error,
        Some(StepError::new(
            "CANCELLED",
            "customer withdrew the order",
            false
        ))
    );
    assert_eq!(next.generation, record.generation);
}

#[test]
fn cancel_of_waiting_retry_drops_its_lease_and_its_pending_launch_work_is_skipped() {
    let m = Machine::of(three_steps());
    let (waiting, actions) = m.failed_once(T0 + 7_000);
    assert!(waiting.lease.is_some());
    let cancel = cancel("stop");

    let (next, notices) = m.commit(&waiting, T0 + 7_500, 4, &cancel);

    assert_eq!(next.status, Status::Cancelled);
    assert!(notices.is_empty(), "nothing in flight to notify");
    assert_eq!(next.lease, None);
    assert_eq!(
        m.skipped(&next, T0 + 9_000, 5, &launch_work_of(&actions)),
        Skip::Terminal
    );
}

#[test]
fn cancel_of_queued_execution_notifies_no_worker() {
    let m = Machine::of(three_steps());
    let (record, _) = m.started();
    let cancel = cancel("stop");
    let (next, actions) = m.commit(&record, T0 + 10, 2, &cancel);
    assert_eq!(next.status, Status::Cancelled);
    assert!(actions.is_empty());
    assert_eq!(next.lease, None);
    assert_eq!(next.due_at(), None);
}

#[test]
fn cancel_of_terminal_execution_is_rejected_as_already_terminal() {
    let m = Machine::of(three_steps());
    for record in [m.succeeded(), m.exhausted(), m.cancelled()] {
        let cancel = cancel("too late");
        let rejection = m.rejected(&record, T0 + 200_000, 60, &cancel);
        assert_eq!(rejection, Rejection::AlreadyTerminal(record.status));
        assert_eq!(rejection.code(), "ALREADY_TERMINAL");
    }
}

#[test]
fn reply_arriving_after_cancel_is_skipped_as_terminal_and_not_applied() {
    let m = Machine::of(three_steps());
    let record = m.cancelled();
    for event in [
        ok_reply(0, 1, output(0)),
        err_reply(0, 1, &retryable()),
        err_reply(0, 1, &fatal()),
        Event::Heartbeat {
            launch_id: launch_id(EXEC, 0, 1),
            step: 0,
            attempt: 1,
        },
    ] {
        assert_eq!(m.skipped(&record, T0 + 3_000, 10, &event), Skip::Terminal);
    }
}
