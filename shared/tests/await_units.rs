//! Await units in the state machine: parking on an await step, the notice and its recovery,
//! completion (approve, reject, several interactions), idempotent and conflicting completions, forged
//! tokens, the deadline, and cancellation while waiting.

use serde_json::{json, Value};
use stepline::domain::{
    decide, launch_id, start, Action, Context, Decision, Event, Execution, PipelineDef, Rejection,
    RetryPolicy, Skip, Status, StepDef, StepKind, Verdict,
};
use uuid::Uuid;

const T0: i64 = 1_800_000_000_000;
const LEASE_MS: i64 = 30_000;
const WAIT_SECS: u32 = 600;

fn ctx(now: i64, token: u128) -> Context {
    Context {
        now,
        jitter: 0.5,
        token: Uuid::from_u128(token),
        owner: "test".into(),
        lease_ms: LEASE_MS,
        lifecycle: false,
    }
}

fn step(id: &str, kind: StepKind, interactions: &[&str]) -> StepDef {
    StepDef {
        id: id.into(),
        kind,
        input_type: "json".into(),
        output_type: "json".into(),
        queue: format!("{id}-queue"),
        timeout_secs: WAIT_SECS,
        retry: RetryPolicy::default(),
        interactions: interactions.iter().map(|s| s.to_string()).collect(),
        child_pipeline: None,
    }
}

/// validate (task) -> approve (await) -> notify (task)
fn approval_pipeline(interactions: &[&str]) -> PipelineDef {
    PipelineDef {
        pipeline_id: "restaurant".into(),
        release_version: "1".into(),
        steps: vec![
            step("validate", StepKind::Task, &[]),
            step("approve", StepKind::Await, interactions),
            step("notify", StepKind::Task, &[]),
        ],
    }
}

fn commit(
    record: &Execution,
    def: &PipelineDef,
    ctx: &Context,
    event: &Event,
) -> (Execution, Vec<Action>) {
    match decide(record, def, ctx, event) {
        Decision::Commit {
            record: next,
            actions,
        } => {
            assert_eq!(next.version, record.version + 1);
            (*next, actions)
        }
        other => panic!("expected a commit for {event:?}, got {other:?}"),
    }
}

fn answer(verdict: Verdict, payload: &Value) -> String {
    stepline::envelope::InteractionMessage::answer_fingerprint(verdict, payload)
}

fn complete(interaction: &str, token: &str, verdict: Verdict, payload: Value) -> Event {
    Event::CompleteInteraction {
        interaction: interaction.into(),
        token: token.into(),
        fingerprint: answer(verdict, &payload),
        verdict,
        payload,
    }
}

/// An execution parked at the await step, its notice confirmed sent.
fn waiting(def: &PipelineDef) -> (Execution, i64) {
    let id = Uuid::from_u128(42);
    let (record, actions) = start(id, "t", def, json!({"order": 7}), None, &ctx(T0, 1));
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (record, _) = commit(
        &record,
        def,
        &ctx(T0 + 10, 2),
        &Event::LaunchWork { generation, token },
    );
    let reply = Event::Reply {
        launch_id: launch_id(id, 0, 1),
        step: 0,
        attempt: 1,
        fingerprint: "f0".into(),
        outcome: stepline::domain::Outcome::Succeeded(json!({"order": 7, "valid": true})),
    };
    let at = T0 + 20;
    let (record, actions) = commit(&record, def, &ctx(at, 3), &reply);
    assert_eq!(record.status, Status::WaitingExternal);
    let unit = record.await_unit.clone().expect("an await unit");
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
    assert_eq!(unit.id, launch_id(id, 1, 1));
    assert_eq!(unit.deadline, at + i64::from(WAIT_SECS) * 1000);
    assert!(!unit.notice_sent);
    assert_eq!(
        record.wake_at,
        Some(at + LEASE_MS),
        "due soon, until the notice is confirmed"
    );
    let (record, actions) = commit(
        &record,
        def,
        &ctx(at + 5, 4),
        &Event::AwaitNoticeSent { unit: unit.id },
    );
    assert!(actions.is_empty());
    assert!(record.await_unit.as_ref().unwrap().notice_sent);
    assert_eq!(
        record.wake_at,
        Some(unit.deadline),
        "then due at the deadline"
    );
    (record, at)
}

fn token_of(record: &Execution, interaction: &str) -> String {
    record
        .await_unit
        .as_ref()
        .unwrap()
        .interactions
        .iter()
        .find(|i| i.id == interaction)
        .unwrap()
        .token
        .clone()
}

