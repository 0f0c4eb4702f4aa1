//! `Reply`: a worker's reply applied to the current attempt (next step, success, retry or failure),
//! late replies of superseded attempts (adopted or stale), and replies that cannot belong to the
//! execution.

use serde_json::json;
use stepline::domain::execution::DeadLetterMark;
use stepline::domain::machine::MAX_DELAY_SECONDS;
use stepline::domain::{
    launch_id, Action, Context, Decision, Event, Outcome, Payload, Receipt, Rejection, RetryPolicy,
    Skip, Status, StepError, StepProgress, StepStatus,
};
use uuid::Uuid;

use crate::fixtures::*;

#[test]
fn successful_reply_on_middle_step_records_output_and_launches_next_step() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let at = T0 + 5_000;
    let value = json!({"validated": true, "orderId": "o-42"});
    let event = ok_reply(0, 1, value.clone());

    let (next, actions) = m.commit(&record, at, 3, &event);

    let first = launch_id(EXEC, 0, 1);
    let second_step = launch_id(EXEC, 1, 1);
    assert_eq!(next.status, Status::Running);
    assert_eq!(
        (next.step, next.attempt, next.budget_base, next.resends),
        (1, 1, 0, 0)
    );
    assert_eq!(next.launch_id, Some(second_step));
    assert_eq!(
        next.wake_at,
        Some(ts(at + TIMEOUT_MS[1])),
        "deadline of the next step"
    );
    assert_eq!(next.lease, None);
    assert_eq!(next.generation, 1);
    // The record moves on to the next step: its progress replaces the first step's, whose output is
    // now the current input.
    assert_eq!(next.first_step, 1);
    assert_eq!(next.steps, vec![launching(second_step)]);
    assert_eq!(next.steps_succeeded_since(&record), vec![0]);
    assert_ne!(first, second_step);
    assert_eq!(
        next.step_input(1),
        Some(&Payload::new(value)),
        "the output feeds the next step"
    );
    assert_eq!(
        request_of(&actions),
        (1, 1, second_step, at + TIMEOUT_MS[1])
    );
}

#[test]
fn successful_reply_on_last_step_succeeds_execution_with_result_and_no_due_time() {
    let m = Machine::of(three_steps());
    let record = m.running_at_step(2);
    let at = T0 + 10_000;
    let value = json!({"shipped": true, "tracking": "1Z999"});

    let (next, actions) = m.commit(&record, at, 3, &ok_reply(2, 1, value.clone()));

    assert_eq!(next.status, Status::Succeeded);
    assert_eq!(next.result, Some(Payload::new(value.clone())));
    assert_eq!(next.due_at(), None);
    assert_eq!(next.wake_at, None);
    assert_eq!(next.launch_id, None);
    assert_eq!(next.lease, None);
    assert_eq!(next.error, None);
    assert!(actions.is_empty());
    assert_eq!((next.first_step, next.steps.len()), (2, 1));
    assert_eq!(next.steps[0].status, StepStatus::Succeeded);
    assert!(
        next.input.is_null(),
        "the result holds the last output; the input is dropped"
    );
    assert_eq!(
        next.steps[0].receipt.as_ref().map(|r| r.launch_id),
        Some(launch_id(EXEC, 2, 1))
    );
}

