//! What workers send: replies and heartbeats, proven by their reply token before they are applied.

use super::transitions::{row, Transition, E, RUNNING};
use super::*;

/// The transition rows of workers' replies and heartbeats (see `transitions`).
#[rustfmt::skip]
pub(super) const ROWS: &[Transition] = &[
    row(RUNNING, &[E::Reply], "current launch, ok, steps left", "output kept, next step launched (as above)", &["successful_reply_on_middle_step_records_output_and_launches_next_step", "an_await_step_parks_the_execution_with_unguessable_distinct_tokens", "a_fan_out_resumes_once_when_its_last_child_is_counted", "a_fan_out_over_no_items_is_done_at_once"]),
    row(RUNNING, &[E::Reply], "current launch, ok, last step", "SUCCEEDED with result, off the due index", &["successful_reply_on_last_step_succeeds_execution_with_result_and_no_due_time"]),
    row(RUNNING, &[E::Reply], "current launch, error, retry in ≤ 900 s", "WAIT_RETRY, lease · EnqueueLaunch(delay)", &["retryable_failure_with_budget_left_waits_for_retry_under_new_lease_and_jittered_delay", "retry_delay_follows_the_context_jitter"]),
    row(RUNNING, &[E::Reply], "current launch, error, retry in > 900 s", "WAIT_RETRY, no lease, due at the retry time", &["retry_delay_beyond_sqs_limit_is_left_to_the_due_index_without_lease", "retry_delay_of_exactly_900_seconds_is_still_enqueued_and_one_ms_more_is_not"]),
    row(RUNNING, &[E::Reply], "current launch, error, no retry", "FAILED, dead letter marked · SendDeadLetter", &["retryable_failure_of_last_attempt_in_budget_fails_execution_with_the_error", "non_retryable_failure_fails_execution_at_once", "error_code_listed_non_retryable_in_policy_fails_at_once_although_worker_says_retryable", "terminal_failure_marks_a_dead_letter_in_the_same_commit_and_sends_it"]),
    row(&[Status::Running, Status::WaitRetry, Status::Queued], &[E::Reply], "ok of an unanswered attempt of the step", "adopted: applied like the current one", &["late_success_of_superseded_attempt_of_current_step_is_adopted", "late_success_of_timed_out_attempt_is_adopted_while_its_retry_waits", "late_success_of_timed_out_attempt_is_adopted_after_a_redrive"]),
    row(RUNNING, &[E::Heartbeat], "current launch, extends the deadline", "deadline extended (≤ 12 step timeouts)", &["heartbeat_of_current_attempt_extends_its_deadline_and_changes_nothing_else", "heartbeats_extend_an_attempt_only_up_to_its_bound"]),
];

/// Checks a worker's message against the record: the reply token of the launch it names (when the
/// record has a secret: records created before reply tokens have none) and the pinned release.
pub(super) fn authenticate(
    record: &Execution,
    sender: &Sender,
    event: &Event,
) -> Result<(), Rejection> {
    let launch = match event {
        Event::Reply { launch_id, .. } | Event::Heartbeat { launch_id, .. } => *launch_id,
        _ => return Err(Rejection::Unauthenticated(Uuid::nil())),
    };
    if !record.secret.is_empty()
        && !crate::planted!(AcceptsUnauthenticatedReplies)
        && !same(
            reply_token(&record.secret, launch).as_bytes(),
            crate::seal::split_token(&sender.token).0.as_bytes(),
        )
    {
        return Err(Rejection::Unauthenticated(launch));
    }
    let pinned = (record.pipeline_id.as_str(), record.release_version.as_str());
    let contract_matches =
        record.contract_version.is_empty() || record.contract_version == sender.contract_version;
    if pinned != (sender.pipeline_id.as_str(), sender.release_version.as_str()) || !contract_matches
    {
        return Err(Rejection::IdentityMismatch {
            claimed: format!(
                "{} release {} ({})",
                sender.pipeline_id, sender.release_version, sender.contract_version
            ),
            pinned: format!(
                "{} release {} ({})",
                record.pipeline_id, record.release_version, record.contract_version
            ),
        });
    }
    Ok(())
}

/// A worker's reply to launch `(reply_launch, step, attempt)`.
pub(super) fn reply(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (reply_launch, step, attempt): (Uuid, u32, u32),
    fingerprint: &str,
    outcome: &Outcome,
) -> Decision {
    if attempt == 0
        || reply_launch != launch_id(record.id, step, attempt)
        || def.step(step).is_none()
    {
        return Decision::Reject(Rejection::UnknownCorrelation {
            launch_id: reply_launch,
            step,
            attempt,
        });
    }
    if let Some(receipt) = record.progress(step).and_then(|p| {
        p.receipt
            .iter()
            .chain(&p.earlier_receipts)
            .find(|r| r.launch_id == reply_launch)
    }) {
        return if receipt.fingerprint == fingerprint {
            Decision::Skip(Skip::Duplicate)
        } else {
            Decision::Reject(Rejection::Conflict {
                launch_id: reply_launch,
            })
        };
    }
    let current = is_current(record, reply_launch, step, attempt);
    // A success from an earlier attempt of the current step that never answered (it timed out; its
    // retry is running or waiting) is adopted: the step's outcome is applied once, whichever attempt
    // delivered it. (An attempt that answered has a receipt and was handled above.)
    let adopted = !current
        && matches!(outcome, Outcome::Succeeded(_))
        && record.step == step
        && record.adoptable(attempt)
        && match record.status {
            Status::Running => attempt < record.attempt,
            Status::WaitRetry | Status::Queued => attempt <= record.attempt,
            _ => false,
        };
    if !current && !adopted {
        if step > record.step || (step == record.step && attempt > record.attempt) {
            // A launch id that was never saved cannot have been sent.
            return Decision::Reject(Rejection::UnknownCorrelation {
                launch_id: reply_launch,
                step,
                attempt,
            });
        }
        return Decision::Skip(if record.status.is_terminal() {
            Skip::Terminal
        } else {
            Skip::Stale
        });
    }

    let mut next = bump(record, ctx);
    let receipt = Receipt {
        launch_id: reply_launch,
        fingerprint: fingerprint.to_string(),
    };
    let actions = apply_outcome(&mut next, def, ctx, receipt, outcome.clone());
    commit(next, actions)
}