#[test]
fn an_await_step_parks_the_execution_with_unguessable_distinct_tokens() {
    let def = approval_pipeline(&["manager", "chef"]);
    let (record, _) = waiting(&def);
    let unit = record.await_unit.as_ref().unwrap();
    let ids: Vec<&str> = unit.interactions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["manager", "chef"]);
    let (a, b) = (token_of(&record, "manager"), token_of(&record, "chef"));
    assert_ne!(a, b);
    assert_eq!(a.len(), 32);
    // Tokens come from the decision's random token, not from anything stored or derivable.
    let other = {
        let mut r = record.clone();
        r.await_unit = None;
        r
    };
    assert!(!format!("{other:?}").contains(&a));
    assert_eq!(
        unit.interactions[0].idempotency_key,
        format!("{}/manager", unit.id)
    );
    assert_eq!(record.due_at(), Some(unit.deadline));
}

#[test]
fn approving_resumes_at_the_next_step_with_the_completion_payload() {
    let def = approval_pipeline(&[]);
    let (record, at) = waiting(&def);
    let token = token_of(&record, "approval");
    let payload = json!({"by": "maria"});
    let (next, actions) = commit(
        &record,
        &def,
        &ctx(at + 1_000, 5),
        &complete("approval", &token, Verdict::Approved, payload.clone()),
    );
    assert_eq!(next.status, Status::Running);
    assert_eq!(next.step, 2);
    assert_eq!(
        next.steps[1].output.as_ref().unwrap().value(),
        &json!({"order": 7, "valid": true, "interactions": {"approval": payload}}),
        "the step input flows on with the answers"
    );
    assert!(next.await_unit.as_ref().unwrap().resolved);
    match &actions[..] {
        [Action::SendRequest {
            step: 2,
            attempt: 1,
            launch_id: id,
            ..
        }] => {
            assert_eq!(*id, launch_id(record.id, 2, 1))
        }
        other => panic!("expected the next step's request, got {other:?}"),
    }
    assert_eq!(
        next.step_input(2).unwrap().value()["interactions"]["approval"]["by"],
        "maria"
    );

    // Completing it twice with the same answer: the same outcome, no second resume.
    let again = complete("approval", &token, Verdict::Approved, payload);
    assert_eq!(
        decide(&next, &def, &ctx(at + 2_000, 6), &again),
        Decision::Skip(Skip::Duplicate)
    );
    // Another answer to a completed interaction is a conflict.
    let other = complete(
        "approval",
        &token,
        Verdict::Rejected,
        json!({"reason": "changed my mind"}),
    );
    assert_eq!(
        decide(&next, &def, &ctx(at + 2_000, 6), &other),
        Decision::Reject(Rejection::InteractionConflict("approval".into()))
    );
}

#[test]
fn rejecting_fails_the_execution_with_the_reason() {
    let def = approval_pipeline(&[]);
    let (record, at) = waiting(&def);
    let token = token_of(&record, "approval");
    let (next, actions) = commit(
        &record,
        &def,
        &ctx(at + 1_000, 5),
        &complete(
            "approval",
            &token,
            Verdict::Rejected,
            json!({"reason": "out of truffles"}),
        ),
    );
    assert_eq!(next.status, Status::Failed);
    let error = next.error.as_ref().unwrap();
    assert_eq!(error.code, "REJECTED");
    assert!(error.message.contains("out of truffles"));
    assert!(!error.retryable);
    assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
}

#[test]
fn a_forged_or_wrong_token_is_refused() {
    let def = approval_pipeline(&["manager", "chef"]);
    let (record, at) = waiting(&def);
    let forged = complete(
        "manager",
        "0123456789abcdef0123456789abcdef",
        Verdict::Approved,
        json!({}),
    );
    assert_eq!(
        decide(&record, &def, &ctx(at + 1, 5), &forged),
        Decision::Reject(Rejection::InvalidToken)
    );
    // The chef's token does not open the manager's interaction.
    let crossed = complete(
        "manager",
        &token_of(&record, "chef"),
        Verdict::Approved,
        json!({}),
    );
    assert_eq!(
        decide(&record, &def, &ctx(at + 1, 5), &crossed),
        Decision::Reject(Rejection::InvalidToken)
    );
    let unknown = complete(
        "owner",
        &token_of(&record, "chef"),
        Verdict::Approved,
        json!({}),
    );
    assert_eq!(
        decide(&record, &def, &ctx(at + 1, 5), &unknown),
        Decision::Reject(Rejection::UnknownInteraction("owner".into()))
    );
}

