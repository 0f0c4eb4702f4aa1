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

/// The parent's await unit of a later attempt of its fan-out step.
const NEXT_UNIT: uuid::Uuid = uuid::Uuid::from_u128(0x5eed);

#[test]
fn a_failed_child_started_again_by_its_parent_runs_again() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let at = LAUNCHED_AT + 1;
    let (failed, _) = m.commit(&running, at, 3, &err_reply(0, 1, &fatal()));
    assert_eq!(failed.status, Status::Failed);
    let (told, _) = m.commit(&failed, at + 1, 4, &Event::ParentNotified);

    // Someone without the parent's token cannot make it run again.
    let forged = Event::Rejoin {
        token: "guessed".into(),
        unit: Some(NEXT_UNIT),
    };
    assert_eq!(
        m.rejected(&told, at + 2, 5, &forged),
        stepline::domain::Rejection::InvalidToken
    );

    let rejoin = Event::Rejoin {
        token: "t0".into(),
        unit: Some(NEXT_UNIT),
    };
    let (queued, actions) = m.commit(&told, at + 2, 5, &rejoin);
    assert_eq!(queued.status, Status::Queued);
    assert_eq!(queued.budget_base, failed.attempt, "a new retry budget");
    assert_eq!(
        (queued.error.as_ref(), queued.dead_letter.as_ref()),
        (None, None)
    );
    assert!(matches!(actions[..], [Action::EnqueueLaunch { .. }]));
    assert_eq!(queued.parent.as_ref().unwrap().unit, Some(NEXT_UNIT));
    assert_eq!(
        m.skipped(&queued, at + 2, 5, &rejoin),
        Skip::Duplicate,
        "the same start redelivered"
    );
    // Its next end tells the parent (again).
    let (relaunched, actions) = m.launch(&queued, at + 3, 6, &actions);
    assert_eq!(request_of(&actions).1, 2, "attempt 2");
    let (done, actions) = m.commit(
        &relaunched,
        at + 4,
        7,
        &ok_reply(0, 2, json!({"paid": true})),
    );
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(actions, vec![Action::NotifyParent]);
}

#[test]
fn a_running_child_started_again_answers_the_new_attempt() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let rejoin = Event::Rejoin {
        token: "t0".into(),
        unit: Some(NEXT_UNIT),
    };
    let (moved, actions) = m.commit(&running, LAUNCHED_AT + 1, 3, &rejoin);
    assert!(actions.is_empty(), "it runs on");
    assert_eq!(moved.parent.as_ref().unwrap().unit, Some(NEXT_UNIT));
    // The same start again (redelivered) changes nothing.
    assert_eq!(
        m.skipped(&moved, LAUNCHED_AT + 2, 4, &rejoin),
        Skip::Duplicate
    );
    // Its end answers the new attempt.
    let paid = ok_reply(0, 1, json!({"paid": true}));
    let (done, actions) = m.commit(&moved, LAUNCHED_AT + 3, 5, &paid);
    assert_eq!(actions, vec![Action::NotifyParent]);
    assert_eq!(done.parent.as_ref().unwrap().unit, Some(NEXT_UNIT));
}

#[test]
fn an_ended_child_started_again_by_its_parent_tells_it_again_without_running() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let paid = ok_reply(0, 1, json!({"paid": true}));
    let (done, _) = m.commit(&running, LAUNCHED_AT + 1, 3, &paid);
    let (told, _) = m.commit(&done, LAUNCHED_AT + 2, 4, &Event::ParentNotified);
    assert_eq!(told.due_at(), None);

    let rejoin = Event::Rejoin {
        token: "t0".into(),
        unit: Some(NEXT_UNIT),
    };
    let (again, actions) = m.commit(&told, LAUNCHED_AT + 3, 5, &rejoin);
    assert_eq!(actions, vec![Action::NotifyParent], "told again, not run");
    assert_eq!(again.status, Status::Succeeded);
    assert_eq!(again.attempt, told.attempt);
    assert_eq!(again.parent.as_ref().unwrap().unit, Some(NEXT_UNIT));
    assert!(!again.parent_notified);
    assert!(
        again.due_at().is_some(),
        "re-sent by the sweeper until confirmed"
    );
}

