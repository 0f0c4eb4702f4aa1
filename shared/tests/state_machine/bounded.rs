//! The record is bounded: its size does not grow with the pipeline's length or its history. Only the
//! current step's progress is kept; a step's earlier receipts, re-drive notes and incidents are capped.

use serde_json::json;
use stepline::domain::{
    launch_id, Event, PipelineDef, RetryPolicy, Skip, Status, MAX_EARLIER_RECEIPTS, MAX_INCIDENTS,
    MAX_INCIDENT_DETAIL, MAX_REDRIVE_NOTES,
};

use stepline::domain::history::JOURNAL_CHUNK;

use crate::fixtures::*;

fn long_pipeline(steps: usize) -> PipelineDef {
    let retry = RetryPolicy::doubling(3, 2_500, 60_000);
    PipelineDef::new(
        "long",
        "r1",
        (0..steps).map(|k| step(&format!("s{k}"), 60, retry.clone())),
    )
}

/// The record's size without its history (bounded on its own: see below).
fn stored_len(record: &stepline::domain::Execution) -> usize {
    let mut record = record.clone();
    record.history.clear();
    record.history_base = 0;
    serde_json::to_vec(&record)
        .expect("a record serializes")
        .len()
}

/// Every hop of a 1,000-step pipeline writes a record of the same size (within the digits of its
/// counters), and a late reply to any step it left is recognised without a receipt.
#[test]
fn a_thousand_step_pipeline_keeps_the_record_the_same_size() {
    let m = Machine::of(long_pipeline(1_000));
    let mut record = m.running_with(json!({"payload": "x".repeat(200)}));
    let mut sizes = Vec::new();
    for k in 0..1_000u32 {
        let at = T0 + 1_000 * (i64::from(k) + 1);
        let value = json!({"payload": "y".repeat(200), "step": k % 10});
        record = m
            .commit(&record, at, 10 + u128::from(k), &ok_reply(k, 1, value))
            .0;
        sizes.push(stored_len(&record));
        assert!(
            record.history.len() <= 2 * JOURNAL_CHUNK + 2,
            "the record holds a bounded history: {} entries at step {k}",
            record.history.len()
        );
    }
    // All but the last few entries went to the journal, a chunk at a time.
    assert_eq!(record.history_base % JOURNAL_CHUNK as u64, 0);
    assert_eq!(
        record.history_base + record.history.len() as u64,
        2 + 2 * 1_000
    );
    assert_eq!(record.status, Status::Succeeded);
    let running = &sizes[1..999];
    let (min, max) = (
        *running.iter().min().unwrap(),
        *running.iter().max().unwrap(),
    );
    assert!(
        max - min <= 16,
        "the record's size moves only with its counters' digits: {min}..{max} bytes"
    );
    let receipt = serde_json::to_vec(&record.steps[0].receipt).unwrap().len();
    assert!(
        sizes[999] <= max + receipt,
        "the final record holds the result for the input, and the last receipt: {} bytes",
        sizes[999]
    );
    for k in [0, 500, 998] {
        let late = ok_reply(k, 1, json!({"late": true}));
        assert_eq!(m.skipped(&record, T0 + 2_000_000, 9, &late), Skip::Terminal);
    }
}

/// A step retried many times keeps only its latest receipts; a success of an attempt older than
/// those is not adopted (its receipt may be gone), a recent one is.
#[test]
fn earlier_receipts_are_capped_and_only_recent_attempts_are_adopted() {
    let m = Machine::of(with_first_retry(RetryPolicy::doubling(20, 10, 100)));
    let mut record = m.running();
    let attempts = MAX_EARLIER_RECEIPTS as u32 + 5;
    for a in 1..=attempts {
        let at = T0 + 10_000 * i64::from(a);
        let (failed, actions) = m.commit(
            &record,
            at,
            100 + u128::from(a),
            &err_reply(0, a, &retryable()),
        );
        assert_eq!(failed.status, Status::WaitRetry);
        record = m
            .launch(&failed, at + 1_000, 200 + u128::from(a), &actions)
            .0;
    }
    assert_eq!(record.attempt, attempts + 1);
    let progress = &record.steps[0];
    assert_eq!(progress.earlier_receipts.len(), MAX_EARLIER_RECEIPTS);
    assert_eq!(
        progress.receipt.as_ref().map(|r| r.launch_id),
        Some(launch_id(EXEC, 0, attempts))
    );
    let at = T0 + 1_000_000;
    // Attempt 1 answered long ago and its receipt is gone: its "success" is not taken.
    assert_eq!(
        m.skipped(&record, at, 7, &ok_reply(0, 1, output(0))),
        Skip::Stale
    );
    // The latest failed attempt's receipt is kept: another reply of it is a conflict.
    let recent = attempts - MAX_EARLIER_RECEIPTS as u32;
    assert!(matches!(
        m.decide(&record, at, 7, &ok_reply(0, recent, output(0))),
        stepline::domain::Decision::Reject(_)
    ));
}

#[test]
fn redrive_notes_are_capped_and_keep_the_latest() {
    let m = Machine::of(three_steps());
    let mut record = m.exhausted();
    for n in 0..MAX_REDRIVE_NOTES + 3 {
        let at = T0 + 1_000_000 * (n as i64 + 1);
        let reason = format!("fix {n}");
        let (queued, actions) = m.commit(
            &record,
            at,
            300 + n as u128,
            &redrive(record.version, &reason),
        );
        let running = m.launch(&queued, at + 100, 400 + n as u128, &actions).0;
        let fatal_reply = err_reply(0, running.attempt, &fatal());
        record = m
            .commit(&running, at + 200, 500 + n as u128, &fatal_reply)
            .0;
        assert_eq!(record.status, Status::Failed);
    }
    assert_eq!(record.redrives.len(), MAX_REDRIVE_NOTES);
    assert_eq!(
        record.redrives.last().map(|n| n.reason.as_str()),
        Some(format!("fix {}", MAX_REDRIVE_NOTES + 2).as_str())
    );
    // An overlong reason is cut.
    let long = "r".repeat(10_000);
    let (queued, _) = m.commit(
        &record,
        T0 + 99_000_000,
        600,
        &redrive(record.version, &long),
    );
    assert!(queued.redrives.last().unwrap().reason.len() <= MAX_INCIDENT_DETAIL);
}

#[test]
fn incidents_are_capped_and_their_detail_cut() {
    let m = Machine::of(three_steps());
    let mut record = m.running();
    for n in 0..MAX_INCIDENTS + 2 {
        let event = Event::Incident {
            code: "UNDECODABLE".into(),
            detail: format!("{n}:{}", "d".repeat(10_000)),
        };
        record = m
            .commit(&record, T0 + 100_000 + n as i64, 700 + n as u128, &event)
            .0;
    }
    assert_eq!(record.incidents.len(), MAX_INCIDENTS);
    assert!(record
        .incidents
        .iter()
        .all(|i| i.detail.len() <= MAX_INCIDENT_DETAIL));
    assert!(record
        .incidents
        .last()
        .unwrap()
        .detail
        .starts_with(&format!("{}:", MAX_INCIDENTS + 1)));
}
