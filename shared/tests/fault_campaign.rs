//! The fault campaign: thousands of seeded schedules of the real handlers over simulated DynamoDB and
//! SQS, with crashes before and after every port call, duplicates, reordering, garbage and zombie lease
//! holders. `STEPLINE_CAMPAIGN_SEEDS` sets the number of schedules (default 100,000),
//! `STEPLINE_CAMPAIGN_FIRST_SEED` the first seed (to reproduce a failure: the seed and a count of 1).

use std::io::Write;

use stepline::planted::Bug;
use stepline::sim::{campaign, run, SimConfig};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Printed past the test harness's capture, so the campaign's line shows in every run.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[test]
fn fault_campaign_finds_no_violation() {
    let first = env_u64("STEPLINE_CAMPAIGN_FIRST_SEED", 0);
    let count = env_u64("STEPLINE_CAMPAIGN_SEEDS", 100_000);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let report = campaign(first..first + count, &SimConfig::default(), threads);
    say(&format!(
        "fault campaign: {} schedules, {} violations",
        report.schedules,
        report.violations.len()
    ));
    say(&format!(
        "fault campaign coverage: {}",
        report.counts.line()
    ));
    for (seed, violation) in report.violations.iter().take(20) {
        say(&format!("  seed {seed}: {violation}"));
    }
    assert_eq!(report.schedules as u64, count);
    // A large campaign must exercise every fault and feature it claims to (a single seed, run to
    // reproduce a failure, need not).
    if count >= 1_000 {
        let c = &report.counts;
        for (name, n) in [
            ("crashes", c.crashes),
            ("lost responses", c.lost_responses),
            ("duplicates", c.duplicates),
            ("garbage", c.garbage),
            ("forged replies", c.forged),
            ("lost races", c.fenced_writes),
            ("zombie-making jumps", c.lease_expiries),
            ("parked messages", c.parked),
            ("stale index reads", c.stale_index_reads),
            ("paged queries", c.paged_queries),
            ("sweeps cut short", c.sweeps_cut_short),
            ("shard count changes", c.shard_changes),
            ("retries", c.retries),
            ("heartbeats", c.heartbeats),
            ("approvals", c.approvals),
            ("rejections", c.rejections),
            ("await timeouts", c.await_timeouts),
            ("forged interaction tokens", c.forged_interactions),
            ("step timeouts", c.timeouts),
            ("oversized outputs", c.oversized),
            ("claim-checked payloads", c.claim_checked),
            ("cancels", c.cancels),
            ("re-drives", c.redrives),
            ("executions re-driven by bulk replay", c.replayed),
            ("successes", c.succeeded),
            ("planned failures", c.failed),
            ("cancelled executions", c.cancelled),
            ("fan-outs", c.fan_outs),
            ("fan-outs cancelled", c.fan_out_cancels),
            ("tolerated child failures", c.tolerated),
            ("history chunks journaled", c.journal_chunks),
            ("sealed requests", c.sealed_requests),
            ("replies with another request's seal", c.mixed_seals),
        ] {
            assert!(n > 0, "the campaign exercised no {name}");
        }
    }
    assert!(
        report.violations.is_empty(),
        "violations found; reproduce one with STEPLINE_CAMPAIGN_FIRST_SEED=<seed> STEPLINE_CAMPAIGN_SEEDS=1"
    );
}

#[test]
fn a_schedule_is_a_pure_function_of_its_seed() {
    let config = SimConfig::default();
    for seed in [3, 17, 4242] {
        let a = run(seed, &config);
        let b = run(seed, &config);
        assert_eq!(
            (
                a.counts.invocations,
                a.counts.crashes,
                a.counts.duplicates,
                a.counts.fenced_writes,
                a.violations.clone()
            ),
            (
                b.counts.invocations,
                b.counts.crashes,
                b.counts.duplicates,
                b.counts.fenced_writes,
                b.violations.clone()
            ),
            "seed {seed} is not reproducible"
        );
    }
}

#[test]
fn the_checker_catches_a_store_that_drops_the_version_condition() {
    let config = SimConfig {
        broken_store: true,
        ..SimConfig::default()
    };
    let report = campaign(0..300, &config, 2);
    say(&format!(
        "planted bug (store without version condition): {} schedules, {} violations",
        report.schedules,
        report.violations.len()
    ));
    assert!(
        report
            .violations
            .iter()
            .any(|(_, v)| v.contains("lost update") || v.contains("fenced holder committed")),
        "the broken store went unnoticed: {:?}",
        report.violations.iter().take(5).collect::<Vec<_>>()
    );
}

/// Runs the campaign against `bug` until it reports a violation (at most `seeds` schedules) and
/// returns the first one found.
fn caught(bug: Bug, config: SimConfig, seeds: u64) -> Option<(u64, String)> {
    let config = SimConfig {
        planted: Some(bug),
        ..config
    };
    (0..seeds).step_by(100).find_map(|first| {
        let report = campaign(first..first + 100, &config, 2);
        report.violations.into_iter().next()
    })
}

fn assert_caught(bug: Bug, config: SimConfig) {
    match caught(bug, config, 2_000) {
        Some((seed, violation)) => say(&format!(
            "planted bug {bug:?} caught: seed {seed}: {violation}"
        )),
        None => panic!("planted bug {bug:?} went unnoticed in 2,000 schedules"),
    }
}

#[test]
fn the_campaign_catches_launch_work_that_ignores_fencing() {
    assert_caught(Bug::LaunchIgnoresFencing, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_dropped_reply() {
    assert_caught(Bug::DropsReplies, SimConfig::default());
}

#[test]
fn the_campaign_catches_an_unauthenticated_reply_accepted() {
    assert_caught(Bug::AcceptsUnauthenticatedReplies, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_sweep_that_ignores_last_evaluated_key() {
    assert_caught(Bug::SweepIgnoresLastEvaluatedKey, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_retry_after_a_lost_response_that_drops_the_send() {
    assert_caught(Bug::LostResponseDropsSend, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_dropped_fan_out_notice() {
    // Fan-out schedules only.
    let config = SimConfig {
        fan_out_every: 1,
        ..SimConfig::default()
    };
    assert_caught(Bug::DropsFanOutNotices, config);
}

#[test]
fn the_campaign_catches_history_dropped_before_its_journal_chunk_is_written() {
    assert_caught(Bug::SkipsHistoryJournal, SimConfig::default());
}

#[test]
fn without_a_planted_bug_those_schedules_are_clean() {
    // The schedules the planted-bug tests run, as they are: no violation.
    let report = campaign(0..200, &SimConfig::default(), 2);
    assert!(
        report.violations.is_empty(),
        "{:?}",
        report.violations.first()
    );
    let fan_outs = SimConfig {
        fan_out_every: 1,
        ..SimConfig::default()
    };
    let report = campaign(0..200, &fan_outs, 2);
    assert!(
        report.violations.is_empty(),
        "{:?}",
        report.violations.first()
    );
}