#[test]
fn retryable_failure_with_budget_left_waits_for_retry_under_new_lease_and_jittered_delay() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let at = T0 + 7_000;
    let error = retryable();
    let event = err_reply(0, 1, &error);

    let (next, actions) = m.commit(&record, at, 3, &event);

    let delay = m.def.steps[0].retry.delay_ms(1, JITTER);
    assert_eq!(delay, 1_250, "2.5 s cap for retry 1, times jitter 0.5");
    assert_eq!(enqueued(&actions), (2, token(3), 2)); // ceil(1.25 s)
    assert_eq!(next.status, Status::WaitRetry);
    assert_eq!((next.step, next.attempt), (0, 1));
    assert_eq!(next.error, Some(error.clone()));
    assert_eq!(next.launch_id, None);
    assert_eq!(next.wake_at, Some(ts(at + 1_250)));
    assert_eq!(next.lease, leased(3, at + 1_250 + LEASE_MS));
    assert_eq!(next.due_at(), Some(ts(at + 1_250 + LEASE_MS)));
    let first = launch_id(EXEC, 0, 1);
    assert_eq!(
        next.steps[0],
        StepProgress {
            status: StepStatus::Failed,
            launch_id: first,
            receipt: Some(Receipt {
                launch_id: first,
                fingerprint: fingerprint(&Outcome::Failed(error.clone())),
            }),
            earlier_receipts: Vec::new(),
            error: Some(error.clone()),
        }
    );

    // The second failure backs off twice as long: 5 s cap times 0.5 = 2.5 s -> 3 s.
    let (second, _) = m.commit(&next, at + 2_000, 4, &launch_work_of(&actions));
    let (again, actions) = m.commit(&second, at + 3_000, 5, &err_reply(0, 2, &error));
    assert_eq!(m.def.steps[0].retry.delay_ms(2, JITTER), 2_500);
    assert_eq!(again.status, Status::WaitRetry);
    assert_eq!(again.wake_at, Some(ts(at + 3_000 + 2_500)));
    assert_eq!(enqueued(&actions), (3, token(5), 3));
}

#[test]
fn retry_delay_follows_the_context_jitter() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let event = err_reply(0, 1, &retryable());
    let policy = &m.def.steps[0].retry;
    for (jitter, expected_ms, expected_secs) in
        [(0.0, 0_u64, 0_u32), (0.2, 500, 1), (0.9, 2_250, 3)]
    {
        let context = Context {
            jitter,
            ..ctx(T0 + 7_000, 3)
        };
        let (next, actions) = m.commit_in(&record, &context, &event);
        assert_eq!(policy.delay_ms(1, jitter), expected_ms);
        assert_eq!(
            next.wake_at,
            Some(ts(T0 + 7_000 + expected_ms as i64)),
            "jitter {jitter}"
        );
        assert_eq!(
            enqueued(&actions),
            (2, token(3), expected_secs),
            "jitter {jitter}"
        );
    }
}

#[test]
fn retryable_failure_of_last_attempt_in_budget_fails_execution_with_the_error() {
    let m = Machine::of(three_steps());
    let record = m.exhausted();

    assert_eq!(record.status, Status::Failed);
    assert_eq!((record.step, record.attempt), (0, 3));
    assert_eq!(
        record.attempts_in_budget(),
        m.def.steps[0].retry.max_attempts
    );
    assert_eq!(record.error, Some(retryable()));
    assert_eq!(record.steps[0].status, StepStatus::Failed);
    assert_eq!(record.launch_id, None);
    assert_eq!(record.lease, None);
    assert_eq!(record.version, 7);
    assert_eq!(record.generation, 3, "start and the two retry leases");
    // The third failure was committed at T0 + 30 s: dead letter marked unsent, due a lease later.
    assert!(record.dead_letter.as_ref().is_some_and(|d| !d.sent));
    assert_eq!(record.due_at(), Some(ts(T0 + 30_000 + LEASE_MS)));
}

#[test]
fn non_retryable_failure_fails_execution_at_once() {
    let m = Machine::of(three_steps());
    let record = m.running();

    let (next, actions) = m.commit(&record, T0 + 7_000, 3, &err_reply(0, 1, &fatal()));

    assert_eq!(next.status, Status::Failed);
    assert_eq!(next.attempt, 1, "no retry despite the budget");
    assert_eq!(next.error, Some(fatal()));
    assert_eq!(next.steps[0].status, StepStatus::Failed);
    assert_eq!(next.steps[0].error, Some(fatal()));
    let id = dead_letter_of(&actions);
    assert_eq!(next.dead_letter, Some(DeadLetterMark { id, sent: false }));
    assert_eq!(next.lease, None);
    assert_eq!(next.generation, record.generation);
    assert_eq!(next.wake_at, Some(ts(T0 + 7_000 + LEASE_MS)));
}

