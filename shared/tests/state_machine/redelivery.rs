//! Every event delivered twice: the second delivery is skipped, rejected or (for events that carry
//! no identity) applied again, never applied as new.

use stepline::domain::{launch_id, Action, Event, Execution, Rejection, Skip, Status};

use crate::fixtures::*;

#[test]
fn claim_delivered_twice_takes_the_lease_only_once() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (claimed, _) = m.commit(&record, DEADLINE0, 3, &Event::Claim);

    // Same instant and later within the lease: the second claim does not advance.
    assert_eq!(
        m.skipped(&claimed, DEADLINE0, 3, &Event::Claim),
        Skip::NotDue
    );
    assert_eq!(
        m.skipped(&claimed, DEADLINE0 + LEASE_MS - 1, 4, &Event::Claim),
        Skip::NotDue
    );
}

#[test]
fn launch_work_delivered_twice_is_fenced_because_its_lease_was_consumed() {
    let m = Machine::of(three_steps());

    // QUEUED -> RUNNING.
    let (record, actions) = m.started();
    let launched = launched_once(&m, &record, (LAUNCHED_AT, 2), &actions);

    // The resend past the deadline.
    let (claimed, actions) = m.commit(&launched, DEADLINE0, 3, &Event::Claim);
    let resent = launched_once(&m, &claimed, (RESENT_AT, 4), &actions);

    // The timeout: the retry lease it takes is a new generation and token.
    let (claimed, actions) = m.commit(&resent, DEADLINE1, 5, &Event::Claim);
    let waiting = launched_once(&m, &claimed, (TIMED_OUT_AT, 6), &actions);
    assert_eq!(waiting.status, Status::WaitRetry);

    // WAIT_RETRY -> RUNNING (next attempt).
    let (record, actions) = m.failed_once(T0 + 7_000);
    let second = launched_once(&m, &record, (T0 + 9_000, 4), &actions);
    assert_eq!(second.attempt, 2);
}

/// Applies the launch work `actions` enqueued at `at` under token `tok`, and checks that the same work
/// delivered again is fenced.
#[track_caller]
fn launched_once(
    m: &Machine,
    record: &Execution,
    (at, tok): (i64, u128),
    actions: &[Action],
) -> Execution {
    let work = launch_work_of(actions);
    let (launched, _) = m.commit(record, at, tok, &work);
    assert_eq!(m.skipped(&launched, at, tok, &work), Skip::Fenced);
    launched
}

#[test]
fn identical_reply_delivered_twice_is_skipped_as_duplicate() {
    let m = Machine::of(three_steps());

    // Success of a middle step: the execution moved on, and the record keeps only the current
    // step's progress: the reply answers a step it left (recognised by its launch id), and nothing is
    // written, however often it comes.
    let record = m.running();
    let event = ok_reply(0, 1, output(0));
    let (next, _) = m.commit(&record, T0 + 5_000, 3, &event);
    assert_eq!(m.skipped(&next, T0 + 5_000, 3, &event), Skip::Stale);
    let (further, _) = m.commit(&next, T0 + 6_000, 4, &ok_reply(1, 1, output(1)));
    assert_eq!(m.skipped(&further, T0 + 7_000, 5, &event), Skip::Stale);

    // Success of the last step (duplicate, not merely terminal).
    let record = m.running_at_step(2);
    let event = ok_reply(2, 1, output(2));
    let (done, _) = m.commit(&record, T0 + 10_000, 3, &event);
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(m.skipped(&done, T0 + 10_000, 3, &event), Skip::Duplicate);

    // Retryable failure, before and after the retry was launched.
    let record = m.running();
    let event = err_reply(0, 1, &retryable());
    let (waiting, actions) = m.commit(&record, T0 + 7_000, 3, &event);
    assert_eq!(m.skipped(&waiting, T0 + 7_000, 3, &event), Skip::Duplicate);
    let (second, _) = m.commit(&waiting, T0 + 9_000, 4, &launch_work_of(&actions));
    assert_eq!(m.skipped(&second, T0 + 9_500, 5, &event), Skip::Duplicate);

    // Fatal failure.
    let record = m.running();
    let event = err_reply(0, 1, &fatal());
    let (failed, _) = m.commit(&record, T0 + 7_000, 3, &event);
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(m.skipped(&failed, T0 + 7_000, 3, &event), Skip::Duplicate);
}

