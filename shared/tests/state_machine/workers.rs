//! Replies as workers send them (`Event::FromWorker`): reply tokens, the pinned identity, and the
//! bound on heartbeats.

use serde_json::json;
use stepline::domain::machine::MAX_HEARTBEAT_TIMEOUTS;
use stepline::domain::{
    launch_id, reply_token, start, Decision, NewExecution, Outcome, Rejection, Skip,
};

use crate::fixtures::*;

#[test]
fn a_new_execution_has_a_secret_of_its_own() {
    let m = Machine::of(three_steps());
    let (a, _) = m.started();
    assert_eq!(a.secret.len(), 32);
    let (b, _) = start(
        NewExecution::of(EXEC, TENANT, &m.def, input()),
        &ctx(T0, 99),
    );
    assert_ne!(
        a.secret, b.secret,
        "secrets come from the decision's random token"
    );
}

#[test]
fn a_reply_with_the_launchs_token_is_applied_like_the_bare_reply() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (LAUNCHED_AT + 10, 3);
    let bare = reply(0, 1, Outcome::Succeeded(output(0)));
    let (expected, expected_actions) = m.commit(&record, at, tok, &bare);
    let (applied, actions) = m.commit(&record, at, tok, &genuine(&record, 0, 1, bare));
    assert_eq!((applied, actions), (expected, expected_actions));
}

#[test]
fn a_reply_forged_from_the_public_launch_id_derivation_is_refused() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (LAUNCHED_AT + 10, 3);
    let forged_output = Outcome::Succeeded(json!({"forged": true}));
    // Everything a forger can know: the launch id, and tokens of other executions or launches.
    for token in [
        String::new(),
        launch_id(EXEC, 0, 1).simple().to_string(),
        reply_token(&record.secret, launch_id(EXEC, 0, 2)),
        reply_token("another execution's secret", launch_id(EXEC, 0, 1)),
    ] {
        let forged = from_worker(
            &record,
            token,
            &record.release_version.clone(),
            reply(0, 1, forged_output.clone()),
        );
        assert_eq!(
            m.rejected(&record, at, tok, &forged),
            Rejection::Unauthenticated(launch_id(EXEC, 0, 1))
        );
        assert!(m.rejected(&record, at, tok, &forged).is_unauthenticated());
    }
    // The genuine reply still applies afterwards (a refusal writes nothing).
    let (advanced, _) = m.commit(
        &record,
        at,
        tok,
        &genuine(&record, 0, 1, reply(0, 1, Outcome::Succeeded(output(0)))),
    );
    assert_eq!(advanced.step, 1);
}

#[test]
fn a_forged_heartbeat_extends_nothing() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (LAUNCHED_AT + 10, 3);
    let forged = from_worker(
        &record,
        "0".repeat(32),
        &record.release_version.clone(),
        heartbeat(0, 1),
    );
    assert_eq!(
        m.rejected(&record, at, tok, &forged),
        Rejection::Unauthenticated(launch_id(EXEC, 0, 1))
    );
}

#[test]
fn a_reply_naming_another_release_is_refused() {
    let m = Machine::of(three_steps());
    let record = m.running();
    let (at, tok) = (LAUNCHED_AT + 10, 3);
    let token = reply_token(&record.secret, launch_id(EXEC, 0, 1));
    let other = from_worker(
        &record,
        token,
        "9",
        reply(0, 1, Outcome::Succeeded(output(0))),
    );
    let rejection = m.rejected(&record, at, tok, &other);
    assert_eq!(rejection.code(), "IDENTITY_MISMATCH");
    assert!(!rejection.is_unauthenticated());
}

#[test]
fn heartbeats_extend_an_attempt_only_up_to_its_bound() {
    let m = Machine::of(three_steps());
    let mut record = m.running();
    let bound = LAUNCHED_AT + i64::from(MAX_HEARTBEAT_TIMEOUTS) * TIMEOUT_MS[0];
    let mut now = LAUNCHED_AT;
    let mut beats = 0;
    loop {
        now += TIMEOUT_MS[0] / 2;
        let event = genuine(&record, 0, 1, heartbeat(0, 1));
        match m.decide(&record, now, 10 + beats, &event) {
            Decision::Commit { record: next, .. } => {
                assert!(next.wake_at.unwrap() <= ts(bound), "never past the bound");
                record = *next;
                beats += 1;
            }
            Decision::Skip(skip) => {
                assert_eq!(skip, Skip::Capped);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(beats < 100, "heartbeats must stop extending");
    }
    assert_eq!(record.wake_at, Some(ts(bound)));
}
