//! Dead letters: a failure marks its envelope in the same commit; `DeadLetterSent` marks it sent and
//! the sweeper re-sends it until then.

use stepline::domain::execution::DeadLetterMark;
use stepline::domain::{Action, Event, Skip, Status};

use crate::fixtures::*;

#[test]
fn terminal_failure_marks_a_dead_letter_in_the_same_commit_and_sends_it() {
    let m = Machine::of(three_steps());
    let at = T0 + 7_000;
    let (failed, id) = m.dead_lettered(at);

    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.dead_letter, Some(DeadLetterMark { id, sent: false }));
    assert_eq!(failed.wake_at, Some(ts(at + LEASE_MS)));
    assert_eq!(
        failed.due_at(),
        Some(ts(at + LEASE_MS)),
        "due again if never marked sent"
    );
    assert_eq!(failed.lease, None);
}

#[test]
fn dead_letter_sent_marks_it_sent_and_takes_the_execution_off_the_due_index() {
    let m = Machine::of(three_steps());
    let at = T0 + 7_000;
    let (failed, id) = m.dead_lettered(at);

    let (next, actions) = m.commit(&failed, at + 50, 4, &Event::DeadLetterSent { id });

    assert!(actions.is_empty());
    assert_eq!(next.status, Status::Failed);
    assert_eq!(next.dead_letter, Some(DeadLetterMark { id, sent: true }));
    assert_eq!(next.error, Some(fatal()), "the failure stays on record");
    assert_eq!(next.wake_at, None);
    assert_eq!(next.due_at(), None);
    assert_eq!(
        m.skipped(&next, at + 10 * LEASE_MS, 5, &Event::Claim),
        Skip::Terminal
    );
}

#[test]
fn claim_of_failed_execution_whose_dead_letter_is_unsent_sends_it_again() {
    let m = Machine::of(three_steps());
    let at = T0 + 7_000;
    let (failed, id) = m.dead_lettered(at);
    assert_eq!(
        m.skipped(&failed, at + LEASE_MS - 1, 4, &Event::Claim),
        Skip::Terminal
    );

    let (next, actions) = m.commit(&failed, at + LEASE_MS, 4, &Event::Claim);

    assert_eq!(
        actions,
        vec![Action::SendDeadLetter { id }],
        "the same envelope id"
    );
    assert_eq!(next.status, Status::Failed);
    assert_eq!(next.dead_letter, Some(DeadLetterMark { id, sent: false }));
    assert_eq!(
        next.wake_at,
        Some(ts(at + 2 * LEASE_MS)),
        "looked at again a lease later"
    );
    assert_eq!(
        (next.lease, next.generation),
        (None, failed.generation),
        "no lease is taken to re-send a dead letter"
    );
}

#[test]
fn dead_letter_sent_for_another_failure_is_skipped_as_stale() {
    let m = Machine::of(three_steps());
    let at = T0 + 100_000;
    let (failed, requeued, actions) = m.requeued(at);
    let first = failed.dead_letter.as_ref().expect("dead letter marked").id;
    assert_eq!(
        m.skipped(&requeued, at + 1, 51, &Event::DeadLetterSent { id: first }),
        Skip::Stale
    );

    let (launched, _) = m.launch(&requeued, at + 100, 51, &actions);
    let (failed_again, actions) = m.commit(&launched, at + 200, 52, &err_reply(0, 4, &fatal()));
    let second = dead_letter_of(&actions);
    assert_ne!(second, first, "each failure has its own dead-letter id");
    assert_eq!(
        m.skipped(
            &failed_again,
            at + 300,
            53,
            &Event::DeadLetterSent { id: first }
        ),
        Skip::Stale
    );
    let (reported, _) = m.commit(
        &failed_again,
        at + 300,
        53,
        &Event::DeadLetterSent { id: second },
    );
    assert_eq!(
        reported.dead_letter,
        Some(DeadLetterMark {
            id: second,
            sent: true
        })
    );
}
