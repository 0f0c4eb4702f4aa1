//! The transition table in machine/ is complete and true: every (status, event kind) pair that
//! `decide` commits, for representative records of every status and representative events of every
//! kind, has a row; every row's statuses and kinds do commit; every row names tests, and those tests
//! exist under `shared/tests`; and the doc tables at the top of machine/mod.rs are the rows, rendered.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::json;
use stepline::domain::execution::{DeadLetterMark, LifecycleEvent, LifecycleKind};
use stepline::domain::machine::{Transition, ANY_STATUS, APPENDED, LIVE, TERMINAL, TRANSITIONS};
use stepline::domain::{
    decide, launch_id, Context, Decision, Event, EventKind, Execution, Outcome, ParentLink, Status,
    Verdict,
};
use uuid::Uuid;

use crate::fixtures::*;

/// A record of some status, with the machine (pipeline) it runs under.
struct Representative {
    label: String,
    machine: std::rc::Rc<Machine>,
    record: Execution,
}

/// Records in every status, reached through the machine (and a few shapes only old records or
/// other writers produce: a DLQ status, an outbox left unpublished, a parent not yet told).
fn representatives() -> Vec<Representative> {
    use std::rc::Rc;
    let tasks = Rc::new(Machine::of(three_steps()));
    let one_attempt = Rc::new(Machine::of(with_first_retry(
        stepline::domain::RetryPolicy::doubling(1, 2_500, 60_000),
    )));
    let long_wait = Rc::new(Machine::of(with_first_retry(
        stepline::domain::RetryPolicy::doubling(3, 2_000_000, 2_000_000),
    )));
    let approval = Rc::new(Machine::of(approval_pipeline(&["manager", "chef"])));
    let fan_out = Rc::new(Machine::of(fan_out_pipeline()));
    let fan_out_first = Rc::new(Machine::of(fan_out_first_pipeline()));
    let await_first = Rc::new(Machine::of(approval_first_pipeline()));
    let child = Rc::new(Machine::of(child_pipeline()));

    let claim = |m: &Machine, r: &Execution| {
        let at = r.due_at().expect("due");
        m.commit(r, at.millis(), 40, &Event::Claim).0
    };
    let mut found: Vec<(&str, &Rc<Machine>, Execution)> = Vec::new();
    let (started, _) = tasks.started();
    found.push(("started", &tasks, started));
    found.push(("running", &tasks, tasks.running()));
    found.push(("claimed running", &tasks, claim(&tasks, &tasks.running())));
    found.push(("claimed resent", &tasks, claim(&tasks, &tasks.resent())));
    found.push((
        "waiting for a retry",
        &tasks,
        tasks.failed_once(T0 + 7_000).0,
    ));
    found.push(("timed out", &tasks, tasks.timed_out().0));
    found.push(("second attempt", &tasks, tasks.second_attempt()));
    found.push(("long wait", &long_wait, long_wait.failed_once(T0 + 7_000).0));
    found.push(("later step", &tasks, tasks.running_at_step(2)));
    let exhausted = tasks.exhausted();
    let mut dlq = exhausted.clone();
    dlq.status = Status::Dlq;
    found.push(("exhausted", &tasks, exhausted.clone()));
    found.push(("dead-lettered", &tasks, dlq));
    let mut reported = exhausted;
    reported.dead_letter = reported
        .dead_letter
        .map(|d| DeadLetterMark { sent: true, ..d });
    reported.wake_at = None;
    found.push(("failed, reported", &tasks, reported));
    found.push(("redriven", &tasks, tasks.redriven(T0 + 100_000).0));
    let (timed_out, _) = one_attempt.timed_out();
    let requeued = one_attempt
        .commit(
            &timed_out,
            TIMED_OUT_AT + 10,
            41,
            &redrive(timed_out.version, "again"),
        )
        .0;
    found.push(("requeued after a timeout", &one_attempt, requeued));
    found.push(("succeeded", &tasks, tasks.succeeded()));
    found.push(("cancelled", &tasks, tasks.cancelled()));
    let (unconfirmed, _) = approval.past_first_step(json!({}));
    found.push(("notice unconfirmed", &approval, unconfirmed.clone()));
    found.push(("claimed notice", &approval, claim(&approval, &unconfirmed)));
    let parked = approval.waiting();
    let deadline = parked.await_unit.as_ref().unwrap().deadline;
    let expired = approval
        .commit(&parked, deadline.millis(), 42, &Event::Claim)
        .0;
    found.push(("parked", &approval, parked));
    found.push(("claimed at the await deadline", &approval, expired));
    let (fanned, _) = fan_out.past_first_step(json!({"items": [1, 2]}));
    found.push(("fanned out", &fan_out, fanned));
    let (queued, _) = fan_out_first.start_with(json!({"items": [1]}));
    found.push(("fan-out queued", &fan_out_first, queued));
    let (queued, _) = fan_out_first.start_with(json!({"items": []}));
    found.push(("empty fan-out queued", &fan_out_first, queued));
    let (sourced, _) = fan_out.past_first_step(json!({"itemsFrom": {"bucket": "b", "key": "k"}}));
    found.push(("fanned out over an object", &fan_out, sourced));
    let (queued, _) = await_first.started();
    found.push(("await queued", &await_first, queued));
    found.push(("child", &child, child.running_child()));

    let mut all = Vec::new();
    for (label, machine, record) in found {
        let mut variants = vec![(label.to_string(), record.clone())];
        variants.push((format!("{label}, outbox unpublished"), unpublished(&record)));
        if record.parent.is_none() {
            variants.push((format!("{label}, of a parent"), with_parent(&record)));
        }
        for (label, record) in variants {
            all.push(Representative {
                label,
                machine: Rc::clone(machine),
                record,
            });
        }
    }
    all
}

