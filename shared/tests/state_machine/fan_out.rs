//! Fan-out steps: one child execution per item, each child's end counted outside the parent (the
//! ledger) and the parent settled once, and a child telling its parent of its end until confirmed.

use serde_json::{json, Value};
use stepline::domain::{launch_id, Action, Event, Execution, Skip, Status, Verdict};

use crate::fixtures::*;

/// The batch after its parse step replied with `items`: the record and what the reply launched.
fn fanned_out(m: &Machine, items: Value) -> (Execution, Vec<Action>) {
    m.past_first_step(json!({"items": items, "badRows": []}))
}

#[track_caller]
fn assert_waits_on_items(record: &Execution, actions: &[Action], items: u32) {
    assert_eq!(record.status, Status::WaitingExternal);
    let unit = record.await_unit.as_ref().unwrap();
    assert!(unit.interactions.is_empty(), "children are counted outside");
    assert_eq!(unit.fan_out.map(|f| f.items), Some(items));
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
}

/// A child's end as the ledger keeps it.
fn end(item: u32, status: &str) -> Value {
    json!({"item": item, "executionId": uuid::Uuid::from_u128(u128::from(item)), "status": status})
}

/// The parent's next attempt of the fan-out step starting the child again (its genuine token).
fn rejoin_next_unit() -> Event {
    Event::Rejoin {
        token: "t0".into(),
        unit: Some(NEXT_UNIT),
    }
}

/// A running child whose step succeeded (at `LAUNCHED_AT + 1`), and what its success does.
fn child_that_succeeded(m: &Machine) -> (Execution, Vec<Action>) {
    let paid = ok_reply(0, 1, json!({"paid": true}));
    m.commit(&m.running_child(), LAUNCHED_AT + 1, 3, &paid)
}

#[test]
fn a_fan_out_resumes_once_when_its_last_child_is_counted() {
    let m = Machine::of(fan_out_pipeline());
    let (record, actions) = fanned_out(&m, json!([{"row": 1}, {"row": 2}, {"row": 3}]));
    assert_waits_on_items(&record, &actions, 3);
    let unit = record.await_unit.as_ref().unwrap().id;

    // A child's notice is counted only with the parent's token for that child and item.
    let place = |item| (unit, 1, item);
    assert_eq!(
        child_notice_check(&record, place(1), &child_token(&record, 1)),
        Ok(3)
    );
    assert_eq!(
        child_notice_check(&record, place(1), &child_token(&record, 2)),
        Err("INVALID_TOKEN".into())
    );
    assert_eq!(
        child_notice_check(&record, place(3), &child_token(&record, 3)),
        Err("UNKNOWN_INTERACTION".into())
    );
    let elsewhere = (uuid::Uuid::from_u128(9), 1, 1);
    assert_eq!(
        child_notice_check(&record, elsewhere, &child_token(&record, 1)),
        Err("skip Stale".into())
    );

    // Two of three counted: nothing to settle.
    let results = json!([
        end(0, "SUCCEEDED"),
        end(1, "SUCCEEDED"),
        end(2, "SUCCEEDED")
    ]);
    assert_eq!(
        m.skipped(&record, PARKED_AT + 10, 10, &settled(unit, 2, 0, json!([]))),
        Skip::NotDue
    );
    let (resumed, actions) = m.commit(
        &record,
        PARKED_AT + 11,
        11,
        &settled(unit, 3, 0, results.clone()),
    );
    assert_eq!(resumed.step, 2);
    assert!(matches!(actions[..], [Action::SendRequest { step: 2, .. }]));
    assert_eq!(resumed.version, record.version + 1, "one write settles it");
    let output = resumed.input.value();
    assert_eq!(output["results"], results);
    assert_eq!(
        output["fanOut"],
        json!({"items": 3, "succeeded": 3, "failed": 0})
    );
    assert_eq!(output["badRows"], json!([]), "the step input flows on");
    // Another settler that counted the last child too: nothing more.
    assert!(matches!(
        m.skipped(&resumed, PARKED_AT + 12, 12, &settled(unit, 3, 0, results)),
        Skip::Duplicate | Skip::Stale
    ));
}

