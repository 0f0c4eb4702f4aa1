//! Await units: parking on an await step, the notice and its recovery, completion (approve, reject,
//! several interactions), idempotent and conflicting completions, forged tokens, the deadline, and
//! cancellation while waiting.

use serde_json::json;
use stepline::domain::{launch_id, Action, Decision, Event, Rejection, Skip, Status, Verdict};

use crate::fixtures::*;

/// `Machine` of the approval pipeline waiting on `interactions`, and its execution parked on them.
fn parked(interactions: &[&str]) -> (Machine, stepline::domain::Execution) {
    let m = Machine::of(approval_pipeline(interactions));
    let record = m.waiting();
    (m, record)
}

#[test]
fn an_await_step_parks_the_execution_with_unguessable_distinct_tokens() {
    let (_, record) = parked(&["manager", "chef"]);
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
fn launch_work_of_an_await_step_parks_the_execution_on_an_await_unit() {
    let m = Machine::of(approval_first_pipeline());
    let (record, actions) = m.started();
    let (parked, actions) = m.launch(&record, LAUNCHED_AT, 2, &actions);
    assert_eq!(parked.status, Status::WaitingExternal);
    let unit = parked.await_unit.as_ref().expect("an await unit");
    assert_eq!(unit.id, launch_id(EXEC, 0, 1));
    assert_eq!(unit.interactions.len(), 1, "one interaction unless named");
    assert_eq!(unit.interactions[0].id, "approval");
    assert_eq!(unit.deadline, ts(LAUNCHED_AT + i64::from(WAIT_SECS) * 1000));
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit: unit.id }]);
    assert_eq!(parked.lease, None, "the lease is consumed by the launch");
    assert_eq!(parked.wake_at, Some(ts(LAUNCHED_AT + LEASE_MS)));
}

#[test]
fn approving_resumes_at_the_next_step_with_the_completion_payload() {
    let (m, record) = parked(&[]);
    let token = token_of(&record, "approval");
    let payload = json!({"by": "maria"});
    let approve = complete("approval", &token, Verdict::Approved, payload.clone());
    let (next, actions) = m.commit(&record, PARKED_AT + 1_000, 5, &approve);
    assert_eq!(next.status, Status::Running);
    assert_eq!(next.step, 2);
    assert_eq!(
        next.input.value(),
        &json!({"order": 7, "valid": true, "interactions": {"approval": payload}}),
        "the step input flows on with the answers"
    );
    let unit = next.await_unit.as_ref().unwrap();
    assert!(unit.resolved);
    // Stored once: the answer went on in the input; the unit keeps what it is checked against.
    let done = unit.interactions[0].completion.as_ref().unwrap();
    assert!(done.payload.is_null(), "the answer is not kept twice");
    assert_eq!(done.verdict, Verdict::Approved);
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
        m.decide(&next, PARKED_AT + 2_000, 6, &again),
        Decision::Skip(Skip::Duplicate)
    );
    // Another answer to a completed interaction is a conflict.
    let reason = json!({"reason": "changed my mind"});
    let other = complete("approval", &token, Verdict::Rejected, reason);
    assert_eq!(
        m.decide(&next, PARKED_AT + 2_000, 6, &other),
        Decision::Reject(Rejection::InteractionConflict("approval".into()))
    );
}

#[test]
fn rejecting_fails_the_execution_with_the_reason() {
    let (m, record) = parked(&[]);
    let token = token_of(&record, "approval");
    let reason = json!({"reason": "out of truffles"});
    let reject = complete("approval", &token, Verdict::Rejected, reason);
    let (next, actions) = m.commit(&record, PARKED_AT + 1_000, 5, &reject);
    assert_eq!(next.status, Status::Failed);
    let error = next.error.as_ref().unwrap();
    assert_eq!(error.code, "REJECTED");
    assert!(error.message.contains("out of truffles"));
    assert!(!error.retryable);
    assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
}

#[test]
fn a_forged_or_wrong_token_is_refused() {
    let (m, record) = parked(&["manager", "chef"]);
    let refusal = |interaction: &str, token: &str| {
        let event = complete(interaction, token, Verdict::Approved, json!({}));
        m.rejected(&record, PARKED_AT + 1, 5, &event)
    };
    let forged = "0123456789abcdef0123456789abcdef";
    assert_eq!(refusal("manager", forged), Rejection::InvalidToken);
    // The chef's token does not open the manager's interaction.
    let chef = token_of(&record, "chef");
    assert_eq!(refusal("manager", &chef), Rejection::InvalidToken);
    assert_eq!(
        refusal("owner", &chef),
        Rejection::UnknownInteraction("owner".into())
    );
}

