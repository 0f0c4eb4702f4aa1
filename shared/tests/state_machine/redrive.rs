//! `Redrive`: an operator re-queues a failed execution with a new attempt budget.

use stepline::domain::history::What;
use stepline::domain::{launch_id, Event, Pin, RedriveNote, Rejection, Status};

use crate::fixtures::*;

#[test]
fn redrive_of_failed_execution_requeues_it_with_new_budget_audit_note_and_lease() {
    let m = Machine::of(three_steps());
    let failed = m.exhausted();
    assert_eq!(
        (failed.version, failed.generation, failed.attempt),
        (7, 3, 3)
    );
    let at = T0 + 100_000;
    let event = redrive(7, "gateway fixed");

    let (next, actions) = m.commit(&failed, at, 50, &event);

    assert_eq!(next.status, Status::Queued);
    assert_eq!(next.version, 8);
    assert_eq!((next.step, next.attempt), (0, 3));
    assert_eq!(
        next.budget_base, 3,
        "the new budget starts after the attempts made"
    );
    assert_eq!(next.attempts_in_budget(), 0);
    assert_eq!(next.error, None);
    assert_eq!(next.dead_letter, None);
    assert_eq!(next.wake_at, Some(ts(at)));
    assert_eq!(
        next.redrives,
        vec![RedriveNote {
            at: ts(at),
            reason: "gateway fixed".to_string(),
            from_status: Status::Failed,
            from_version: 7,
            from_release: None,
            to_release: None,
        }]
    );
    assert_eq!(next.generation, 4);
    assert_eq!(next.lease, leased(50, at + LEASE_MS));
    assert_eq!(enqueued(&actions), (4, token(50), 0));

    // The next attempt is number 4, the first of the new budget: a failure is retried again.
    let (launched, actions) = m.commit(&next, at + 100, 51, &launch_work_of(&actions));
    let fourth = launch_id(EXEC, 0, 4);
    assert_eq!(
        request_of(&actions),
        (0, 4, fourth, at + 100 + TIMEOUT_MS[0])
    );
    assert_eq!(launched.launch_id, Some(fourth));
    assert_eq!(launched.attempts_in_budget(), 1);
    let (retrying, _) = m.commit(&launched, at + 200, 52, &err_reply(0, 4, &retryable()));
    assert_eq!(retrying.status, Status::WaitRetry);
    assert_eq!(retrying.redrives.len(), 1, "the audit note is kept");
}

#[test]
fn redrive_onto_another_release_moves_the_pin_and_notes_both_releases() {
    let m = Machine::of(three_steps());
    let failed = m.exhausted();
    let pinned = failed.release_version.clone();
    let at = T0 + 100_000;
    let onto = Pin {
        release_version: "2".into(),
        contract_version: "c2".into(),
    };
    let event = Event::Redrive {
        expected_version: 7,
        reason: "pricing fixed in release 2".into(),
        onto: Some(onto.clone()),
    };

    let (next, actions) = m.commit(&failed, at, 50, &event);

    assert_eq!(next.status, Status::Queued);
    assert_eq!(
        (
            next.release_version.as_str(),
            next.contract_version.as_str()
        ),
        ("2", "c2"),
        "its later launches run release 2"
    );
    assert_eq!(next.step, failed.step, "from the step it stopped at");
    assert_eq!(next.budget_base, 3, "a new budget, as any re-drive");
    let note = next.redrives.last().expect("an audit note");
    assert_eq!(
        (note.from_release.as_deref(), note.to_release.as_deref()),
        (Some(pinned.as_str()), Some("2"))
    );
    assert_eq!(note.reason, "pricing fixed in release 2");
    assert_eq!(enqueued(&actions), (4, token(50), 0));
    let told = next
        .history
        .iter()
        .any(|e| matches!(&e.what, What::Redriven { release: Some(r), .. } if r == "2"));
    assert!(told, "its history tells of the move: {:?}", next.history);

    // Onto the release it is pinned to: a plain re-drive, nothing moved.
    let same = Event::Redrive {
        expected_version: 7,
        reason: "again".into(),
        onto: Some(Pin {
            release_version: pinned.clone(),
            contract_version: failed.contract_version.clone(),
        }),
    };
    let (again, _) = m.commit(&failed, at, 50, &same);
    assert_eq!(again.release_version, pinned);
    assert_eq!(again.redrives.last().unwrap().to_release, None);
}

#[test]
fn redrive_with_stale_expected_version_is_rejected_as_version_mismatch() {
    let m = Machine::of(three_steps());
    let failed = m.exhausted();
    for expected in [6, 8] {
        let event = redrive(expected, "retry");
        let rejection = m.rejected(&failed, T0 + 100_000, 50, &event);
        assert_eq!(
            rejection,
            Rejection::VersionMismatch {
                expected,
                actual: 7,
            }
        );
        assert_eq!(rejection.code(), "VERSION_CONFLICT");
    }
}

#[test]
fn redrive_of_execution_that_is_not_failed_is_rejected_as_not_redrivable() {
    let m = Machine::of(three_steps());
    let (queued, _) = m.started();
    let (waiting, _) = m.timed_out();
    for record in [m.running(), queued, waiting, m.succeeded(), m.cancelled()] {
        let event = redrive(record.version, "retry");
        let rejection = m.rejected(&record, T0 + 100_000, 50, &event);
        assert_eq!(rejection, Rejection::NotRedrivable(record.status));
        assert_eq!(rejection.code(), "NOT_REDRIVABLE");
    }
}
