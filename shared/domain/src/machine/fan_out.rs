//! Fan-out steps: sizing, launching children, counting their ends and settling the step.

use super::transitions::{row, Transition, E, WAITING};
use super::*;

/// The transition rows of fan-out steps (see `transitions`).
#[rustfmt::skip]
pub(super) const ROWS: &[Transition] = &[
    row(WAITING, &[E::FanOutSized], "current unit to size, n > 0 items", "unit sized: n children, its tolerance", &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"]),
    row(WAITING, &[E::FanOutSized], "current unit to size, no items", "step done: next step launched, or SUCCEEDED", &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"]),
    row(WAITING, &[E::FanOutSized], "current unit to size, items unreadable", "step failed with the reading's error", &["a_fan_out_over_items_in_an_object_is_sized_before_its_children_start"]),
    row(WAITING, &[E::FanOutSettled], "current unit, all counted, failures tolerated", "succeeds, output = input + results (as ok)", &["a_fan_out_resumes_once_when_its_last_child_is_counted"]),
    row(WAITING, &[E::FanOutSettled], "current unit, failures beyond tolerance", "step failed: FAN_OUT_FAILED · CancelChildren", &["a_fan_out_fails_when_more_children_fail_than_it_tolerates"]),
];

/// Launches a fan-out step (attempt launch id `id`): an await unit of one child per item, started
/// after the commit (`SendAwaitNotice`, carried out as the children's starts) and counted in the
/// ledger, not in the record. Each child's resume token derives from the execution's secret, the step
/// and the item, the same for every attempt of the step: a child started by an earlier attempt is the
/// same child, and answers this attempt (see `Event::Rejoin`).
pub(super) fn launch_fan_out(
    next: &mut Execution,
    def: &PipelineDef,
    ctx: &Context,
    id: Uuid,
    deadline: Timestamp,
) -> Vec<Action> {
    // Items held in an object are counted by the coordinator before any child starts (`FanOutSized`).
    let in_an_object = next.step_input(next.step).is_some_and(items_in_an_object);
    let step = next.step;
    let fan_out = match in_an_object {
        true => None,
        false => {
            let items = fan_out_items(next, step) as u32;
            if items == 0 {
                // Nothing to wait for: the step is done at once.
                let receipt = Receipt {
                    launch_id: id,
                    fingerprint: "no-items".into(),
                };
                let output = with_results(next, step, &Tally::default(), Value::Array(Vec::new()));
                return apply_outcome(next, def, ctx, receipt, Outcome::Succeeded(output));
            }
            Some(FanOutUnit::of(def.step(step), items))
        }
    };
    next.status = Status::WaitingExternal;
    next.await_unit = Some(AwaitUnit {
        id,
        step,
        deadline,
        interactions: Vec::new(),
        notice_sent: false,
        resolved: false,
        fan_out,
    });
    next.wake_at = Some(notice_check(next, ctx));
    vec![Action::SendAwaitNotice { unit: id }]
}

/// Whether a fan-out step's input holds its items in an object: claim-checked, or `itemsFrom`.
pub fn items_in_an_object(input: &Payload) -> bool {
    input.reference().is_some() || input.value().get("itemsFrom").is_some()
}

/// Sizes fan-out `unit` whose items are held in an object: `items` children (none: the step is done
/// at once), or the step fails when they cannot be read.
pub(super) fn size_fan_out(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    unit: Uuid,
    items: &Result<u32, StepError>,
) -> Decision {
    let is_fan_out = def
        .step(record.step)
        .is_some_and(|s| s.kind == StepKind::FanOut);
    let Some(current) = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit && is_fan_out)
    else {
        return Decision::Skip(Skip::Stale);
    };
    if current.resolved || record.status != Status::WaitingExternal {
        return Decision::Skip(Skip::Stale);
    }
    if current.fan_out.is_some() {
        return Decision::Skip(Skip::Duplicate);
    }
    let mut next = bump(record, ctx);
    let step = record.step;
    let items = match items {
        Ok(items) => *items,
        Err(error) => {
            if let Some(u) = next.await_unit.as_mut() {
                u.resolved = true;
            }
            let actions = fail_attempt(&mut next, def, ctx, error.clone());
            return commit(next, actions);
        }
    };
    if items == 0 {
        if let Some(u) = next.await_unit.as_mut() {
            u.resolved = true;
        }
        let receipt = Receipt {
            launch_id: unit,
            fingerprint: "no-items".into(),
        };
        let output = with_results(record, step, &Tally::default(), Value::Array(Vec::new()));
        let actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Succeeded(output));
        return commit(next, actions);
    }
    if let Some(u) = next.await_unit.as_mut() {
        u.fan_out = Some(FanOutUnit::of(def.step(step), items));
    }
    commit(next, Vec::new())
}

