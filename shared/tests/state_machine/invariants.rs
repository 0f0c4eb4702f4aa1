//! Invariants over whole trails and over random event sequences.

use std::collections::HashSet;

use serde_json::{json, Value};
use stepline::domain::{
    decide, launch_id, start, Action, Context, Decision, Event, Execution, NewExecution, Outcome,
    Payload, PipelineDef, RetryPolicy, Skip, Status, StepError, StepStatus,
};
use uuid::Uuid;

use crate::fixtures::*;

/// Drives an execution through retries, a timeout, a failure, a redrive and success, and checks the
/// whole trail: versions strictly increasing by one, release / pipeline pinned, the input the current
/// step's.
#[test]
fn every_commit_advances_version_keeps_the_release_and_holds_the_current_steps_input() {
    let m = Machine::of(three_steps());
    let (first, actions) = m.started();
    let mut trail = vec![first.clone()];
    let mut record = first;

    let mut apply =
        |record: &Execution, at: i64, tok: u128, event: Event| -> (Execution, Vec<Action>) {
            let (next, actions) = m.commit(record, at, tok, &event);
            trail.push(next.clone());
            (next, actions)
        };

    let (r, _) = apply(&record, T0 + 100, 2, launch_work_of(&actions));
    let (r, a) = apply(&r, T0 + 1_000, 3, err_reply(0, 1, &retryable()));
    let (r, _) = apply(&r, T0 + 3_000, 4, launch_work_of(&a));
    let (r, _) = apply(&r, T0 + 4_000, 5, ok_reply(0, 2, output(0)));
    let deadline = T0 + 4_000 + TIMEOUT_MS[1];
    let (r, a) = apply(&r, deadline, 6, Event::Claim);
    let (r, _) = apply(&r, deadline + 1, 7, launch_work_of(&a));
    let (r, a) = apply(&r, deadline + 1 + TIMEOUT_MS[1], 8, Event::Claim);
    let (r, a) = apply(&r, deadline + 2 + TIMEOUT_MS[1], 9, launch_work_of(&a));
    let (r, _) = apply(&r, deadline + 300_000, 10, launch_work_of(&a));
    let (r, _) = apply(&r, deadline + 301_000, 11, err_reply(1, 2, &fatal()));
    assert_eq!(r.status, Status::Failed);
    let (r, a) = apply(&r, deadline + 400_000, 12, redrive(r.version, "fixed"));
    let (r, _) = apply(&r, deadline + 400_100, 13, launch_work_of(&a));
    let (r, _) = apply(&r, deadline + 401_000, 14, ok_reply(1, 3, output(1)));
    let (r, _) = apply(&r, deadline + 402_000, 15, ok_reply(2, 1, output(2)));
    record = r;
    assert_eq!(record.status, Status::Succeeded);

    assert_eq!(trail.len(), 15);
    for pair in trail.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        assert!(after.version > before.version, "version strictly increases");
        assert_eq!(after.version, before.version + 1);
        assert_eq!(after.release_version, "2024-06-01.1");
        assert_eq!(after.pipeline_id, "orders");
        // The current step's input: the execution's, then each output as its step succeeds, and
        // nothing once the execution succeeded.
        let expected = match (after.status, after.step) {
            (Status::Succeeded, _) => Payload::default(),
            (_, 0) => Payload::new(input()),
            (_, k) => Payload::new(output(k - 1)),
        };
        assert_eq!(after.input, expected);
    }
    assert_eq!(record.version, 15);
    assert_eq!(record.redrives.len(), 1);
}

/// A deterministic random walk: many sequences of events (fresh, stale, duplicated, forged and
/// out-of-order) applied at random times. Every commit must satisfy the commit invariants; every record
/// must stay consistent; a terminal execution commits nothing but a redrive.
#[test]
fn random_event_sequences_keep_commit_and_record_invariants() {
    let mut seen = Seen::default();
    for seed in 0..400 {
        walk(seed, &mut seen);
    }

    assert!(seen.commits > 3_000, "the walk commits: {}", seen.commits);
    for status in [
        "QUEUED",
        "RUNNING",
        "WAIT_RETRY",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ] {
        assert!(
            seen.statuses.contains(status),
            "the walk reaches {status}: {:?}",
            seen.statuses
        );
    }
    for skip in [
        Skip::NotDue,
        Skip::Terminal,
        Skip::Fenced,
        Skip::Stale,
        Skip::Duplicate,
    ] {
        assert!(
            seen.skips.contains(&format!("{skip:?}")),
            "the walk sees {skip:?}: {:?}",
            seen.skips
        );
    }
    for code in [
        "UNKNOWN_CORRELATION",
        "RECEIPT_CONFLICT",
        "VERSION_CONFLICT",
        "NOT_REDRIVABLE",
        "ALREADY_TERMINAL",
    ] {
        assert!(
            seen.rejections.contains(code),
            "the walk sees {code}: {:?}",
            seen.rejections
        );
    }
    assert!(
        seen.long_waits > 0,
        "the walk schedules retries beyond the SQS delay limit"
    );
    assert!(seen.redrives > 0, "the walk re-drives");
    assert!(seen.dead_letters > 0, "the walk dead-letters failures");
}

