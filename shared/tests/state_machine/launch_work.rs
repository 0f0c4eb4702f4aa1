//! `LaunchWork`: launch work under its lease starts an attempt, re-sends a lost request, times an
//! attempt out, or finds nothing to do; work under a lost lease is fenced.

use stepline::domain::execution::DeadLetterMark;
use stepline::domain::machine::MAX_RESENDS;
use stepline::domain::{launch_id, Event, RetryPolicy, Skip, Status, StepStatus};

use crate::fixtures::*;

#[test]
fn launch_work_starts_first_attempt_of_queued_execution_with_deterministic_launch_id() {
    let m = Machine::of(three_steps());
    let (record, actions) = m.started();

    let (next, actions) = m.commit(&record, LAUNCHED_AT, 2, &launch_work_of(&actions));

    let id = launch_id(EXEC, 0, 1);
    assert_eq!(next.status, Status::Running);
    assert_eq!((next.step, next.attempt, next.resends), (0, 1, 0));
    assert_eq!(next.launch_id, Some(id));
    assert_eq!(next.lease, None, "the lease is consumed by the launch");
    assert_eq!(next.generation, 1, "launching takes no lease");
    assert_eq!(next.wake_at, Some(ts(DEADLINE0)));
    assert_eq!(next.due_at(), Some(ts(DEADLINE0)));
    assert_eq!(next.steps, vec![launching(id)]);
    assert_eq!(request_of(&actions), (0, 1, id, DEADLINE0));
}

#[test]
fn launch_work_with_wrong_generation_is_fenced() {
    let m = Machine::of(three_steps());
    let (record, _) = m.started();
    let stale = launch_work(0, 1);
    let ahead = launch_work(2, 1);
    assert_eq!(m.skipped(&record, LAUNCHED_AT, 2, &stale), Skip::Fenced);
    assert_eq!(m.skipped(&record, LAUNCHED_AT, 2, &ahead), Skip::Fenced);
}

#[test]
fn launch_work_with_wrong_token_is_fenced() {
    let m = Machine::of(three_steps());
    let (record, _) = m.started();
    let forged = launch_work(1, 999);
    assert_eq!(m.skipped(&record, LAUNCHED_AT, 2, &forged), Skip::Fenced);
}

#[test]
fn launch_work_on_running_execution_past_deadline_resends_same_launch_id_once() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (claimed, actions) = m.commit(&record, DEADLINE0, 3, &Event::Claim);

    let (next, actions) = m.commit(&claimed, RESENT_AT, 4, &launch_work_of(&actions));

    let id = launch_id(EXEC, 0, 1);
    assert_eq!(request_of(&actions), (0, 1, id, DEADLINE1));
    assert_eq!(next.status, Status::Running);
    assert_eq!(
        (next.step, next.attempt),
        (0, 1),
        "a resend is not a new attempt"
    );
    assert_eq!(next.launch_id, Some(id));
    assert_eq!(next.resends, 1);
    assert_eq!(next.resends, MAX_RESENDS);
    assert_eq!(
        next.wake_at,
        Some(ts(DEADLINE1)),
        "the resent request gets a new deadline"
    );
    assert_eq!(next.lease, None);
    assert_eq!(next.generation, 2, "only the claim moved the generation");
    assert_eq!(next.steps[0].status, StepStatus::Launching);
    assert_eq!(next.steps[0].launch_id, id);
}

#[test]
fn launch_work_on_resent_attempt_past_deadline_times_it_out_and_schedules_retry() {
    let m = Machine::of(three_steps());
    let (next, actions) = m.timed_out();

    assert_eq!(next.status, Status::WaitRetry);
    assert_eq!((next.step, next.attempt), (0, 1));
    assert_eq!(next.launch_id, None);
    let error = next.error.clone().expect("the timeout is recorded");
    assert_eq!(error.code, "STEP_TIMEOUT");
    assert!(error.retryable);
    assert!(error.message.contains("60 s"), "{}", error.message);
    assert!(error.message.contains("sent 2 times"), "{}", error.message);
    assert_eq!(next.steps[0].status, StepStatus::Failed);
    assert_eq!(next.steps[0].error.as_ref(), Some(&error));
    assert_eq!(next.steps[0].receipt, None, "no reply was applied");

    let delay = m.def.steps[0].retry.delay_ms(1, JITTER);
    assert_eq!(delay, 1_250);
    assert_eq!(next.wake_at, Some(ts(TIMED_OUT_AT + 1_250)));
    assert_eq!(next.generation, 4, "start, two claims, and the retry lease");
    assert_eq!(next.lease, leased(6, TIMED_OUT_AT + 1_250 + LEASE_MS));
    assert_eq!(enqueued(&actions), (4, token(6), 2));
}