fn unpublished(record: &Execution) -> Execution {
    let mut record = record.clone();
    record.events.push(LifecycleEvent {
        seq: record.event_seq,
        kind: LifecycleKind::ExecutionStarted,
        at: record.updated_at,
        step: None,
        code: None,
    });
    record.event_seq += 1;
    record.publish_by = Some(record.updated_at + LEASE);
    record
}

fn with_parent(record: &Execution) -> Execution {
    let mut record = record.clone();
    record.parent = Some(ParentLink {
        execution_id: Uuid::from_u128(77),
        interaction: "item-0".into(),
        token: "t0".into(),
        complete_to: "replies".into(),
        unit: Some(Uuid::from_u128(78)),
        step: 1,
        signature: None,
    });
    if record.status.is_terminal() && record.wake_at.is_none() {
        record.wake_at = Some(record.updated_at + LEASE);
    }
    record
}

/// Events of every kind that could apply to `r`: its own lease, launches, dead letter, await unit and
/// outbox, and their neighbours (earlier and later attempts, the other verdict).
fn events_for(r: &Execution) -> Vec<Event> {
    let mut events = vec![
        Event::Claim,
        redrive(r.version, "coverage"),
        cancel("coverage"),
        incident("COVERAGE"),
        Event::ParentNotified,
        Event::EventsPublished {
            through: r.event_seq.saturating_sub(1),
        },
    ];
    if let Some(lease) = &r.lease {
        events.push(Event::LaunchWork {
            generation: r.generation,
            token: lease.token,
        });
    }
    let outcomes = [
        Outcome::Succeeded(json!({"items": [1]})),
        Outcome::Failed(retryable()),
        Outcome::Failed(fatal()),
    ];
    for step in r.step.saturating_sub(1)..=r.step {
        for attempt in 0..=r.attempt + 1 {
            let launch = launch_id(r.id, step, attempt);
            for outcome in &outcomes {
                let reply = Event::Reply {
                    launch_id: launch,
                    step,
                    attempt,
                    fingerprint: fingerprint(outcome),
                    outcome: outcome.clone(),
                };
                events.push(genuine(r, step, attempt, reply.clone()));
                events.push(reply);
            }
            let beat = Event::Heartbeat {
                launch_id: launch,
                step,
                attempt,
            };
            events.push(genuine(r, step, attempt, beat.clone()));
            events.push(beat);
        }
    }
    if let Some(mark) = &r.dead_letter {
        events.push(Event::DeadLetterSent { id: mark.id });
    }
    if let Some(parent) = &r.parent {
        for unit in [parent.unit, Some(Uuid::from_u128(99))] {
            events.push(Event::Rejoin {
                token: parent.token.clone(),
                unit,
            });
        }
        events.push(Event::Rejoin {
            token: "forged".into(),
            unit: Some(Uuid::from_u128(99)),
        });
        for token in [parent.token.clone(), "forged".into()] {
            events.push(Event::CancelFromParent {
                token,
                reason: "coverage".into(),
            });
        }
    }
    if let Some(unit) = &r.await_unit {
        events.push(Event::AwaitNoticeSent { unit: unit.id });
        for items in [Ok(2), Ok(0), Err(fatal())] {
            events.push(Event::FanOutSized {
                unit: unit.id,
                items,
            });
        }
        if let Some(fan_out) = unit.fan_out {
            // Settled: all succeeded, all failed, and one short of all.
            for (succeeded, failed) in [
                (fan_out.items, 0),
                (0, fan_out.items),
                (fan_out.items - 1, 0),
            ] {
                events.push(Event::FanOutSettled {
                    unit: unit.id,
                    tally: stepline::domain::Tally { succeeded, failed },
                    results: json!([]),
                });
            }
        }
        for interaction in &unit.interactions {
            for verdict in [Verdict::Approved, Verdict::Rejected] {
                let payload = json!({"reason": "coverage"});
                events.push(complete(
                    &interaction.id,
                    &interaction.token,
                    verdict,
                    payload,
                ));
            }
        }
    }
    events
}