#[test]
fn reply_with_same_launch_id_but_other_bytes_is_rejected_as_conflict() {
    let m = Machine::of(three_steps());
    let first = launch_id(EXEC, 0, 1);
    let last = launch_id(EXEC, 2, 1);

    // While the record holds the step's progress: its failures, and the last step's success.
    for (record, event, launch) in [
        (m.running(), err_reply(0, 1, &retryable()), first),
        (m.running(), err_reply(0, 1, &fatal()), first),
        (m.running_at_step(2), ok_reply(2, 1, output(2)), last),
    ] {
        let (next, _) = m.commit(&record, T0 + 5_000, 3, &event);
        let rejection = m.rejected(&next, T0 + 5_000, 3, &with_other_bytes(&event));
        assert_eq!(rejection, Rejection::Conflict { launch_id: launch });
        assert_eq!(rejection.code(), "RECEIPT_CONFLICT");
    }

    // A success replayed as a failure of the same launch is a conflict as well.
    let (next, _) = m.commit(
        &m.running_at_step(2),
        T0 + 5_000,
        3,
        &ok_reply(2, 1, output(2)),
    );
    assert_eq!(
        m.rejected(&next, T0 + 6_000, 4, &err_reply(2, 1, &fatal())),
        Rejection::Conflict { launch_id: last }
    );
}

/// The second delivery is rejected and not applied. `redrive` checks the status before the version,
/// so an immediate replay (record now QUEUED) is refused as `NotRedrivable(QUEUED)`; the version guard
/// fires once the execution is FAILED again (next test).
#[test]
fn redrive_delivered_twice_is_rejected_the_second_time() {
    let m = Machine::of(three_steps());
    let failed = m.exhausted();
    let event = redrive(failed.version, "gateway fixed");
    let (requeued, _) = m.commit(&failed, T0 + 100_000, 50, &event);

    let rejection = m.rejected(&requeued, T0 + 100_000, 50, &event);

    assert_eq!(rejection, Rejection::NotRedrivable(Status::Queued));
}

#[test]
fn redrive_replayed_after_execution_failed_again_is_rejected_as_version_mismatch() {
    let m = Machine::of(three_steps());
    let at = T0 + 100_000;
    let event = redrive(m.exhausted().version, "gateway fixed");
    let (launched, _) = m.redriven(at);
    let (failed_again, _) = m.commit(&launched, at + 200, 52, &err_reply(0, 4, &fatal()));
    assert_eq!(failed_again.status, Status::Failed);

    assert_eq!(
        m.rejected(&failed_again, at + 300, 53, &event),
        Rejection::VersionMismatch {
            expected: 7,
            actual: 10,
        }
    );
}

#[test]
fn cancel_delivered_twice_is_rejected_as_already_terminal() {
    let m = Machine::of(three_steps());
    let (next, _) = m.cancel_running("stop");

    assert_eq!(
        m.rejected(&next, CANCELLED_AT, 9, &cancel("stop")),
        Rejection::AlreadyTerminal(Status::Cancelled)
    );
}

#[test]
fn dead_letter_sent_delivered_twice_is_skipped_as_duplicate() {
    let m = Machine::of(three_steps());
    let (failed, id) = m.dead_lettered(T0 + 7_000);
    let event = Event::DeadLetterSent { id };
    let (reported, _) = m.commit(&failed, T0 + 7_050, 4, &event);

    assert_eq!(m.skipped(&reported, T0 + 7_050, 4, &event), Skip::Duplicate);
}

#[test]
fn dead_letter_claim_delivered_twice_sends_the_envelope_once() {
    let m = Machine::of(three_steps());
    let at = T0 + 7_000;
    let (failed, _) = m.failed_at(at);
    let (resent, actions) = m.commit(&failed, at + LEASE_MS, 4, &Event::Claim);
    assert_eq!(actions.len(), 1);

    assert_eq!(
        m.skipped(&resent, at + LEASE_MS, 4, &Event::Claim),
        Skip::Terminal
    );
}

/// Heartbeats carry no identity: a redelivered heartbeat is applied again and extends the deadline from
/// the time it is processed. Pinned here so that a change is deliberate.
#[test]
fn heartbeat_delivered_twice_is_applied_again_and_extends_from_the_redelivery_time() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let event = heartbeat(0, 1);
    let (once, _) = m.commit(&record, LAUNCHED_AT + 10_000, 3, &event);

    let later = LAUNCHED_AT + 50_000;
    let (twice, actions) = m.commit(&once, later, 4, &event);

    assert!(actions.is_empty());
    assert_eq!(twice.version, once.version + 1);
    assert_eq!(twice.wake_at, Some(ts(later + TIMEOUT_MS[0])));
}

/// Incidents carry no identity either: the same incident delivered twice is noted twice.
#[test]
fn incident_delivered_twice_is_noted_twice() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let event = incident("UNDECODABLE");
    let (once, _) = m.commit(&record, T0 + 1_000, 3, &event);
    let (twice, _) = m.commit(&once, T0 + 1_000, 3, &event);

    assert_eq!(twice.incidents.len(), 2);
    assert_eq!(twice.incidents[0], twice.incidents[1]);
}