#[test]
fn step_timeout_on_last_attempt_of_budget_fails_execution() {
    let m = Machine::of(with_first_retry(RetryPolicy::doubling(1, 2_500, 60_000)));
    let (next, actions) = m.timed_out();

    assert_eq!(next.status, Status::Failed);
    assert_eq!(
        next.error.as_ref().map(|e| e.code.as_str()),
        Some("STEP_TIMEOUT")
    );
    assert_eq!(next.steps[0].status, StepStatus::Failed);
    let id = dead_letter_of(&actions);
    assert_eq!(next.dead_letter, Some(DeadLetterMark { id, sent: false }));
    assert_eq!(next.lease, None);
    assert_eq!(next.wake_at, Some(ts(TIMED_OUT_AT + LEASE_MS)));
    assert_eq!(
        next.due_at(),
        Some(ts(TIMED_OUT_AT + LEASE_MS)),
        "due until the dead letter is sent"
    );
    assert_eq!(next.generation, 3, "no lease is taken for a failure");
}

/// The sweeper claims a RUNNING execution at its deadline, then a heartbeat extends the deadline before
/// the launch work arrives: under its still valid lease there is nothing to do, so the commit only
/// releases the lease.
#[test]
fn launch_work_on_running_execution_before_deadline_only_releases_lease() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (claimed, actions) = m.commit(&record, DEADLINE0, 3, &Event::Claim);
    let heartbeat = Event::Heartbeat {
        launch_id: launch_id(EXEC, 0, 1),
        step: 0,
        attempt: 1,
    };
    let (alive, _) = m.commit(&claimed, DEADLINE0 + 5, 4, &heartbeat);
    assert_eq!(alive.wake_at, Some(ts(DEADLINE0 + 5 + TIMEOUT_MS[0])));
    assert_eq!(
        alive.lease, claimed.lease,
        "a heartbeat leaves the lease alone"
    );

    let (next, actions) = m.commit(&alive, DEADLINE0 + 10, 5, &launch_work_of(&actions));

    assert!(actions.is_empty());
    let mut expected = alive.clone();
    expected.version += 1;
    expected.updated_at = ts(DEADLINE0 + 10);
    expected.lease = None;
    assert_eq!(next, expected);
    assert_eq!(next.resends, 0, "nothing was re-sent");
    assert_eq!(next.due_at(), Some(ts(DEADLINE0 + 5 + TIMEOUT_MS[0])));
}

#[test]
fn launch_work_on_wait_retry_starts_next_attempt_with_new_launch_id() {
    let m = Machine::of(three_steps());
    let (waiting, actions) = m.failed_once(T0 + 7_000);
    assert_eq!(waiting.status, Status::WaitRetry);
    let at = T0 + 8_250;

    let (next, actions) = m.commit(&waiting, at, 4, &launch_work_of(&actions));

    let second = launch_id(EXEC, 0, 2);
    assert_ne!(second, launch_id(EXEC, 0, 1));
    assert_eq!(next.status, Status::Running);
    assert_eq!((next.step, next.attempt, next.resends), (0, 2, 0));
    assert_eq!(next.launch_id, Some(second));
    assert_eq!(next.steps.len(), 1, "the step's progress is reused");
    assert_eq!(next.steps[0].status, StepStatus::Launching);
    assert_eq!(next.steps[0].launch_id, second);
    assert_eq!(next.lease, None);
    assert_eq!(next.wake_at, Some(ts(at + TIMEOUT_MS[0])));
    assert_eq!(request_of(&actions), (0, 2, second, at + TIMEOUT_MS[0]));
}
