//! Notices the coordinator sent on an execution's behalf (dead letters, await notices) and the completions of await units.

use super::transitions::{row, Transition, E, FAILED, WAITING};
use super::*;

/// The transition rows of notices sent and await units completed (see `transitions`).
#[rustfmt::skip]
pub(super) const ROWS: &[Transition] = &[
    row(FAILED, &[E::DeadLetterSent], "same dead-letter id, unsent", "marked sent, leaves the due index", &["dead_letter_sent_marks_it_sent_and_takes_the_execution_off_the_due_index"]),
    row(WAITING, &[E::AwaitNoticeSent], "same unit, notice unsent", "notice marked sent, due at the deadline", &["an_await_step_parks_the_execution_with_unguessable_distinct_tokens", "an_unconfirmed_notice_is_sent_again_by_the_sweeper"]),
    row(WAITING, &[E::CompleteInteraction], "right token, approved, others pending", "completion noted, still waiting", &["every_interaction_must_be_approved_before_resuming"]),
    row(WAITING, &[E::CompleteInteraction], "right token, approved, the last one", "succeeds, output = input + answers (as ok)", &["approving_resumes_at_the_next_step_with_the_completion_payload"]),
    row(WAITING, &[E::CompleteInteraction], "right token, rejected", "step failed: REJECTED, FAILED", &["rejecting_fails_the_execution_with_the_reason"]),
    row(TERMINAL, &[E::ParentNotified], "has a parent, not yet told", "parent told, leaves the due index", &["a_child_that_ends_tells_its_parent_until_confirmed"]),
];

pub(super) fn dead_letter_sent(record: &Execution, ctx: &Context, id: Uuid) -> Decision {
    match &record.dead_letter {
        Some(mark) if mark.id == id && !mark.sent => {
            let mut next = bump(record, ctx);
            next.dead_letter = Some(DeadLetterMark { id, sent: true });
            if !next.terminal_work_pending() {
                next.wake_at = None;
            }
            commit(next, Vec::new())
        }
        Some(mark) if mark.id == id => Decision::Skip(Skip::Duplicate),
        _ => Decision::Skip(Skip::Stale),
    }
}

pub(super) fn await_notice_sent(record: &Execution, ctx: &Context, unit: Uuid) -> Decision {
    match &record.await_unit {
        Some(u) if u.id == unit && !u.notice_sent && record.status == Status::WaitingExternal => {
            let mut next = bump(record, ctx);
            let deadline = u.deadline;
            if let Some(u) = next.await_unit.as_mut() {
                u.notice_sent = true;
            }
            if next.lease.is_none() {
                next.wake_at = Some(deadline);
            }
            commit(next, Vec::new())
        }
        Some(u) if u.id == unit && u.notice_sent => Decision::Skip(Skip::Duplicate),
        _ => Decision::Skip(Skip::Stale),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn complete_interaction(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    (interaction, named_unit): (&str, Option<Uuid>),
    token: &str,
    verdict: Verdict,
    payload: &Value,
    fingerprint: &str,
) -> Decision {
    // The token is checked before anything else, so that a forger learns nothing and costs nothing
    // (an unauthenticated refusal writes no incident): it must be the named interaction's, or, for
    // an interaction the unit does not have, one of the unit's.
    let Some(unit) = &record.await_unit else {
        return Decision::Reject(Rejection::InvalidToken);
    };
    let holds = |i: &crate::Interaction| same(i.token.as_bytes(), token.as_bytes());
    let Some(index) = unit.interactions.iter().position(|i| i.id == interaction) else {
        return Decision::Reject(if unit.interactions.iter().any(holds) {
            Rejection::UnknownInteraction(interaction.to_string())
        } else {
            Rejection::InvalidToken
        });
    };
    let found = &unit.interactions[index];
    if !holds(found) {
        return Decision::Reject(Rejection::InvalidToken);
    }
    // An answer naming an earlier await unit of the step (sent before a later attempt replaced it),
    // or one for a unit that is over (the execution moved on, failed or was cancelled): nothing waits
    // for it, and nothing is written.
    let over = unit.resolved || record.status != Status::WaitingExternal;
    if named_unit.is_some_and(|named| named != unit.id || over && found.completion.is_none()) {
        return Decision::Skip(Skip::Stale);
    }
    if let Some(done) = &found.completion {
        return if done.fingerprint == fingerprint {
            Decision::Skip(Skip::Duplicate)
        } else {
            Decision::Reject(Rejection::InteractionConflict(interaction.to_string()))
        };
    }
    if unit.resolved || record.status != Status::WaitingExternal {
        return Decision::Reject(Rejection::NotWaiting(record.status));
    }
    if ctx.now >= unit.deadline {
        return Decision::Reject(Rejection::AwaitExpired);
    }
    let mut next = bump(record, ctx);
    let unit = next.await_unit.as_mut().expect("checked above");
    unit.interactions[index].completion = Some(InteractionCompletion {
        verdict,
        payload: Payload::new(payload.clone()),
        fingerprint: fingerprint.to_string(),
        at: ctx.now,
    });
    let outcome = match verdict {
        Verdict::Rejected => {
            let reason = payload
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or("rejected");
            Outcome::Failed(StepError::new(
                Code::Rejected.as_str(),
                format!("{interaction}: {reason}"),
                false,
            ))
        }
        Verdict::Approved if unit.interactions.iter().all(|i| i.completion.is_some()) => {
            let answers: serde_json::Map<String, Value> = unit
                .interactions
                .iter()
                .filter_map(|i| {
                    Some((i.id.clone(), i.completion.as_ref()?.payload.value().clone()))
                })
                .collect();
            // The step's input flows on, with the answers beside it.
            Outcome::Succeeded(with_answers(record, record.step, answers))
        }
        // Waiting for the others.
        Verdict::Approved => return commit(next, Vec::new()),
    };
    unit.resolved = true;
    // The answers went on in the outcome (the step's output, or the rejection's error): the unit keeps
    // only their fingerprints, all that a repeated completion is checked against.
    for interaction in &mut unit.interactions {
        if let Some(done) = interaction.completion.as_mut() {
            done.payload = Payload::default();
        }
    }
    let receipt = Receipt {
        launch_id: unit.id,
        fingerprint: fingerprint.to_string(),
    };
    let actions = apply_outcome(&mut next, def, ctx, receipt, outcome);
    commit(next, actions)
}

/// When to check that an await notice went out: soon, but never after the deadline.
pub(super) fn notice_check(next: &Execution, ctx: &Context) -> Timestamp {
    let deadline = next
        .await_unit
        .as_ref()
        .map_or(Timestamp::from_millis(i64::MAX), |u| u.deadline);
    (ctx.now + ctx.lease).min(deadline)
}

/// The output of an await or fan-out step: its input, with the answers beside it (an object input
/// gets an `interactions` field; any other input, a claim-checked one included, is wrapped).
pub(super) fn with_answers(
    record: &Execution,
    step: u32,
    answers: serde_json::Map<String, Value>,
) -> Value {
    match record.step_input(step).map(|p| p.value().clone()) {
        Some(Value::Object(mut fields)) if !fields.contains_key(REF_FIELD) => {
            fields.insert("interactions".into(), Value::Object(answers));
            Value::Object(fields)
        }
        other => json!({"input": other, "interactions": answers}),
    }
}