/// Applies the outcome of the current step (a reply, or a resolved await unit): records it with its
/// receipt, then launches the next step, finishes the execution, or handles the failure.
pub(super) fn apply_outcome(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    receipt: Receipt,
    outcome: Outcome,
) -> Vec<Action> {
    let step = next.step;
    next.lease = None;
    let progress = next
        .progress_mut(step)
        .expect("the current step was launched");
    if let Some(earlier) = progress.receipt.replace(receipt) {
        progress.earlier_receipts.push(earlier);
        let excess = progress
            .earlier_receipts
            .len()
            .saturating_sub(MAX_EARLIER_RECEIPTS);
        progress.earlier_receipts.drain(..excess);
    }
    match outcome {
        Outcome::Succeeded(output) => {
            progress.status = StepStatus::Succeeded;
            progress.error = None;
            next.error = None;
            // The record keeps only what the current step needs: its input (for re-sends, retries and
            // re-drives) and its progress; at the end, the result. DynamoDB bills every write by the
            // whole item's size, so the item stays the same size however long the pipeline is.
            if (step as usize) + 1 == def.steps.len() {
                next.status = Status::Succeeded;
                next.input = Payload::default();
                next.result = Some(Payload::new(output));
                next.wake_at = None;
                next.launch_id = None;
                Vec::new()
            } else {
                next.input = Payload::new(output);
                next.steps.clear();
                next.first_step = step + 1;
                next.step = step + 1;
                next.budget_base = 0;
                launch_attempt(next, def, ctx, 1)
            }
        }
        Outcome::Failed(error) => fail_attempt(next, def, ctx, error),
    }
}

/// Whether a launch is the one the record is waiting for.
pub(super) fn is_current(record: &Execution, launch: Uuid, step: u32, attempt: u32) -> bool {
    record.status == Status::Running
        && record.step == step
        && record.attempt == attempt
        && record.launch_id == Some(launch)
}

/// A running step's heartbeat for launch `(reply_launch, step, attempt)`.
pub(super) fn heartbeat(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (reply_launch, step, attempt): (Uuid, u32, u32),
) -> Decision {
    if !is_current(record, reply_launch, step, attempt) {
        return Decision::Skip(if record.status.is_terminal() {
            Skip::Terminal
        } else {
            Skip::Stale
        });
    }
    let timeout = step_timeout(def, step);
    let extended = ctx.now + timeout;
    let wake = match record.launched_at {
        Some(launched) => extended.min(launched + timeout * MAX_HEARTBEAT_TIMEOUTS),
        None => extended,
    };
    if record.wake_at.is_some_and(|w| wake <= w) {
        return Decision::Skip(Skip::Capped);
    }
    let mut next = bump(record, ctx);
    next.wake_at = Some(wake);
    commit(next, Vec::new())
}

/// A worker's reply whose outcome makes the record too large for the store (`detail`: the store's
/// answer), as the final failure of its step with `ITEM_TOO_LARGE`: same launch, attempt and
/// fingerprint, so a redelivery of the reply is a duplicate. `None` for any other event.
pub fn oversized_reply(event: &Event, detail: &str) -> Option<Event> {
    match event {
        Event::FromWorker { sender, event } => Some(Event::FromWorker {
            sender: sender.clone(),
            event: Box::new(oversized_reply(event, detail)?),
        }),
        Event::Reply { outcome, .. } => {
            let what = match outcome {
                Outcome::Succeeded(output) => {
                    format!("its output ({} bytes)", output.to_string().len())
                }
                Outcome::Failed(error) => {
                    format!("its error {} ({} bytes)", error.code, error.message.len())
                }
            };
            let message = format!("{what} does not fit in the execution record: {detail}");
            let failed = StepError::new(Code::ItemTooLarge.as_str(), message, false);
            let mut event = event.clone();
            if let Event::Reply { outcome, .. } = &mut event {
                *outcome = Outcome::Failed(failed);
            }
            Some(event)
        }
        _ => None,
    }
}

/// What the write that applied a reply to step `step` sent, to send again when that reply comes back
/// (a duplicate of an applied reply is stale: its step is past) while nothing has happened since:
/// that write's response may have been lost, or its send may have failed, and nothing else would
/// send the next step's request before its deadline. "Nothing since": the execution runs the first
/// attempt of the step right after, launched, never answered nor re-sent. The worker deduplicates on
/// the launch id, so a request that did go out costs one duplicate delivery.
pub fn reply_actions(record: &Execution, def: &PipelineDef, step: u32) -> Vec<Action> {
    let Some(launch_id) = record.launch_id else {
        return Vec::new();
    };
    let unanswered = record.progress(record.step).is_some_and(|p| {
        p.status == StepStatus::Launching && p.receipt.is_none() && p.launch_id == launch_id
    });
    let next_first_attempt = record.step == step + 1 && record.attempt == 1 && record.resends == 0;
    let task = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::Task);
    if record.status != Status::Running || !unanswered || !next_first_attempt || !task {
        return Vec::new();
    }
    vec![Action::SendRequest {
        step: record.step,
        attempt: record.attempt,
        launch_id,
        deadline: record.wake_at.unwrap_or(record.updated_at),
    }]
}