#[test]
fn a_fan_out_step_run_again_gives_its_children_the_same_tokens() {
    let m = Machine::of(fan_out_pipeline());
    let (waiting, _) = fanned_out(&m, json!([{"row": 1}, {"row": 2}]));
    let first: Vec<String> = waiting
        .await_unit
        .as_ref()
        .unwrap()
        .interactions
        .iter()
        .map(|i| i.token.clone())
        .collect();
    // The unit's deadline passes: the step fails (AWAIT_TIMEOUT); a re-drive runs it again.
    let deadline = waiting.await_unit.as_ref().unwrap().deadline;
    let (claimed, actions) = m.commit(&waiting, deadline, 20, &Event::Claim);
    let (failed, _) = m.launch(&claimed, deadline + 1, 21, &actions);
    assert_eq!(failed.status, Status::Failed);
    let (queued, actions) = m.commit(&failed, deadline + 2, 22, &redrive(failed.version, "again"));
    let (again, _) = m.launch(&queued, deadline + 3, 23, &actions);
    let unit = again.await_unit.as_ref().unwrap();
    assert_ne!(
        unit.id,
        waiting.await_unit.as_ref().unwrap().id,
        "a new attempt"
    );
    let second: Vec<String> = unit.interactions.iter().map(|i| i.token.clone()).collect();
    assert_eq!(first, second, "the same children complete the new attempt");

    // A child's notice for the first attempt (sent before the re-drive) is stale: nothing changes.
    let old_unit = waiting.await_unit.as_ref().unwrap().id;
    let notice = |unit| child_notice(unit, "item-0", &first[0], json!({"status": "FAILED"}));
    assert_eq!(
        m.skipped(&again, deadline + 4, 24, &notice(old_unit)),
        Skip::Stale
    );
    let (answered, _) = m.commit(&again, deadline + 4, 24, &notice(unit.id));
    assert!(answered.await_unit.as_ref().unwrap().interactions[0]
        .completion
        .is_some());
}

#[test]
fn a_cancelled_fan_out_cancels_the_children_still_running() {
    let m = Machine::of(fan_out_pipeline());
    let (waiting, _) = fanned_out(&m, json!([{"row": 1}, {"row": 2}]));
    let unit = waiting.await_unit.clone().unwrap();
    let (cancelled, actions) = m.commit(&waiting, PARKED_AT + 10, 30, &cancel("stop the batch"));
    assert_eq!(cancelled.status, Status::Cancelled);
    assert_eq!(actions, vec![Action::CancelChildren { unit: unit.id }]);
    // A child's notice that arrives after it: nothing waits for it, nothing is written.
    let token = unit.interactions[0].token.clone();
    let late = child_notice(unit.id, "item-0", &token, json!({"status": "CANCELLED"}));
    assert_eq!(
        m.skipped(&cancelled, PARKED_AT + 11, 31, &late),
        Skip::Stale
    );

    // The child's side: the parent's token cancels it (and it tells the parent), another does not.
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let forged = Event::CancelFromParent {
        token: "guessed".into(),
        reason: "no".into(),
    };
    assert_eq!(
        m.rejected(&running, LAUNCHED_AT + 1, 3, &forged),
        stepline::domain::Rejection::InvalidToken
    );
    let from_parent = Event::CancelFromParent {
        token: "t0".into(),
        reason: "the parent was cancelled".into(),
    };
    let (child, actions) = m.commit(&running, LAUNCHED_AT + 1, 3, &from_parent);
    assert_eq!(child.status, Status::Cancelled);
    assert!(actions.contains(&Action::NotifyParent), "{actions:?}");
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::NotifyCancel { .. })),
        "its worker is told"
    );
    assert_eq!(
        m.skipped(&child, LAUNCHED_AT + 2, 4, &from_parent),
        Skip::Terminal
    );
}
