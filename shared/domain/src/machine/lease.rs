//! The sweeper's claims and the launch function's work: leases, attempts, retries and their deadlines.

use super::transitions::{row, Transition, E, QUEUED_OR_RETRY, RUNNING, WAITING};
use super::*;

/// The transition rows of claims and launch work (see `transitions`).
#[rustfmt::skip]
pub(super) const ROWS: &[Transition] = &[
    row(LIVE, &[E::Claim], "due, lease absent or expired", "lease (gen+1) · EnqueueLaunch", &["claim_of_due_unleased_execution_takes_lease_with_next_generation_and_enqueues_launch", "claim_after_lease_expiry_takes_over_with_next_generation_and_fences_old_launch_work"]),
    row(TERMINAL, &[E::Claim], "due: dead letter/parent notice unsent", "SendDeadLetter/NotifyParent again", &["claim_of_failed_execution_whose_dead_letter_is_unsent_sends_it_again", "a_child_that_ends_tells_its_parent_until_confirmed"]),
    row(ANY_STATUS, &[E::Claim], "only the outbox due, tries left", "PublishEvents again, next check backed off", &["an_outbox_that_is_never_confirmed_is_retried_less_often_then_dropped_and_noted"]),
    row(ANY_STATUS, &[E::Claim], "only the outbox due, none left/events off", "outbox dropped, EVENTS_DROPPED incident", &["an_outbox_that_is_never_confirmed_is_retried_less_often_then_dropped_and_noted", "an_outbox_is_dropped_at_once_when_lifecycle_events_are_switched_off"]),
    row(QUEUED_OR_RETRY, &[E::LaunchWork], "lease generation+token match, task", "RUNNING, step `launching` · SendRequest", &["launch_work_starts_first_attempt_of_queued_execution_with_deterministic_launch_id", "launch_work_on_wait_retry_starts_next_attempt_with_new_launch_id"]),
    row(QUEUED_OR_RETRY, &[E::LaunchWork], "lease match, await step", "WAITING_EXTERNAL, await unit · SendAwaitNotice", &["launch_work_of_an_await_step_parks_the_execution_on_an_await_unit"]),
    row(QUEUED_OR_RETRY, &[E::LaunchWork], "lease match, fan-out over n > 0 items", "WAITING_EXTERNAL, fan-out unit of n · SendAwaitNotice", &["launch_work_of_a_fan_out_step_waits_on_one_child_per_item"]),
    row(QUEUED_OR_RETRY, &[E::LaunchWork], "lease match, fan-out over no items", "step done: next step launched, or SUCCEEDED", &["launch_work_of_a_fan_out_over_no_items_goes_straight_on"]),
    row(QUEUED_OR_RETRY, &[E::LaunchWork], "lease match, fan-out, items in an object", "WAITING_EXTERNAL, unit to size · SendAwaitNotice", &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"]),
    row(RUNNING, &[E::LaunchWork], "lease match, deadline passed, no resend", "same launch re-sent · SendRequest", &["launch_work_on_running_execution_past_deadline_resends_same_launch_id_once"]),
    row(RUNNING, &[E::LaunchWork], "lease match, deadline passed, resent", "attempt failed: STEP_TIMEOUT, retryable", &["launch_work_on_resent_attempt_past_deadline_times_it_out_and_schedules_retry", "step_timeout_on_last_attempt_of_budget_fails_execution"]),
    row(&[Status::Running, Status::WaitingExternal], &[E::LaunchWork], "lease match, nothing due under it", "lease released", &["launch_work_on_running_execution_before_deadline_only_releases_lease"]),
    row(WAITING, &[E::LaunchWork], "lease match, due, before the deadline", "SendAwaitNotice again, checked a lease later", &["an_unconfirmed_notice_is_sent_again_by_the_sweeper"]),
    row(WAITING, &[E::LaunchWork], "lease match, await deadline passed", "step failed: AWAIT_TIMEOUT, FAILED", &["the_deadline_fails_the_step_with_await_timeout_through_the_sweeper"]),
];

pub(super) fn claim(record: &Execution, ctx: &Context) -> Decision {
    // Only the outbox is due: publish it (again) and look back later, less often each time. An
    // outbox that cannot be published (events switched off, or a bus that keeps failing) is not
    // rewritten forever: it is dropped, and the drop noted on the record and counted.
    let outbox_due = record.publish_by.is_some_and(|p| p <= ctx.now) && !record.events.is_empty();
    if outbox_due && record.work_due_at().is_none_or(|w| w > ctx.now) {
        let mut next = bump(record, ctx);
        if !ctx.lifecycle || record.publish_attempts + 1 >= MAX_PUBLISH_ATTEMPTS {
            let reason = if ctx.lifecycle {
                format!("not confirmed after {MAX_PUBLISH_ATTEMPTS} attempts")
            } else {
                "lifecycle events are switched off".to_string()
            };
            let detail = format!("{} lifecycle events dropped: {reason}", next.events.len());
            note_incident(&mut next, ctx, EVENTS_DROPPED, &detail);
            next.events.clear();
            next.publish_by = None;
            next.publish_attempts = 0;
            return commit(next, Vec::new());
        }
        next.publish_attempts += 1;
        next.publish_by = Some(ctx.now + ctx.lease * (1_u32 << next.publish_attempts.min(6)));
        return commit(next, vec![Action::PublishEvents]);
    }
    match record.work_due_at() {
        Some(due) if due <= ctx.now => {}
        _ if record.status.is_terminal() => return Decision::Skip(Skip::Terminal),
        _ => return rekeyed(record, ctx).unwrap_or(Decision::Skip(Skip::NotDue)),
    }
    if record.status.is_terminal() {
        // Due only while its dead-letter envelope or its parent's notice is unsent: send them (again)
        // and look back later.
        let mut actions = Vec::new();
        if let Some(mark) = record.dead_letter.as_ref().filter(|d| !d.sent) {
            actions.push(Action::SendDeadLetter { id: mark.id });
        }
        if record.parent.is_some() && !record.parent_notified {
            actions.push(Action::NotifyParent);
        }
        if actions.is_empty() {
            return Decision::Skip(Skip::Terminal);
        }
        let mut next = bump(record, ctx);
        next.wake_at = Some(ctx.now + ctx.lease);
        return commit(next, actions);
    }
    // (A held lease makes the record due at its expiry, so a due record's lease has expired.)
    let next = bump(record, ctx);
    commit_leased(next, ctx)
}

pub(super) fn launch_work(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    generation: u64,
    token: Uuid,
) -> Decision {
    if record.status.is_terminal() {
        return Decision::Skip(Skip::Terminal);
    }
    let holds = matches!(&record.lease, Some(lease) if lease.token == token)
        && record.generation == generation
        || crate::planted!(LaunchIgnoresFencing);
    if !holds {
        return Decision::Skip(Skip::Fenced);
    }
    let mut next = bump(record, ctx);
    next.lease = None;
    match record.status {
        Status::Queued | Status::WaitRetry => {
            let actions = launch_attempt(&mut next, def, ctx, record.attempt + 1);
            commit(next, actions)
        }
        Status::WaitingExternal if record.wake_at.is_some_and(|w| w <= ctx.now) => {
            let Some(unit) = next.await_unit.as_mut() else {
                return commit(next, Vec::new());
            };
            if ctx.now >= unit.deadline {
                let error = StepError::new(
                    Code::AwaitTimeout.as_str(),
                    "no completion before the await deadline",
                    false,
                );
                unit.resolved = true;
                let actions = fail_attempt(&mut next, def, ctx, error);
                commit(next, actions)
            } else {
                // The announcement was not confirmed sent: send it again.
                let unit = unit.id;
                next.wake_at = Some(notice_check(&next, ctx));
                commit(next, vec![Action::SendAwaitNotice { unit }])
            }
        }
        Status::Running if record.wake_at.is_some_and(|w| w <= ctx.now) => {
            if record.resends < MAX_RESENDS {
                next.resends += 1;
                let deadline = ctx.now + step_timeout(def, record.step);
                next.wake_at = Some(deadline);
                let action = Action::SendRequest {
                    step: record.step,
                    attempt: record.attempt,
                    launch_id: launch_id(record.id, record.step, record.attempt),
                    deadline,
                };
                commit(next, vec![action])
            } else {
                let error = StepError::new(
                    Code::StepTimeout.as_str(),
                    format!(
                        "no reply within {} s (request sent {} times)",
                        step_timeout(def, record.step).as_secs(),
                        record.resends + 1
                    ),
                    true,
                );
                let actions = fail_attempt(&mut next, def, ctx, error);
                commit(next, actions)
            }
        }
        // Nothing to do under this lease (the execution moved on meanwhile): release it.
        _ => commit(next, Vec::new()),
    }
}

/// Starts attempt `attempt` of the record's current step: saved as `launching` with its deterministic
/// launch id, to be sent after the commit.
pub(super) fn launch_attempt(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    attempt: u32,
) -> Vec<Action> {
    let step = next.step;
    let id = launch_id(next.id, step, attempt);
    let deadline = ctx.now + step_timeout(def, step);
    next.status = Status::Running;
    next.attempt = attempt;
    next.launch_id = Some(id);
    next.resends = 0;
    next.wake_at = Some(deadline);
    next.launched_at = Some(ctx.now);
    let progress = StepProgress {
        status: StepStatus::Launching,
        launch_id: id,
        receipt: None,
        earlier_receipts: Vec::new(),
        error: None,
    };
    match next.progress_mut(step) {
        Some(existing) => {
            existing.status = StepStatus::Launching;
            existing.launch_id = id;
        }
        None => next.steps.push(progress),
    }
    let Some(step_def) = def.step(step).filter(|s| s.kind != StepKind::Task) else {
        return vec![Action::SendRequest {
            step,
            attempt,
            launch_id: id,
            deadline,
        }];
    };
    if step_def.kind == StepKind::FanOut {
        return launch_fan_out(next, def, ctx, id, deadline);
    }
    // An await step parks the execution on an await unit; its tokens derive from this decision's
    // random token, so they cannot be guessed from anything stored elsewhere.
    let interactions = step_def
        .interaction_names()
        .into_iter()
        .map(|name| Interaction {
            idempotency_key: format!("{id}/{name}"),
            token: Uuid::new_v5(&ctx.token, name.as_bytes())
                .simple()
                .to_string(),
            id: name,
            completion: None,
        })
        .collect();
    next.status = Status::WaitingExternal;
    next.await_unit = Some(AwaitUnit {
        id,
        step,
        deadline,
        interactions,
        notice_sent: false,
        resolved: false,
        fan_out: None,
    });
    next.wake_at = Some(notice_check(next, ctx));
    vec![Action::SendAwaitNotice { unit: id }]
}

/// Records a failed attempt and either schedules the retry or fails the execution.
pub(super) fn fail_attempt(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    mut error: StepError,
) -> Vec<Action> {
    let policy = def
        .step(next.step)
        .map(|s| s.retry.clone())
        .unwrap_or_default();
    error.retryable &= !policy.non_retryable.contains(&error.code);
    let step = next.step;
    if let Some(progress) = next.progress_mut(step) {
        progress.status = StepStatus::Failed;
        progress.error = Some(error.clone());
    }
    next.launch_id = None;
    next.lease = None;
    let used = next.attempts_in_budget();
    if error.retryable && used < policy.max_attempts {
        let delay = Duration::from_millis(policy.delay_ms(used, ctx.jitter));
        next.status = Status::WaitRetry;
        next.error = Some(error);
        next.wake_at = Some(ctx.now + delay);
        if whole_seconds(delay) <= MAX_DELAY_SECONDS {
            vec![take_lease(next, ctx, delay)]
        } else {
            Vec::new()
        }
    } else {
        next.status = Status::Failed;
        next.error = Some(error);
        let id = dead_letter_id(next.id, next.version);
        next.dead_letter = Some(DeadLetterMark { id, sent: false });
        // Due again if the envelope is not marked sent by then (a crash between commit and send).
        next.wake_at = Some(ctx.now + ctx.lease);
        vec![Action::SendDeadLetter { id }]
    }
}

/// Id of the dead-letter envelope of the failure committed at `version`.
pub(super) fn dead_letter_id(execution: Uuid, version: u64) -> Uuid {
    Uuid::new_v5(&execution, format!("dead-letter/{version}").as_bytes())
}

/// Takes a fresh lease (new generation) covering `delay` plus the lease time, and returns the launch
/// work that carries it.
pub(super) fn take_lease(next: &mut Execution, ctx: &Context, delay: Duration) -> Action {
    next.generation += 1;
    next.lease = Some(Lease {
        owner: ctx.owner.clone(),
        token: ctx.token,
        expires_at: ctx.now + delay + ctx.lease,
    });
    Action::EnqueueLaunch {
        generation: next.generation,
        token: ctx.token,
        delay_secs: u32::try_from(whole_seconds(delay)).unwrap_or(u32::MAX),
    }
}

/// Commits `next` with a fresh lease taken now, and the launch work that carries it.
pub(super) fn commit_leased(mut next: Execution, ctx: &Context) -> Decision {
    let action = take_lease(&mut next, ctx, Duration::ZERO);
    commit(next, vec![action])
}

pub(super) fn step_timeout(def: &PipelineDef, step: u32) -> Duration {
    Duration::from_secs(def.step(step).map_or(300, |s| u64::from(s.timeout_secs)))
}

/// A span in whole seconds, rounded up (as SQS delays count).
fn whole_seconds(span: Duration) -> u64 {
    span.as_millis().div_ceil(1000) as u64
}