#[test]
fn every_interaction_must_be_approved_before_resuming() {
    let def = approval_pipeline(&["manager", "chef"]);
    let (record, at) = waiting(&def);
    let (half, actions) = commit(
        &record,
        &def,
        &ctx(at + 1, 5),
        &complete(
            "manager",
            &token_of(&record, "manager"),
            Verdict::Approved,
            json!({"ok": 1}),
        ),
    );
    assert!(actions.is_empty());
    assert_eq!(half.status, Status::WaitingExternal);
    let (done, _) = commit(
        &half,
        &def,
        &ctx(at + 2, 6),
        &complete(
            "chef",
            &token_of(&record, "chef"),
            Verdict::Approved,
            json!({"ok": 2}),
        ),
    );
    assert_eq!(done.step, 2);
    assert_eq!(
        done.steps[1].output.as_ref().unwrap().value()["interactions"],
        json!({"manager": {"ok": 1}, "chef": {"ok": 2}})
    );
}

#[test]
fn the_deadline_fails_the_step_with_await_timeout_through_the_sweeper() {
    let def = approval_pipeline(&[]);
    let (record, _) = waiting(&def);
    let deadline = record.await_unit.as_ref().unwrap().deadline;
    // Not due before the deadline.
    assert_eq!(
        decide(&record, &def, &ctx(deadline - 1, 5), &Event::Claim),
        Decision::Skip(Skip::NotDue)
    );
    let (claimed, actions) = commit(&record, &def, &ctx(deadline, 5), &Event::Claim);
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (failed, actions) = commit(
        &claimed,
        &def,
        &ctx(deadline + 10, 6),
        &Event::LaunchWork { generation, token },
    );
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.error.as_ref().unwrap().code, "AWAIT_TIMEOUT");
    assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
    // A completion after the deadline is refused.
    let late = complete(
        "approval",
        &token_of(&record, "approval"),
        Verdict::Approved,
        json!({}),
    );
    assert_eq!(
        decide(&record, &def, &ctx(deadline + 1, 7), &late),
        Decision::Reject(Rejection::AwaitExpired)
    );
    assert_eq!(
        decide(&failed, &def, &ctx(deadline + 1, 7), &late),
        Decision::Reject(Rejection::NotWaiting(Status::Failed))
    );
}

#[test]
fn an_unconfirmed_notice_is_sent_again_by_the_sweeper() {
    let def = approval_pipeline(&[]);
    let id = Uuid::from_u128(43);
    let (record, actions) = start(id, "t", &def, json!({}), None, &ctx(T0, 1));
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (record, _) = commit(
        &record,
        &def,
        &ctx(T0 + 1, 2),
        &Event::LaunchWork { generation, token },
    );
    let reply = Event::Reply {
        launch_id: launch_id(id, 0, 1),
        step: 0,
        attempt: 1,
        fingerprint: "f".into(),
        outcome: stepline::domain::Outcome::Succeeded(json!({})),
    };
    let (parked, _) = commit(&record, &def, &ctx(T0 + 2, 3), &reply);
    let unit = parked.await_unit.as_ref().unwrap().id;
    // The notice never confirmed (a crash between commit and send): due after a lease.
    let due = parked.due_at().unwrap();
    assert_eq!(due, T0 + 2 + LEASE_MS);
    let (claimed, actions) = commit(&parked, &def, &ctx(due, 4), &Event::Claim);
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (again, actions) = commit(
        &claimed,
        &def,
        &ctx(due + 1, 5),
        &Event::LaunchWork { generation, token },
    );
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit }]);
    assert_eq!(again.status, Status::WaitingExternal);
    assert_eq!(
        again.await_unit.as_ref().unwrap().interactions,
        parked.await_unit.as_ref().unwrap().interactions,
        "the same tokens are announced again"
    );
    // Confirming twice is a duplicate.
    let (confirmed, _) = commit(
        &again,
        &def,
        &ctx(due + 2, 6),
        &Event::AwaitNoticeSent { unit },
    );
    assert_eq!(
        decide(
            &confirmed,
            &def,
            &ctx(due + 3, 7),
            &Event::AwaitNoticeSent { unit }
        ),
        Decision::Skip(Skip::Duplicate)
    );
}

#[test]
fn a_cancelled_execution_takes_no_completion() {
    let def = approval_pipeline(&[]);
    let (record, at) = waiting(&def);
    let (cancelled, actions) = commit(
        &record,
        &def,
        &ctx(at + 1, 5),
        &Event::Cancel {
            reason: "closed".into(),
        },
    );
    assert!(actions.is_empty(), "no worker to notify at an await step");
    let approve = complete(
        "approval",
        &token_of(&record, "approval"),
        Verdict::Approved,
        json!({}),
    );
    assert_eq!(
        decide(&cancelled, &def, &ctx(at + 2, 6), &approve),
        Decision::Reject(Rejection::NotWaiting(Status::Cancelled))
    );
}

