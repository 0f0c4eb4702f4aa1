//! What operators and parents ask of an execution: re-drive, reopen, rejoin, cancel.

use super::transitions::{row, Transition, E, FAILED, NOT_SUCCEEDED, SUCCEEDED};
use super::*;

/// The transition rows of operators' and parents' requests (see `transitions`).
#[rustfmt::skip]
pub(super) const ROWS: &[Transition] = &[
    row(FAILED, &[E::Redrive], "expected version", "QUEUED, new budget, lease · EnqueueLaunch", &["redrive_of_failed_execution_requeues_it_with_new_budget_audit_note_and_lease", "redrive_onto_another_release_moves_the_pin_and_notes_both_releases"]),
    row(LIVE, &[E::Cancel], "", "CANCELLED · NotifyCancel / CancelChildren", &["cancel_of_running_execution_cancels_it_and_clears_due_time", "cancel_of_waiting_retry_drops_its_lease_and_its_pending_launch_work_is_skipped", "cancel_of_queued_execution_notifies_no_worker", "a_cancelled_execution_takes_no_completion", "a_cancelled_fan_out_cancels_the_children_still_running"]),
    row(LIVE, &[E::CancelFromParent], "the parent's token", "CANCELLED · NotifyCancel if RUNNING", &["a_cancelled_fan_out_cancels_the_children_still_running"]),
    row(NOT_SUCCEEDED, &[E::Rejoin], "parent's token, another attempt", "QUEUED, new budget, lease · EnqueueLaunch", &["a_failed_child_started_again_by_its_parent_runs_again", "a_cancelled_child_started_again_by_its_parent_runs_again"]),
    row(SUCCEEDED, &[E::Rejoin], "parent's token, another attempt", "parent told again · NotifyParent", &["an_ended_child_started_again_by_its_parent_tells_it_again_without_running"]),
    row(LIVE, &[E::Rejoin], "parent's token, another attempt", "answers that attempt when it ends", &["a_running_child_started_again_answers_the_new_attempt"]),
];

pub(super) fn redrive(
    record: &Execution,
    ctx: &Context,
    expected_version: u64,
    reason: &str,
    onto: Option<&Pin>,
) -> Decision {
    if !matches!(record.status, Status::Failed | Status::Dlq) {
        return Decision::Reject(Rejection::NotRedrivable(record.status));
    }
    if record.version != expected_version {
        return Decision::Reject(Rejection::VersionMismatch {
            expected: expected_version,
            actual: record.version,
        });
    }
    let onto = onto.filter(|pin| pin.release_version != record.release_version);
    reopen(record, ctx, reason, onto)
}

/// A FAILED or DLQ execution queued again: a new attempt of its step with a new retry budget, under
/// the same pinned release or (`onto`) moved onto another, noted with `reason`.
pub(super) fn reopen(
    record: &Execution,
    ctx: &Context,
    reason: &str,
    onto: Option<&Pin>,
) -> Decision {
    let mut next = bump(record, ctx);
    if let Some(pin) = onto {
        next.release_version = pin.release_version.clone();
        next.contract_version = pin.contract_version.clone();
    }
    next.redrives.push(RedriveNote {
        at: ctx.now,
        reason: truncated(reason, MAX_INCIDENT_DETAIL),
        from_status: record.status,
        from_version: record.version,
        from_release: onto.map(|_| record.release_version.clone()),
        to_release: onto.map(|pin| pin.release_version.clone()),
    });
    let excess = next.redrives.len().saturating_sub(MAX_REDRIVE_NOTES);
    next.redrives.drain(..excess);
    next.status = Status::Queued;
    next.budget_base = record.attempt;
    next.error = None;
    next.dead_letter = None;
    next.wake_at = Some(ctx.now);
    commit_leased(next, ctx)
}

/// A fan-out child started again by its parent's next attempt of the step (`unit`): a child that
/// failed or was cancelled runs again; one that succeeded tells the parent again without running; a
/// running one answers the new attempt when it ends.
pub(super) fn rejoin(
    record: &Execution,
    ctx: &Context,
    token: &str,
    unit: Option<Uuid>,
) -> Decision {
    let Some(parent) = &record.parent else {
        return Decision::Reject(Rejection::InvalidToken);
    };
    if !same(parent.token.as_bytes(), token.as_bytes()) {
        return Decision::Reject(Rejection::InvalidToken);
    }
    if parent.unit == unit {
        // Started by this attempt already (a redelivered start).
        return Decision::Skip(Skip::Duplicate);
    }
    let decision = match record.status {
        // Every child that did not succeed runs again: a failed one, and one cancelled (its parent's
        // fan-out failed beyond its tolerance, or the parent was cancelled, before it ended).
        Status::Failed | Status::Dlq | Status::Cancelled => {
            reopen(record, ctx, "the parent ran its fan-out again", None)
        }
        status if status.is_terminal() => {
            let mut next = bump(record, ctx);
            next.parent_notified = false;
            next.wake_at = Some(ctx.now + ctx.lease);
            commit(next, vec![Action::NotifyParent])
        }
        _ => commit(bump(record, ctx), Vec::new()),
    };
    match decision {
        Decision::Commit {
            record: mut next,
            actions,
        } => {
            if let Some(link) = next.parent.as_mut() {
                link.unit = unit;
            }
            Decision::Commit {
                record: next,
                actions,
            }
        }
        other => other,
    }
}

pub(super) fn cancel(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    reason: &str,
) -> Decision {
    if record.status.is_terminal() {
        return Decision::Reject(Rejection::AlreadyTerminal(record.status));
    }
    let mut next = bump(record, ctx);
    next.status = Status::Cancelled;
    next.lease = None;
    next.wake_at = None;
    next.launch_id = None;
    next.error = Some(StepError::new(Code::Cancelled.as_str(), reason, false));
    let fanned_out = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::FanOut);
    let actions = match (record.status, record.launch_id, &record.await_unit) {
        (Status::Running, Some(launch_id), _) => vec![Action::NotifyCancel {
            step: record.step,
            launch_id,
        }],
        // The children still running are cancelled too (each by a message naming its token).
        (Status::WaitingExternal, _, Some(unit)) if fanned_out && !unit.resolved => {
            vec![Action::CancelChildren { unit: unit.id }]
        }
        _ => Vec::new(),
    };
    commit(next, actions)
}
