//! Fan-out steps: one child execution per item, each child's end completing one interaction of the
//! parent's await unit, and a child telling its parent of its end until the parent confirms.

use serde_json::{json, Value};
use stepline::domain::{launch_id, Action, Event, Execution, Skip, Status, Verdict};

use crate::fixtures::*;

/// The batch after its parse step replied with `items`: the record and what the reply launched.
fn fanned_out(m: &Machine, items: Value) -> (Execution, Vec<Action>) {
    m.past_first_step(json!({"items": items, "badRows": []}))
}

#[track_caller]
fn assert_waits_on_items(record: &Execution, actions: &[Action], items: &[&str]) {
    assert_eq!(record.status, Status::WaitingExternal);
    let unit = record.await_unit.as_ref().unwrap();
    let ids: Vec<&str> = unit.interactions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, items);
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
}

#[test]
fn a_fan_out_waits_on_one_interaction_per_item() {
    let m = Machine::of(fan_out_pipeline());
    let (record, actions) = fanned_out(&m, json!([{"row": 1}, {"row": 2}, {"row": 3}]));
    assert_waits_on_items(&record, &actions, &["item-0", "item-1", "item-2"]);

    // Each child's end (success or failure) completes its item; the last resumes the batch.
    let mut current = record.clone();
    for (n, outcome) in [
        json!({"status": "SUCCEEDED"}),
        json!({"status": "FAILED"}),
        json!({"status": "SUCCEEDED"}),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("item-{n}");
        let event = complete(&name, &token_of(&record, &name), Verdict::Approved, outcome);
        let at = PARKED_AT + 10 + n as i64;
        current = m.commit(&current, at, 10 + n as u128, &event).0;
    }
    assert_eq!(current.step, 2, "a failed child is reported, not fatal");
    let output = current.input.value();
    assert_eq!(output["interactions"]["item-1"]["status"], "FAILED");
    assert_eq!(output["badRows"], json!([]), "the step input flows on");
}

#[test]
fn a_fan_out_over_no_items_is_done_at_once() {
    let m = Machine::of(fan_out_pipeline());
    let (record, actions) = fanned_out(&m, json!([]));
    assert_eq!(record.status, Status::Running);
    assert_eq!(record.step, 2, "straight to the summary");
    assert!(matches!(actions[..], [Action::SendRequest { step: 2, .. }]));
}

#[test]
fn launch_work_of_a_fan_out_step_waits_on_one_child_per_item() {
    let m = Machine::of(fan_out_first_pipeline());
    let (record, actions) = m.start_with(json!({"items": [{"row": 1}, {"row": 2}]}));
    let (waiting, actions) = m.launch(&record, LAUNCHED_AT, 2, &actions);
    assert_waits_on_items(&waiting, &actions, &["item-0", "item-1"]);
    assert_eq!(
        waiting.await_unit.as_ref().unwrap().id,
        launch_id(EXEC, 0, 1)
    );
    assert_eq!(waiting.lease, None, "the lease is consumed by the launch");
}

#[test]
fn launch_work_of_a_fan_out_over_no_items_goes_straight_on() {
    let m = Machine::of(fan_out_first_pipeline());
    let (record, actions) = m.start_with(json!({"items": []}));
    let (next, actions) = m.launch(&record, LAUNCHED_AT, 2, &actions);
    assert_eq!((next.status, next.step), (Status::Running, 1));
    assert_eq!(next.steps_succeeded_since(&record), vec![0]);
    assert_eq!(
        request_of(&actions),
        (
            1,
            1,
            launch_id(EXEC, 1, 1),
            LAUNCHED_AT + i64::from(WAIT_SECS) * 1000
        )
    );
}

#[test]
fn a_child_that_ends_tells_its_parent_until_confirmed() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let paid = ok_reply(0, 1, json!({"paid": true}));
    let (done, actions) = m.commit(&running, LAUNCHED_AT + 1, 3, &paid);
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(actions, vec![Action::NotifyParent]);
    assert!(!done.parent_notified);
    let due = done.due_at().expect("due until the parent is told");
    // A crash before the notice went out: the sweeper sends it again.
    let (again, actions) = m.commit(&done, due, 4, &Event::Claim);
    assert_eq!(actions, vec![Action::NotifyParent]);
    let (confirmed, _) = m.commit(&again, due + 1, 5, &Event::ParentNotified);
    assert!(confirmed.parent_notified);
    assert_eq!(confirmed.due_at(), None);
    assert_eq!(
        m.skipped(&confirmed, due + 2, 6, &Event::ParentNotified),
        Skip::Duplicate
    );
}

#[test]
fn a_cancelled_child_tells_its_parent() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let (cancelled, actions) = m.commit(&running, LAUNCHED_AT + 1, 3, &cancel("stop"));
    assert_eq!(cancelled.status, Status::Cancelled);
    let in_flight = Action::NotifyCancel {
        step: 0,
        launch_id: launch_id(EXEC, 0, 1),
    };
    assert_eq!(actions, vec![in_flight, Action::NotifyParent]);
    assert_eq!(cancelled.due_at(), Some(LAUNCHED_AT + 1 + LEASE_MS));
}

/// A claim-checked reference as a step's input (the worker runtime resolves it; the machine does not).
fn reference() -> Value {
    stepline::domain::payload::PayloadRef {
        bucket: "payloads".into(),
        key: format!("payloads/{EXEC}/0ab1"),
        size: 40_000,
        sha256: "0ab1".into(),
    }
    .to_value()
}

#[test]
fn a_fan_out_over_a_claim_checked_input_fails_at_once() {
    let m = Machine::of(fan_out_first_pipeline());
    let (record, actions) = m.start_with(reference());
    let (next, actions) = m.launch(&record, LAUNCHED_AT, 2, &actions);
    assert_eq!(next.status, Status::Failed);
    let error = next.error.as_ref().expect("an error");
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("PAYLOAD_UNRESOLVABLE", false)
    );
    assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
}

#[test]
fn an_await_step_wraps_a_claim_checked_input_beside_its_answers() {
    let m = Machine::of(approval_pipeline(&[]));
    let (waiting, _) = m.past_first_step(reference());
    let token = token_of(&waiting, "approval");
    let approve = complete(
        "approval",
        &token,
        Verdict::Approved,
        json!({"by": "maria"}),
    );
    let (next, _) = m.commit(&waiting, PARKED_AT + 1_000, 5, &approve);
    assert_eq!(
        next.input.value(),
        &json!({"input": reference(), "interactions": {"approval": {"by": "maria"}}}),
        "the reference stays whole; the worker resolves it where it sits"
    );
}