/// What a fan-out child's notice `(unit, step, item, token)` is to `record`, its parent: the fan-out
/// to count it in, or the decision that nothing is counted (a stale notice: the attempt it answers is
/// over; a refused one: the token is not the parent's for that child).
pub fn child_notice(
    record: &Execution,
    (unit, step, item): (Uuid, u32, u32),
    token: &str,
) -> Result<FanOutUnit, Decision> {
    if record.secret.is_empty() {
        return Err(Decision::Reject(Rejection::InvalidToken));
    }
    let expected = fan_out_token(&record.secret, record.id, step, &item_name(item));
    if !same(expected.as_bytes(), token.as_bytes()) {
        return Err(Decision::Reject(Rejection::InvalidToken));
    }
    let current = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit && u.step == step);
    match current.and_then(|u| Some((u, u.fan_out?))) {
        Some((u, _)) if u.resolved || record.status != Status::WaitingExternal => {
            Err(Decision::Skip(Skip::Stale))
        }
        Some((_, fan_out)) if item < fan_out.items => Ok(fan_out),
        Some(_) => Err(Decision::Reject(Rejection::UnknownInteraction(item_name(
            item,
        )))),
        None => Err(Decision::Skip(Skip::Stale)),
    }
}

/// Settles fan-out `unit` on the ledger's `tally`: the step succeeds with every child's end in
/// `results`, or fails with `FAN_OUT_FAILED` when more children failed than it tolerates (the
/// children still running are then cancelled).
pub(super) fn settle_fan_out(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    unit: Uuid,
    tally: &Tally,
    results: &Value,
) -> Decision {
    let Some((current, fan_out)) = record
        .await_unit
        .as_ref()
        .filter(|u| u.id == unit)
        .and_then(|u| Some((u, u.fan_out?)))
    else {
        return Decision::Skip(Skip::Stale);
    };
    if current.resolved {
        return Decision::Skip(Skip::Duplicate);
    }
    if record.status != Status::WaitingExternal {
        return Decision::Skip(Skip::Stale);
    }
    if !fan_out.settled_by(tally) {
        return Decision::Skip(Skip::NotDue);
    }
    let mut next = bump(record, ctx);
    if let Some(u) = next.await_unit.as_mut() {
        u.resolved = true;
    }
    let receipt = Receipt {
        launch_id: unit,
        fingerprint: format!("fan-out/{}/{}", tally.succeeded, tally.failed),
    };
    if tally.failed > fan_out.tolerated {
        let error = StepError::new(
            Code::FanOutFailed.as_str(),
            format!(
                "{} of {} children failed, {} tolerated",
                tally.failed, fan_out.items, fan_out.tolerated
            ),
            false,
        );
        let mut actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Failed(error));
        if tally.counted() < fan_out.items {
            actions.push(Action::CancelChildren { unit });
        }
        return commit(next, actions);
    }
    let step = record.step;
    let output = with_results(record, step, tally, results.clone());
    let actions = apply_outcome(&mut next, def, ctx, receipt, Outcome::Succeeded(output));
    commit(next, actions)
}

/// The output of a fan-out step: its input, with the children's ends beside it (`results`, in item
/// order) and their counts (`fanOut`).
pub(super) fn with_results(record: &Execution, step: u32, tally: &Tally, results: Value) -> Value {
    let counts =
        json!({"items": tally.counted(), "succeeded": tally.succeeded, "failed": tally.failed});
    match record.step_input(step).map(|p| p.value().clone()) {
        Some(Value::Object(mut fields)) if !fields.contains_key(REF_FIELD) => {
            fields.insert("results".into(), results);
            fields.insert("fanOut".into(), counts);
            Value::Object(fields)
        }
        other => json!({"input": other, "results": results, "fanOut": counts}),
    }
}

/// The number of items a fan-out step's input holds (`items`: an array).
pub fn fan_out_items(record: &Execution, step: u32) -> usize {
    record
        .step_input(step)
        .and_then(|p| p.value().get("items"))
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}