#[test]
fn error_code_listed_non_retryable_in_policy_fails_at_once_although_worker_says_retryable() {
    let mut retry = RetryPolicy::doubling(3, 2_500, 60_000);
    retry.non_retryable = vec!["UPSTREAM_BUSY".to_string()];
    let m = Machine::of(with_first_retry(retry));
    let record = m.running();
    assert!(retryable().retryable);

    let (next, actions) = m.commit(&record, T0 + 7_000, 3, &err_reply(0, 1, &retryable()));

    assert_eq!(next.status, Status::Failed);
    assert_eq!(next.attempt, 1);
    assert_eq!(
        next.error.as_ref().map(|e| e.code.as_str()),
        Some("UPSTREAM_BUSY")
    );
    assert!(matches!(
        actions.as_slice(),
        [Action::SendDeadLetter { .. }]
    ));

    // Another code is still retried under the same policy.
    let other = StepError::new("RATE_LIMITED", "slow down", true);
    let (waiting, _) = m.commit(&record, T0 + 7_000, 3, &err_reply(0, 1, &other));
    assert_eq!(waiting.status, Status::WaitRetry);
}

#[test]
fn retry_delay_beyond_sqs_limit_is_left_to_the_due_index_without_lease() {
    let m = Machine::of(with_first_retry(RetryPolicy::doubling(
        3, 2_000_000, 2_000_000,
    )));
    let record = m.running();
    let at = T0 + 7_000;
    let delay = m.def.steps[0].retry.delay_ms(1, JITTER);
    assert_eq!(delay, 1_000_000);
    assert!(delay.div_ceil(1000) > MAX_DELAY_SECONDS);

    let (waiting, actions) = m.commit(&record, at, 3, &err_reply(0, 1, &retryable()));

    assert_eq!(waiting.status, Status::WaitRetry);
    assert!(
        actions.is_empty(),
        "no launch work for a wait beyond SQS's delay"
    );
    assert_eq!(waiting.lease, None);
    assert_eq!(waiting.generation, record.generation);
    assert_eq!(waiting.wake_at, Some(ts(at + 1_000_000)));
    assert_eq!(waiting.due_at(), Some(ts(at + 1_000_000)));

    // The sweeper picks it up once due, and the retry launches from there.
    let moved = m.found_early(&waiting, at + 999_999, 4);
    assert_eq!(
        m.skipped(&moved, at + 999_999, 4, &Event::Claim),
        Skip::NotDue
    );
    let (claimed, actions) = m.commit(&waiting, at + 1_000_000, 4, &Event::Claim);
    assert_eq!(enqueued(&actions), (record.generation + 1, token(4), 0));
    let (launched, _) = m.commit(&claimed, at + 1_000_100, 5, &launch_work_of(&actions));
    assert_eq!((launched.status, launched.attempt), (Status::Running, 2));
}

#[test]
fn retry_delay_of_exactly_900_seconds_is_still_enqueued_and_one_ms_more_is_not() {
    let at = T0 + 7_000;
    let event = err_reply(0, 1, &retryable());

    let m = Machine::of(with_first_retry(RetryPolicy::doubling(
        3, 1_800_000, 1_800_000,
    )));
    assert_eq!(m.def.steps[0].retry.delay_ms(1, JITTER), 900_000);
    let (_, actions) = m.commit(&m.running(), at, 3, &event);
    assert_eq!(enqueued(&actions), (2, token(3), 900));

    let m = Machine::of(with_first_retry(RetryPolicy::doubling(
        3, 1_800_002, 1_800_002,
    )));
    assert_eq!(m.def.steps[0].retry.delay_ms(1, JITTER), 900_001);
    let (waiting, actions) = m.commit(&m.running(), at, 3, &event);
    assert!(actions.is_empty());
    assert_eq!(waiting.lease, None);
    assert_eq!(waiting.wake_at, Some(ts(at + 900_001)));
}