/// When to decide: just after the record's last write, and at each time it becomes due.
fn times_for(r: &Execution) -> BTreeSet<i64> {
    let lease = r.lease.as_ref().map(|l| l.expires_at);
    [
        Some(r.updated_at + std::time::Duration::from_millis(1)),
        r.due_at(),
        r.wake_at,
        r.publish_by,
        lease,
    ]
    .into_iter()
    .flatten()
    .map(|t| t.millis())
    .collect()
}

/// Every (status, event kind) pair that commits on some representative, with the first
/// representative and event seen committing it.
fn committed_pairs() -> BTreeMap<(&'static str, EventKind), String> {
    let mut pairs = BTreeMap::new();
    for rep in representatives() {
        for now in times_for(&rep.record) {
            for lifecycle in [false, true] {
                let context = Context {
                    lifecycle,
                    ..ctx(now, 60)
                };
                for event in events_for(&rep.record) {
                    let decision = decide(&rep.record, &rep.machine.def, &context, &event);
                    if let Decision::Commit { record, actions } = decision {
                        assert_commit_invariants(&rep.record, &record, &actions, &context);
                        pairs
                            .entry((rep.record.status.as_str(), event.kind()))
                            .or_insert_with(|| format!("{event:?} on {}", rep.label));
                    }
                }
            }
        }
    }
    pairs
}

fn covers(row: &Transition, status: &str, kind: EventKind) -> bool {
    row.from.iter().any(|s| s.as_str() == status) && row.events.contains(&kind)
}

#[test]
fn every_transition_the_machine_commits_has_a_row_and_every_row_commits() {
    let committed = committed_pairs();
    let missing: Vec<_> = committed
        .iter()
        .filter(|((status, kind), _)| !TRANSITIONS.iter().any(|row| covers(row, status, *kind)))
        .collect();
    assert!(
        missing.is_empty(),
        "(status, event) pairs that commit with no row in machine::TRANSITIONS: {missing:?}"
    );
    let commits =
        |status: &Status, kind: &EventKind| committed.contains_key(&(status.as_str(), *kind));
    for row in TRANSITIONS.iter().chain(APPENDED) {
        let idle_statuses = idle(row.from, row.events, commits);
        let idle_kinds = idle(row.events, row.from, |kind, status| commits(status, kind));
        assert!(
            idle_statuses.is_empty(),
            "no {:?} event commits from {idle_statuses:?}, yet the row says so: {row:?}",
            row.events
        );
        assert!(
            idle_kinds.is_empty(),
            "no {idle_kinds:?} commits from {:?}, yet the row says so: {row:?}",
            row.from
        );
    }
}