#[test]
fn a_completion_is_authenticated_before_any_other_check() {
    let (m, record) = parked(&["manager", "chef"]);
    let forged = "0123456789abcdef0123456789abcdef";
    let refusal = |record: &stepline::domain::Execution, interaction: &str, token: &str| {
        let event = complete(interaction, token, Verdict::Approved, json!({}));
        m.rejected(record, PARKED_AT + 1, 5, &event)
    };
    // A forger learns nothing from the order of checks: an unknown interaction, or an execution
    // with nothing to answer, is refused as unauthenticated (which writes nothing, not even an
    // incident) unless the token is one of the unit's.
    assert_eq!(refusal(&record, "owner", forged), Rejection::InvalidToken);
    let mut not_waiting = record.clone();
    not_waiting.await_unit = None;
    assert_eq!(
        refusal(&not_waiting, "manager", forged),
        Rejection::InvalidToken
    );
    assert!(refusal(&record, "owner", forged).is_unauthenticated());
    // The holder of a real token is told what is wrong.
    let chef = token_of(&record, "chef");
    assert_eq!(
        refusal(&record, "owner", &chef),
        Rejection::UnknownInteraction("owner".into())
    );
}

#[test]
fn every_interaction_must_be_approved_before_resuming() {
    let (m, record) = parked(&["manager", "chef"]);
    let approve = |name: &str, n: i64| {
        let token = token_of(&record, name);
        complete(name, &token, Verdict::Approved, json!({ "ok": n }))
    };
    let (half, actions) = m.commit(&record, PARKED_AT + 1, 5, &approve("manager", 1));
    assert!(actions.is_empty());
    assert_eq!(half.status, Status::WaitingExternal);
    let (done, _) = m.commit(&half, PARKED_AT + 2, 6, &approve("chef", 2));
    assert_eq!(done.step, 2);
    assert_eq!(
        done.input.value()["interactions"],
        json!({"manager": {"ok": 1}, "chef": {"ok": 2}})
    );
}

#[test]
fn the_deadline_fails_the_step_with_await_timeout_through_the_sweeper() {
    let (m, record) = parked(&[]);
    let deadline = record.await_unit.as_ref().unwrap().deadline.millis();
    // Not due before the deadline (its entry, kept early, moved there by the first sweep).
    let record = m.found_early(&record, deadline - 1, 5);
    assert_eq!(
        m.skipped(&record, deadline - 1, 5, &Event::Claim),
        Skip::NotDue
    );
    let (failed, actions) = m.claim_and_launch(&record, (deadline, 5), deadline + 10);
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.error.as_ref().unwrap().code, "AWAIT_TIMEOUT");
    assert!(matches!(actions[..], [Action::SendDeadLetter { .. }]));
    // A completion after the deadline is refused.
    let token = token_of(&record, "approval");
    let late = complete("approval", &token, Verdict::Approved, json!({}));
    assert_eq!(
        m.rejected(&record, deadline + 1, 7, &late),
        Rejection::AwaitExpired
    );
    assert_eq!(
        m.rejected(&failed, deadline + 1, 7, &late),
        Rejection::NotWaiting(Status::Failed)
    );
}

#[test]
fn an_unconfirmed_notice_is_sent_again_by_the_sweeper() {
    let m = Machine::of(approval_pipeline(&[]));
    let (parked, _) = m.past_first_step(json!({}));
    let unit = parked.await_unit.as_ref().unwrap().id;
    // The notice never confirmed (a crash between commit and send): due after a lease.
    let due = parked.due_at().unwrap().millis();
    assert_eq!(due, PARKED_AT + LEASE_MS);
    let (again, actions) = m.claim_and_launch(&parked, (due, 4), due + 1);
    assert_eq!(actions, vec![Action::SendAwaitNotice { unit }]);
    assert_eq!(again.status, Status::WaitingExternal);
    assert_eq!(
        again.await_unit.as_ref().unwrap().interactions,
        parked.await_unit.as_ref().unwrap().interactions,
        "the same tokens are announced again"
    );
    // Confirming twice is a duplicate.
    let sent = Event::AwaitNoticeSent { unit };
    let (confirmed, _) = m.commit(&again, due + 2, 6, &sent);
    assert_eq!(m.skipped(&confirmed, due + 3, 7, &sent), Skip::Duplicate);
}

#[test]
fn a_cancelled_execution_takes_no_completion() {
    let (m, record) = parked(&[]);
    let (cancelled, actions) = m.commit(&record, PARKED_AT + 1, 5, &cancel("closed"));
    assert!(actions.is_empty(), "no worker to notify at an await step");
    let token = token_of(&record, "approval");
    let approve = complete("approval", &token, Verdict::Approved, json!({}));
    assert_eq!(
        m.rejected(&cancelled, PARKED_AT + 2, 6, &approve),
        Rejection::NotWaiting(Status::Cancelled)
    );
}