#[test]
fn a_fan_out_fails_when_more_children_fail_than_it_tolerates() {
    let mut def = fan_out_pipeline();
    def.steps[1] = def.steps[1].clone().tolerating(Some(1), None);
    let m = Machine::of(def);
    let (record, _) = fanned_out(&m, json!([{"row": 1}, {"row": 2}, {"row": 3}, {"row": 4}]));
    let unit = record.await_unit.as_ref().unwrap().id;
    assert_eq!(
        record
            .await_unit
            .as_ref()
            .unwrap()
            .fan_out
            .map(|f| f.tolerated),
        Some(1)
    );
    // One failure is tolerated: not settled until all are counted.
    assert_eq!(
        m.skipped(&record, PARKED_AT + 10, 10, &settled(unit, 1, 1, json!([]))),
        Skip::NotDue
    );
    // A second fails the step at once; the two children still running are cancelled.
    let (failed, actions) = m.commit(&record, PARKED_AT + 11, 11, &settled(unit, 0, 2, json!([])));
    assert_eq!(failed.status, Status::Failed);
    let error = failed.error.as_ref().unwrap();
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("FAN_OUT_FAILED", false)
    );
    assert_eq!(error.message, "2 of 4 children failed, 1 tolerated");
    assert!(
        actions.contains(&Action::CancelChildren { unit }),
        "{actions:?}"
    );
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::SendDeadLetter { .. })));

    // All counted with one failure: the step succeeds, the failed child's end among the results.
    let results = json!([
        end(0, "SUCCEEDED"),
        end(1, "FAILED"),
        end(2, "SUCCEEDED"),
        end(3, "SUCCEEDED")
    ]);
    let (resumed, actions) = m.commit(&record, PARKED_AT + 11, 12, &settled(unit, 3, 1, results));
    assert_eq!(resumed.step, 2);
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::CancelChildren { .. })));
    assert_eq!(resumed.input.value()["results"][1]["status"], "FAILED");
}

