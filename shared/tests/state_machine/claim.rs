//! `Claim`: the sweeper takes the lease of a due execution, or finds it not due or ended.

use stepline::domain::{launch_id, Event, Skip, Status};

use crate::fixtures::*;

#[test]
fn claim_of_due_unleased_execution_takes_lease_with_next_generation_and_enqueues_launch() {
    let m = Machine::of(three_steps());
    let record = m.running();
    assert_eq!(record.lease, None);
    assert_eq!(record.due_at(), Some(ts(DEADLINE0)));

    let (next, actions) = m.commit(&record, DEADLINE0, 3, &Event::Claim);

    assert_eq!(next.generation, record.generation + 1);
    assert_eq!(next.generation, 2);
    assert_eq!(next.lease, leased(3, DEADLINE0 + LEASE_MS));
    assert_eq!(enqueued(&actions), (2, token(3), 0));
    // The claim changes nothing but the lease.
    assert_eq!(next.status, Status::Running);
    assert_eq!((next.step, next.attempt), (0, 1));
    assert_eq!(next.launch_id, Some(launch_id(EXEC, 0, 1)));
    assert_eq!(next.wake_at, Some(ts(DEADLINE0)));
    assert_eq!(next.due_at(), Some(ts(DEADLINE0 + LEASE_MS)));
}

#[test]
fn claim_before_due_time_is_skipped_as_not_due() {
    let m = Machine::of(three_steps());
    let record = m.running();
    // Its entry was keyed at creation by the creation lease's expiry, and kept when the launch moved
    // the due time on to the step's deadline: a sweeper that finds it there moves it, once.
    assert_eq!(record.index_due(), Some(ts(T0 + LEASE_MS)));
    assert_eq!(record.due_at(), Some(ts(DEADLINE0)));
    let record = m.found_early(&record, DEADLINE0 - 1, 3);
    assert_eq!(
        m.skipped(&record, DEADLINE0 - 1, 4, &Event::Claim),
        Skip::NotDue
    );
}

#[test]
fn hops_leave_the_due_index_entry_where_it_is_until_it_would_be_late() {
    let m = Machine::of(three_steps());
    let record = m.running_at_step(2);
    // Two steps ended, each moving the deadline on: the entry stayed where the creation put it.
    assert_eq!(record.index_due(), Some(ts(T0 + LEASE_MS)));
    assert!(record.due_at() > record.index_due());
    // A step whose deadline comes before the kept key moves it there (never later than due).
    let mut early = record.clone();
    early.indexed_due = Some(record.due_at().unwrap() + std::time::Duration::from_millis(1));
    assert_eq!(early.index_due(), record.due_at());
    // The end removes it.
    let (done, _) = m.commit(&record, T0 + 10_000, 30, &ok_reply(2, 1, output(2)));
    assert!(done.status.is_terminal());
    assert_eq!((done.index_due(), done.indexed_due), (None, None));
}

/// A claim needs the lease absent or expired. `Execution::due_at` is the lease expiry while leased, so
/// an unexpired lease makes the record not due yet: the skip is `NotDue`.
#[test]
fn claim_of_execution_under_unexpired_lease_is_skipped_without_taking_it() {
    let m = Machine::of(three_steps());
    let (record, _) = m.started();
    assert_eq!(
        record.lease.as_ref().map(|l| l.expires_at),
        Some(ts(T0 + LEASE_MS))
    );

    // Well past the record's wake time, 1 ms before the lease runs out.
    assert_eq!(record.wake_at, Some(ts(T0)));
    let skip = m.skipped(&record, T0 + LEASE_MS - 1, 3, &Event::Claim);

    assert_eq!(skip, Skip::NotDue);
}

#[test]
fn claim_of_terminal_execution_is_skipped_as_terminal() {
    let m = Machine::of(three_steps());
    let (far_future, tok) = (T0 + 86_400_000, 3);
    let failed = m.exhausted();
    let id = failed.dead_letter.as_ref().expect("dead letter marked").id;
    let (failed_and_reported, _) = m.commit(&failed, T0 + 31_000, 3, &Event::DeadLetterSent { id });
    for record in [m.succeeded(), failed_and_reported, m.cancelled()] {
        assert_eq!(record.due_at(), None);
        assert_eq!(
            m.skipped(&record, far_future, tok, &Event::Claim),
            Skip::Terminal,
            "claim of a {} execution",
            record.status
        );
    }
    // A failure whose dead letter is unsent is terminal too until it is due.
    assert_eq!(
        m.skipped(&failed, T0 + 30_000 + LEASE_MS - 1, 3, &Event::Claim),
        Skip::Terminal
    );
}

#[test]
fn claim_after_lease_expiry_takes_over_with_next_generation_and_fences_old_launch_work() {
    let m = Machine::of(three_steps());
    let (record, actions) = m.started();
    let lost_work = launch_work_of(&actions);

    assert_eq!(
        m.skipped(&record, T0 + LEASE_MS - 1, 2, &Event::Claim),
        Skip::NotDue
    );
    let (taken, actions) = m.commit(&record, T0 + LEASE_MS, 2, &Event::Claim);

    assert_eq!(taken.status, Status::Queued);
    assert_eq!(taken.generation, 2);
    assert_eq!(taken.lease, leased(2, T0 + 2 * LEASE_MS));
    assert_eq!(enqueued(&actions), (2, token(2), 0));
    // The old holder's work, arriving late, is fenced; the new work launches.
    assert_eq!(
        m.skipped(&taken, T0 + LEASE_MS + 5, 3, &lost_work),
        Skip::Fenced
    );
    let (launched, _) = m.commit(&taken, T0 + LEASE_MS + 5, 3, &launch_work_of(&actions));
    assert_eq!((launched.status, launched.attempt), (Status::Running, 1));
}