/// The members of `of` that commit with no member of `with` (`commits` says whether a pair commits).
fn idle<'a, A, B>(of: &'a [A], with: &[B], commits: impl Fn(&A, &B) -> bool) -> Vec<&'a A> {
    of.iter()
        .filter(|a| !with.iter().any(|b| commits(a, b)))
        .collect()
}

/// The sources of every test under `shared/tests`, as trimmed lines.
fn test_sources() -> Vec<String> {
    fn read(dir: &Path, lines: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("the tests directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                read(&path, lines);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a test source");
                lines.extend(text.lines().map(|l| l.trim().to_string()));
            }
        }
    }
    let mut lines = Vec::new();
    read(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"),
        &mut lines,
    );
    lines
}

#[test]
fn every_row_names_tests_that_exist() {
    let lines = test_sources();
    let is_test = |name: &str| {
        let signature = format!("fn {name}(");
        lines
            .windows(2)
            .any(|pair| pair[0].ends_with("test]") && pair[1].starts_with(&signature))
    };
    for row in TRANSITIONS.iter().chain(APPENDED) {
        assert!(!row.tests.is_empty(), "a row without tests: {row:?}");
        for name in row.tests {
            assert!(
                is_test(name),
                "no test fn {name} under shared/tests: {row:?}"
            );
        }
    }
}

fn statuses(from: &[Status]) -> String {
    if from == ANY_STATUS {
        "any".into()
    } else if from == LIVE {
        "not terminal".into()
    } else if from == TERMINAL {
        "terminal".into()
    } else {
        let names: Vec<_> = from.iter().map(|s| s.as_str()).collect();
        names.join("/")
    }
}

fn kinds(events: &[EventKind]) -> String {
    if events == EventKind::ALL {
        return "any".into();
    }
    let names: Vec<_> = events.iter().map(|k| format!("{k:?}")).collect();
    names.join("/")
}

/// `rows` as a Markdown table in `//!` lines, columns padded to their widest cell.
fn render(rows: &[Transition], effect: &str) -> Vec<String> {
    let mut cells = vec![[
        "status".to_string(),
        "event".to_string(),
        "guard".to_string(),
        effect.to_string(),
    ]];
    for row in rows {
        cells.push([
            statuses(row.from),
            kinds(row.events),
            row.guard.to_string(),
            row.effect.to_string(),
        ]);
    }
    let width = |c: usize| cells.iter().map(|r| r[c].chars().count()).max().unwrap();
    let widths = [width(0), width(1), width(2), width(3)];
    let line = |r: &[String; 4]| {
        let padded: Vec<String> = (0..4)
            .map(|c| format!("{}{}", r[c], " ".repeat(widths[c] - r[c].chars().count())))
            .collect();
        format!("//! | {} |", padded.join(" | "))
    };
    let rule: Vec<String> = widths.iter().map(|w| "-".repeat(w + 2)).collect();
    let mut lines = vec![line(&cells[0]), format!("//! |{}|", rule.join("|"))];
    lines.extend(cells[1..].iter().map(line));
    lines
}

#[test]
fn the_doc_tables_of_the_machine_are_its_rows() {
    let source = include_str!("../../domain/src/machine/mod.rs");
    let documented: Vec<&str> = source.lines().filter(|l| l.starts_with("//! |")).collect();
    let mut rendered = render(TRANSITIONS, "next status / effect");
    rendered.extend(render(APPENDED, "effect added"));
    assert!(
        documented == rendered,
        "the doc tables of machine/mod.rs differ from machine::TRANSITIONS and APPENDED; they read:\n{}",
        rendered.join("\n")
    );
}