#[test]
fn reply_whose_launch_id_does_not_match_its_step_and_attempt_is_rejected() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (T0 + 5_000, 3);
    let outcome = Outcome::Succeeded(output(0));

    let foreign = launch_id(Uuid::from_u128(0xbad), 0, 1);
    let from_other_execution = Event::Reply {
        launch_id: foreign,
        step: 0,
        attempt: 1,
        fingerprint: fingerprint(&outcome),
        outcome: outcome.clone(),
    };
    assert_eq!(
        m.rejected(&record, at, tok, &from_other_execution),
        Rejection::UnknownCorrelation {
            launch_id: foreign,
            step: 0,
            attempt: 1,
        }
    );

    // The current launch id, but claimed for another attempt.
    let current = launch_id(EXEC, 0, 1);
    let mislabelled = Event::Reply {
        launch_id: current,
        step: 0,
        attempt: 2,
        fingerprint: fingerprint(&outcome),
        outcome,
    };
    let rejection = m.rejected(&record, at, tok, &mislabelled);
    assert_eq!(
        rejection,
        Rejection::UnknownCorrelation {
            launch_id: current,
            step: 0,
            attempt: 2,
        }
    );
    assert_eq!(rejection.code(), "UNKNOWN_CORRELATION");

    // A step the pipeline does not have.
    assert_eq!(
        m.rejected(&record, at, tok, &ok_reply(3, 1, output(3))),
        Rejection::UnknownCorrelation {
            launch_id: launch_id(EXEC, 3, 1),
            step: 3,
            attempt: 1,
        }
    );
}

#[test]
fn reply_for_attempt_or_step_not_launched_yet_is_rejected() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (T0 + 5_000, 3);

    assert_eq!(
        m.rejected(&record, at, tok, &ok_reply(0, 2, output(0))),
        Rejection::UnknownCorrelation {
            launch_id: launch_id(EXEC, 0, 2),
            step: 0,
            attempt: 2,
        }
    );
    assert_eq!(
        m.rejected(&record, at, tok, &ok_reply(1, 1, output(1))),
        Rejection::UnknownCorrelation {
            launch_id: launch_id(EXEC, 1, 1),
            step: 1,
            attempt: 1,
        }
    );
}

#[test]
fn late_success_of_superseded_attempt_of_current_step_is_adopted() {
    let m = Machine::of(three_steps());
    let (waiting, actions) = m.timed_out();
    let (second, _) = m.commit(&waiting, TIMED_OUT_AT + 2_000, 7, &launch_work_of(&actions));
    assert_eq!((second.status, second.attempt), (Status::Running, 2));
    let at = TIMED_OUT_AT + 3_000;
    let late = ok_reply(0, 1, output(0));

    let (next, actions) = m.commit(&second, at, 8, &late);

    let first = launch_id(EXEC, 0, 1);
    assert_eq!(
        (next.status, next.step, next.attempt),
        (Status::Running, 1, 1)
    );
    assert_eq!(next.steps_succeeded_since(&second), vec![0]);
    assert_eq!(
        next.input,
        Payload::new(output(0)),
        "attempt 1's output goes on"
    );
    assert_eq!(next.error, None, "the timeout no longer stands");
    assert_eq!(
        request_of(&actions),
        (1, 1, launch_id(EXEC, 1, 1), at + TIMEOUT_MS[1])
    );

    // The same success delivered again, or attempt 2's reply, answers a step the execution left.
    assert_eq!(m.skipped(&next, at + 1, 9, &late), Skip::Stale);
    assert_ne!(first, launch_id(EXEC, 0, 2));
    assert_eq!(
        m.skipped(&next, at + 2, 9, &ok_reply(0, 2, output(0))),
        Skip::Stale
    );
}

#[test]
fn late_failure_of_superseded_attempt_is_skipped_as_stale() {
    let m = Machine::of(three_steps());
    let second = m.second_attempt();

    for late in [err_reply(0, 1, &retryable()), err_reply(0, 1, &fatal())] {
        assert_eq!(
            m.skipped(&second, TIMED_OUT_AT + 3_000, 8, &late),
            Skip::Stale
        );
    }
    // The current attempt's reply still applies.
    let (next, _) = m.commit(&second, TIMED_OUT_AT + 4_000, 9, &ok_reply(0, 2, output(0)));
    assert_eq!((next.step, next.attempt), (1, 1));
}

#[test]
fn late_reply_of_an_earlier_step_is_skipped_as_stale() {
    let m = Machine::of(three_steps());
    let second = m.second_attempt();
    let (next_step, _) = m.commit(&second, TIMED_OUT_AT + 3_000, 8, &ok_reply(0, 2, output(0)));
    assert_eq!(next_step.step, 1);

    let late = ok_reply(0, 1, json!({"late": true}));
    let skip = m.skipped(&next_step, TIMED_OUT_AT + 4_000, 9, &late);
    assert_eq!(skip, Skip::Stale);
}