/// parse (task) -> payments (fan-out over `items`) -> summary (task)
fn fan_out_pipeline() -> PipelineDef {
    let mut payments = step("payments", StepKind::FanOut, &[]);
    payments.child_pipeline = Some("payment".into());
    PipelineDef {
        pipeline_id: "batch".into(),
        release_version: "1".into(),
        steps: vec![
            step("parse", StepKind::Task, &[]),
            payments,
            step("summary", StepKind::Task, &[]),
        ],
    }
}

/// The batch after its parse step replied with `items`.
fn fanned_out(def: &PipelineDef, items: Value) -> (Execution, Vec<Action>) {
    let id = Uuid::from_u128(77);
    let (record, actions) = start(id, "t", def, json!({}), None, &ctx(T0, 1));
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (record, _) = commit(
        &record,
        def,
        &ctx(T0 + 1, 2),
        &Event::LaunchWork { generation, token },
    );
    let reply = Event::Reply {
        launch_id: launch_id(id, 0, 1),
        step: 0,
        attempt: 1,
        fingerprint: "p".into(),
        outcome: stepline::domain::Outcome::Succeeded(json!({"items": items, "badRows": []})),
    };
    commit(&record, def, &ctx(T0 + 2, 3), &reply)
}

#[test]
fn a_fan_out_waits_on_one_interaction_per_item() {
    let def = fan_out_pipeline();
    let (record, actions) = fanned_out(&def, json!([{"row": 1}, {"row": 2}, {"row": 3}]));
    assert_eq!(record.status, Status::WaitingExternal);
    let unit = record.await_unit.as_ref().unwrap();
    let ids: Vec<&str> = unit.interactions.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["item-0", "item-1", "item-2"]);
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);

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
        current = commit(
            &current,
            &def,
            &ctx(T0 + 10 + n as i64, 10 + n as u128),
            &event,
        )
        .0;
    }
    assert_eq!(current.step, 2, "a failed child is reported, not fatal");
    let output = current.steps[1].output.as_ref().unwrap().value();
    assert_eq!(output["interactions"]["item-1"]["status"], "FAILED");
    assert_eq!(output["badRows"], json!([]), "the step input flows on");
}

#[test]
fn a_fan_out_over_no_items_is_done_at_once() {
    let def = fan_out_pipeline();
    let (record, actions) = fanned_out(&def, json!([]));
    assert_eq!(record.status, Status::Running);
    assert_eq!(record.step, 2, "straight to the summary");
    assert!(matches!(actions[..], [Action::SendRequest { step: 2, .. }]));
}

#[test]
fn a_child_that_ends_tells_its_parent_until_confirmed() {
    let def = PipelineDef {
        pipeline_id: "payment".into(),
        release_version: "1".into(),
        steps: vec![step("pay", StepKind::Task, &[])],
    };
    let id = Uuid::from_u128(78);
    let (mut record, actions) = start(id, "t", &def, json!({"row": 1}), None, &ctx(T0, 1));
    record.parent = Some(stepline::domain::ParentLink {
        execution_id: Uuid::from_u128(77),
        interaction: "item-0".into(),
        token: "t0".into(),
        complete_to: "replies".into(),
    });
    let Action::EnqueueLaunch {
        generation, token, ..
    } = actions[0]
    else {
        panic!()
    };
    let (running, _) = commit(
        &record,
        &def,
        &ctx(T0 + 1, 2),
        &Event::LaunchWork { generation, token },
    );
    let reply = Event::Reply {
        launch_id: launch_id(id, 0, 1),
        step: 0,
        attempt: 1,
        fingerprint: "f".into(),
        outcome: stepline::domain::Outcome::Succeeded(json!({"paid": true})),
    };
    let (done, actions) = commit(&running, &def, &ctx(T0 + 2, 3), &reply);
    assert_eq!(done.status, Status::Succeeded);
    assert_eq!(actions, vec![Action::NotifyParent]);
    assert!(!done.parent_notified);
    let due = done.due_at().expect("due until the parent is told");
    // A crash before the notice went out: the sweeper sends it again.
    let (again, actions) = commit(&done, &def, &ctx(due, 4), &Event::Claim);
    assert_eq!(actions, vec![Action::NotifyParent]);
    let (confirmed, _) = commit(&again, &def, &ctx(due + 1, 5), &Event::ParentNotified);
    assert!(confirmed.parent_notified);
    assert_eq!(confirmed.due_at(), None);
    assert_eq!(
        decide(&confirmed, &def, &ctx(due + 2, 6), &Event::ParentNotified),
        Decision::Skip(Skip::Duplicate)
    );
}