#[derive(Default)]
struct Seen {
    commits: usize,
    redrives: usize,
    dead_letters: usize,
    long_waits: usize,
    statuses: HashSet<&'static str>,
    skips: HashSet<String>,
    rejections: HashSet<&'static str>,
}

/// SplitMix64: a tiny deterministic generator, so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        if items.is_empty() {
            None
        } else {
            Some(items[self.below(items.len() as u64) as usize].clone())
        }
    }

    /// The last item most of the time, else any.
    fn pick_recent<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        if self.below(10) < 7 {
            items.last().cloned()
        } else {
            self.pick(items)
        }
    }
}

/// Short timeouts; step "c" retries after up to 20 min, often beyond the SQS delay limit.
fn walk_def() -> PipelineDef {
    PipelineDef {
        pipeline_id: "walk".to_string(),
        release_version: "r7".to_string(),
        steps: vec![
            step("a", 5, RetryPolicy::doubling(2, 1_000, 4_000)),
            step("b", 5, RetryPolicy::doubling(3, 2_000, 8_000)),
            step("c", 5, RetryPolicy::doubling(3, 1_200_000, 3_000_000)),
        ],
    }
}

fn worker_reply(rng: &mut Rng, step: u32, attempt: u32) -> Event {
    let outcome = match rng.below(10) {
        0..=5 => Outcome::Succeeded(json!({"step": step, "variant": rng.below(2)})),
        6..=8 => Outcome::Failed(StepError::new("BUSY", "try later", true)),
        _ => Outcome::Failed(StepError::new("BAD_INPUT", "rejected", false)),
    };
    reply(step, attempt, outcome)
}

/// What the walk has issued so far, to draw (re)deliveries from.
#[derive(Default)]
struct Issued {
    work: Vec<Event>,
    requests: Vec<(u32, u32)>,
    replies: Vec<Event>,
    dead_letters: Vec<Uuid>,
}

fn random_event(rng: &mut Rng, record: &Execution, issued: &Issued) -> Event {
    match rng.below(110) {
        0..=11 => Event::Claim,
        12..=31 => rng.pick_recent(&issued.work).unwrap_or(Event::Claim),
        32..=61 => match rng.pick_recent(&issued.requests) {
            Some((step, attempt)) => worker_reply(rng, step, attempt),
            None => Event::Claim,
        },
        62..=73 => rng.pick(&issued.replies).unwrap_or(Event::Claim),
        74..=81 => {
            let (step, attempt) = (rng.below(4) as u32, rng.below(6) as u32);
            worker_reply(rng, step, attempt)
        }
        82..=83 => Event::Reply {
            launch_id: Uuid::from_u128(u128::from(rng.next())),
            step: 0,
            attempt: 1,
            fingerprint: "forged".to_string(),
            outcome: Outcome::Succeeded(Value::Null),
        },
        84..=93 => redrive(record.version - rng.below(2), "walk"),
        94..=95 => cancel("walk"),
        96..=100 => match rng.pick_recent(&issued.requests) {
            Some((step, attempt)) => heartbeat(step, attempt),
            None => Event::Claim,
        },
        101..=105 => match rng.pick_recent(&issued.dead_letters) {
            Some(id) => Event::DeadLetterSent { id },
            None => Event::DeadLetterSent {
                id: Uuid::from_u128(u128::from(rng.next())),
            },
        },
        106..=107 => incident("WALK"),
        _ => Event::LaunchWork {
            generation: record.generation,
            token: token(1_000_000 + u128::from(rng.below(5))),
        },
    }
}

/// What must hold of every record the machine produces.
#[track_caller]
pub fn assert_record_consistent(r: &Execution, def: &PipelineDef) {
    let policy = &def.steps[r.step as usize].retry;
    assert!(
        r.attempts_in_budget() <= policy.max_attempts,
        "attempts within budget: {r:?}"
    );
    assert!(
        r.steps.len() <= 1 && r.first_step == r.step,
        "only the current step's progress is kept: {r:?}"
    );
    match r.status {
        Status::Running => {
            assert_eq!(
                r.launch_id,
                Some(launch_id(r.id, r.step, r.attempt)),
                "{r:?}"
            );
            assert_eq!(r.steps.len(), 1, "{r:?}");
            assert_eq!(r.steps[0].status, StepStatus::Launching, "{r:?}");
            assert!(
                r.wake_at.is_some(),
                "a running attempt has a deadline: {r:?}"
            );
        }
        Status::WaitRetry => {
            assert_eq!(r.launch_id, None, "{r:?}");
            assert!(r.wake_at.is_some(), "{r:?}");
            assert!(r.error.as_ref().is_some_and(|e| e.retryable), "{r:?}");
        }
        Status::Succeeded => {
            assert_eq!(r.step as usize, def.steps.len() - 1, "{r:?}");
            assert!(
                r.steps.iter().all(|p| p.status == StepStatus::Succeeded),
                "{r:?}"
            );
            assert!(
                r.result.is_some(),
                "a succeeded execution has its result: {r:?}"
            );
            assert!(r.input.is_null(), "the input is dropped at the end: {r:?}");
        }
        Status::Failed => {
            assert!(r.error.is_some(), "{r:?}");
            assert!(r.dead_letter.is_some(), "a failure is dead-lettered: {r:?}");
        }
        _ => {}
    }
    if r.status != Status::Failed {
        assert_eq!(
            r.dead_letter, None,
            "only a failure has a dead letter: {r:?}"
        );
    }
}

