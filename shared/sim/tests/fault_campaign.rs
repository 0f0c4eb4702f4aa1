//! The fault campaign: seeded schedules of the real handlers over simulated DynamoDB and SQS, with
//! crashes before and after every port call, duplicates, reordering, garbage and zombie lease holders.
//! It runs 10,000 schedules in the quick tier and 100,000 in the full one (`STEPLINE_CAMPAIGN_SEEDS`
//! sets the number), from the run's seed on (`STEPLINE_SEED`, fresh every run and printed; or
//! `STEPLINE_CAMPAIGN_FIRST_SEED`). A violation names its seed: reproduce it with that seed and a count
//! of 1.

mod soak;

use soak::{env_u64, say};
use stepline::planted::Bug;
use stepline_sim::{campaign, run, SimConfig};

/// The campaign's seeds in this run.
fn seeds() -> std::ops::Range<u64> {
    let first = env_u64("STEPLINE_CAMPAIGN_FIRST_SEED").unwrap_or_else(soak::seed);
    let count = env_u64("STEPLINE_CAMPAIGN_SEEDS").unwrap_or_else(|| soak::size(10_000, 100_000));
    first..first + count
}

#[test]
fn fault_campaign_finds_no_violation() {
    let seeds = seeds();
    let count = seeds.end - seeds.start;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let report = campaign(seeds.clone(), &SimConfig::default(), threads);
    say(&format!(
        "fault campaign: seeds {}..{}: {} schedules, {} violations",
        seeds.start,
        seeds.end,
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
    // The seeds this run's campaign prints: its first, one in its middle and its last.
    let config = SimConfig::default();
    let seeds = seeds();
    for seed in [seeds.start, (seeds.start + seeds.end) / 2, seeds.end - 1] {
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

/// Fan-out schedules only.
fn fan_outs_only() -> SimConfig {
    SimConfig {
        fan_out_every: 1,
        ..SimConfig::default()
    }
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
    assert_caught(Bug::DropsFanOutNotices, fan_outs_only());
}

#[test]
fn the_campaign_catches_history_dropped_before_its_journal_chunk_is_written() {
    assert_caught(Bug::SkipsHistoryJournal, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_seal_accepted_without_its_authentication() {
    assert_caught(Bug::AcceptsUnauthenticatedSeals, SimConfig::default());
}

#[test]
fn the_campaign_catches_an_unauthenticated_message_that_writes() {
    assert_caught(Bug::UnauthenticatedMessagesWrite, SimConfig::default());
}

#[test]
fn the_campaign_catches_a_ledger_that_counts_a_child_twice() {
    assert_caught(Bug::LedgerCountsTwice, fan_outs_only());
}

#[test]
fn without_a_planted_bug_those_schedules_are_clean() {
    // The schedules the planted-bug tests run, as they are: no violation.
    for config in [SimConfig::default(), fan_outs_only()] {
        let report = campaign(0..200, &config, 2);
        assert!(
            report.violations.is_empty(),
            "{:?}",
            report.violations.first()
        );
    }
}