/// After a STEP_TIMEOUT the record is WAIT_RETRY with `attempt` still equal to the timed-out attempt:
/// that attempt's late success is adopted as it is once the retry has been launched (above), and the
/// pending retry is fenced.
#[test]
fn late_success_of_timed_out_attempt_is_adopted_while_its_retry_waits() {
    let m = Machine::of(three_steps());
    let (waiting, _) = m.timed_out();
    assert_eq!((waiting.status, waiting.attempt), (Status::WaitRetry, 1));

    let decision = m.decide(&waiting, TIMED_OUT_AT + 100, 7, &ok_reply(0, 1, output(0)));

    match decision {
        Decision::Commit { record, .. } => {
            assert_eq!((record.status, record.step), (Status::Running, 1));
            assert_eq!(record.steps_succeeded_since(&waiting), vec![0]);
            assert_eq!(record.lease, None, "the pending retry is fenced");
        }
        other => panic!("the late success was not adopted: {other:?}"),
    }
}

/// A redrive after a STEP_TIMEOUT leaves the record QUEUED with `attempt` at the timed-out attempt,
/// which never answered: its late success is adopted there too, and the new budget's launch work is
/// fenced.
#[test]
fn late_success_of_timed_out_attempt_is_adopted_after_a_redrive() {
    let m = Machine::of(with_first_retry(RetryPolicy::doubling(1, 2_500, 60_000)));
    let (failed, _) = m.timed_out();
    let again = redrive(failed.version, "gateway fixed");
    let (requeued, actions) = m.commit(&failed, TIMED_OUT_AT + 100, 7, &again);
    assert_eq!((requeued.status, requeued.attempt), (Status::Queued, 1));

    let (adopted, _) = m.commit(&requeued, TIMED_OUT_AT + 200, 8, &ok_reply(0, 1, output(0)));

    assert_eq!((adopted.status, adopted.step), (Status::Running, 1));
    assert_eq!(adopted.steps_succeeded_since(&requeued), vec![0]);
    assert_eq!(adopted.lease, None, "the pending launch is fenced");
    let work = launch_work_of(&actions);
    assert_eq!(
        m.skipped(&adopted, TIMED_OUT_AT + 300, 9, &work),
        Skip::Fenced
    );
}

/// Attempts are 1-based: attempt 0 of a step was never launched and its launch id never saved, so a
/// success for it is not adopted (it would complete the running step of any execution whose id is
/// known, launch ids being derived).
#[test]
fn success_for_never_launched_attempt_zero_is_not_applied() {
    let m = Machine::of(three_steps());
    let record = m.running();

    let decision = m.decide(&record, T0 + 5_000, 3, &ok_reply(0, 0, output(0)));

    assert!(
        !matches!(decision, Decision::Commit { .. }),
        "attempt 0 was never launched, yet its reply was applied: {decision:?}"
    );
}

/// A reply whose launch id already has a receipt is a duplicate (same bytes) or a conflict (other
/// bytes), also once a later attempt replied: launch 1 replied with a failure (receipt recorded, retry
/// scheduled), attempt 2 replied too (the step's latest receipt is attempt 2's, launch 1's is kept
/// among the earlier ones), and a later *success* for launch 1 is still a `Conflict`.
#[test]
fn success_for_a_launch_that_already_failed_is_a_conflict_even_after_a_later_attempt_replied() {
    let m = Machine::of(three_steps());
    let (waiting, actions) = m.failed_once(T0 + 1_000);
    let contradicting = ok_reply(0, 1, output(0));
    assert_eq!(
        m.rejected(&waiting, T0 + 1_500, 4, &contradicting),
        Rejection::Conflict {
            launch_id: launch_id(EXEC, 0, 1),
        }
    );
    let (second, _) = m.commit(&waiting, T0 + 3_000, 4, &launch_work_of(&actions));
    let (waiting_again, _) = m.commit(&second, T0 + 4_000, 5, &err_reply(0, 2, &retryable()));

    let decision = m.decide(&waiting_again, T0 + 5_000, 6, &contradicting);

    assert_eq!(
        decision,
        Decision::Reject(Rejection::Conflict {
            launch_id: launch_id(EXEC, 0, 1),
        })
    );
}