fn walk(seed: u64, seen: &mut Seen) {
    eprintln!("random walk seed {seed}");
    let def = walk_def();
    let mut rng = Rng(seed);
    let mut now = T0;
    let (mut record, actions) = start(NewExecution::of(EXEC, TENANT, &def, input()), &ctx(now, 0));
    let mut issued = Issued {
        work: vec![launch_work_of(&actions)],
        ..Issued::default()
    };

    for n in 1..=120u128 {
        match rng.below(6) {
            0 | 1 => now += rng.below(2_000) as i64,
            2 | 3 => {
                if let Some(due) = record.due_at() {
                    now = now.max(due.millis());
                }
            }
            4 => now += rng.below(20_000) as i64,
            _ => {}
        }
        let context = Context {
            now: ts(now),
            jitter: rng.below(1_000) as f64 / 1_000.0,
            token: token(n),
            secret: n.to_le_bytes(),
            owner: format!("walker-{seed}"),
            lease: std::time::Duration::from_secs(10),
            lifecycle: false,
        };
        let event = random_event(&mut rng, &record, &issued);
        match decide(&record, &def, &context, &event) {
            Decision::Commit {
                record: next,
                actions,
            } => {
                assert_commit_invariants(&record, &next, &actions, &context);
                if record.status.is_terminal() {
                    let allowed = match &event {
                        Event::Redrive { .. } => {
                            seen.redrives += 1;
                            matches!(record.status, Status::Failed | Status::Dlq)
                        }
                        Event::Claim | Event::DeadLetterSent { .. } => {
                            record.dead_letter.as_ref().is_some_and(|d| !d.sent)
                        }
                        Event::Incident { .. } => true,
                        _ => false,
                    };
                    assert!(
                        allowed,
                        "a terminal execution commits only a redrive, its dead letter or an incident: \
                         {event:?} on {record:?}"
                    );
                    if !matches!(event, Event::Redrive { .. }) {
                        assert_eq!(next.status, record.status, "and stays terminal");
                    }
                }
                for action in &actions {
                    match action {
                        Action::EnqueueLaunch {
                            generation, token, ..
                        } => issued.work.push(Event::LaunchWork {
                            generation: *generation,
                            token: *token,
                        }),
                        Action::SendRequest {
                            step,
                            attempt,
                            launch_id: id,
                            deadline,
                        } => {
                            assert_eq!(*id, launch_id(EXEC, *step, *attempt));
                            assert_eq!(*deadline, ts(now + 5_000));
                            issued.requests.push((*step, *attempt));
                        }
                        Action::SendDeadLetter { id } => {
                            assert_eq!(next.status, Status::Failed);
                            assert_eq!(next.dead_letter.as_ref().map(|d| d.id), Some(*id));
                            issued.dead_letters.push(*id);
                            seen.dead_letters += 1;
                        }
                        Action::NotifyCancel {
                            step,
                            launch_id: id,
                        } => {
                            assert_eq!(next.status, Status::Cancelled);
                            assert_eq!(record.launch_id, Some(*id));
                            assert_eq!(record.step, *step);
                        }
                        Action::SendAwaitNotice { .. } => {
                            panic!("this pipeline has no await step: {event:?}")
                        }
                        Action::PublishEvents => {
                            panic!("lifecycle events are off in this walk: {event:?}")
                        }
                        Action::NotifyParent => {
                            panic!("this execution has no parent: {event:?}")
                        }
                        Action::CancelChildren { .. } => {
                            panic!("this pipeline has no fan-out: {event:?}")
                        }
                    }
                }
                if next.status == Status::WaitRetry && next.lease.is_none() {
                    seen.long_waits += 1;
                }
                if matches!(event, Event::Reply { .. }) {
                    issued.replies.push(event);
                }
                record = *next;
                seen.commits += 1;
                assert_record_consistent(&record, &def);
            }
            Decision::Skip(skip) => {
                seen.skips.insert(format!("{skip:?}"));
            }
            Decision::Reject(rejection) => {
                seen.rejections.insert(rejection.code().as_str());
            }
        }
        seen.statuses.insert(record.status.as_str());
    }
}