/// `child_notice` as a comparable value: the unit's items, or why the notice is not counted.
fn child_notice_check(
    record: &Execution,
    place: (uuid::Uuid, u32, u32),
    token: &str,
) -> Result<u32, String> {
    match stepline::domain::child_notice(record, place, token) {
        Ok(fan_out) => Ok(fan_out.items),
        Err(stepline::domain::Decision::Reject(r)) => Err(r.code().to_string()),
        Err(stepline::domain::Decision::Skip(s)) => Err(format!("skip {s:?}")),
        Err(other) => panic!("{other:?}"),
    }
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
    assert_waits_on_items(&waiting, &actions, 2);
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
    let (done, actions) = child_that_succeeded(&m);
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(actions, vec![Action::NotifyParent]);
    assert!(!done.parent_notified);
    let due = done
        .due_at()
        .expect("due until the parent is told")
        .millis();
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
    assert_eq!(cancelled.due_at(), Some(ts(LAUNCHED_AT + 1 + LEASE_MS)));
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
fn a_fan_out_over_items_in_an_object_is_sized_before_its_children_start() {
    let m = Machine::of(fan_out_first_pipeline());
    for input in [
        reference(),
        json!({"itemsFrom": {"bucket": "payloads", "key": "payloads/rows.jsonl", "format": "jsonl"}}),
    ] {
        let (record, actions) = m.start_with(input);
        let (waiting, actions) = m.launch(&record, LAUNCHED_AT, 2, &actions);
        assert_eq!(waiting.status, Status::WaitingExternal);
        let unit = waiting.await_unit.clone().unwrap();
        assert_eq!(unit.fan_out, None, "not sized yet");
        assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
        // No child can be counted before the unit is sized (none has started).
        let token = child_token(&waiting, 0);
        assert_eq!(
            child_notice_check(&waiting, (unit.id, 0, 0), &token),
            Err("skip Stale".into())
        );

        // Sized: its children may start.
        let sized = |items| Event::FanOutSized {
            unit: unit.id,
            items,
        };
        let (ready, actions) = m.commit(&waiting, LAUNCHED_AT + 1, 3, &sized(Ok(1000)));
        assert!(actions.is_empty());
        assert_eq!(
            ready.await_unit.as_ref().unwrap().fan_out,
            Some(stepline::domain::FanOutUnit {
                items: 1000,
                tolerated: 0,
                window: None
            })
        );
        assert_eq!(
            m.skipped(&ready, LAUNCHED_AT + 2, 4, &sized(Ok(1000))),
            Skip::Duplicate
        );

        // No items: the step is done at once.
        let (done, actions) = m.commit(&waiting, LAUNCHED_AT + 1, 5, &sized(Ok(0)));
        assert_eq!((done.status, done.step), (Status::Running, 1));
        assert!(matches!(actions[..], [Action::SendRequest { step: 1, .. }]));
        assert_eq!(done.input.value()["results"], json!([]));

        // Unreadable items fail the step with the reading's error.
        let unreadable =
            stepline::domain::StepError::new("PAYLOAD_UNRESOLVABLE", "no such object", false);
        let (failed, actions) = m.commit(&waiting, LAUNCHED_AT + 1, 6, &sized(Err(unreadable)));
        assert_eq!(failed.status, Status::Failed);
        assert_eq!(failed.error.as_ref().unwrap().code, "PAYLOAD_UNRESOLVABLE");
        assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
    }
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

    let rejoin = rejoin_next_unit();
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
fn a_cancelled_child_started_again_by_its_parent_runs_again() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let from_parent = Event::CancelFromParent {
        token: "t0".into(),
        reason: "the fan-out failed".into(),
    };
    let (cancelled, _) = m.commit(&running, LAUNCHED_AT + 1, 3, &from_parent);
    assert_eq!(cancelled.status, Status::Cancelled);
    let (told, _) = m.commit(&cancelled, LAUNCHED_AT + 2, 4, &Event::ParentNotified);
    let rejoin = rejoin_next_unit();
    let (queued, actions) = m.commit(&told, LAUNCHED_AT + 3, 5, &rejoin);
    assert_eq!(queued.status, Status::Queued);
    assert_eq!(queued.error, None);
    assert!(matches!(actions[..], [Action::EnqueueLaunch { .. }]));
    let (relaunched, actions) = m.launch(&queued, LAUNCHED_AT + 4, 6, &actions);
    assert_eq!(request_of(&actions).1, 2, "a new attempt");
    assert_eq!(relaunched.status, Status::Running);
}

#[test]
fn a_running_child_started_again_answers_the_new_attempt() {
    let m = Machine::of(child_pipeline());
    let running = m.running_child();
    let rejoin = rejoin_next_unit();
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
    let (done, _) = child_that_succeeded(&m);
    let (told, _) = m.commit(&done, LAUNCHED_AT + 2, 4, &Event::ParentNotified);
    assert_eq!(told.due_at(), None);

    let rejoin = rejoin_next_unit();
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
    let first: Vec<String> = (0..2).map(|i| child_token(&waiting, i)).collect();
    // The unit's deadline passes: the step fails (AWAIT_TIMEOUT); a re-drive runs it again.
    let deadline = waiting.await_unit.as_ref().unwrap().deadline.millis();
    let (claimed, actions) = m.commit(&waiting, deadline, 20, &Event::Claim);
    let (failed, _) = m.launch(&claimed, deadline + 1, 21, &actions);
    assert_eq!(failed.status, Status::Failed);
    let (queued, actions) = m.commit(&failed, deadline + 2, 22, &redrive(failed.version, "again"));
    let (again, _) = m.launch(&queued, deadline + 3, 23, &actions);
    let unit = again.await_unit.as_ref().unwrap();
    let old_unit = waiting.await_unit.as_ref().unwrap().id;
    assert_ne!(unit.id, old_unit, "a new attempt");
    let second: Vec<String> = (0..2).map(|i| child_token(&again, i)).collect();
    assert_eq!(first, second, "the same children answer the new attempt");

    // A child's notice for the first attempt (sent before the re-drive) is stale: nothing counted.
    assert_eq!(
        child_notice_check(&again, (old_unit, 1, 0), &first[0]),
        Err("skip Stale".into())
    );
    assert_eq!(
        child_notice_check(&again, (unit.id, 1, 0), &first[0]),
        Ok(2)
    );
}

#[test]
fn a_cancelled_fan_out_cancels_the_children_still_running() {
    let m = Machine::of(fan_out_pipeline());
    let (waiting, _) = fanned_out(&m, json!([{"row": 1}, {"row": 2}]));
    let unit = waiting.await_unit.clone().unwrap();
    let (cancelled, actions) = m.commit(&waiting, PARKED_AT + 10, 30, &cancel("stop the batch"));
    assert_eq!(cancelled.status, Status::Cancelled);
    assert_eq!(actions, vec![Action::CancelChildren { unit: unit.id }]);
    // A child's notice that arrives after it: nothing waits for it, nothing is counted.
    let token = child_token(&waiting, 0);
    assert_eq!(
        child_notice_check(&cancelled, (unit.id, 1, 0), &token),
        Err("skip Stale".into())
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
