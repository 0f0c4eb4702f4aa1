//! The fault campaign: thousands of seeded schedules of the real handlers over simulated DynamoDB and
//! SQS, with crashes before and after every port call, duplicates, reordering, garbage and zombie lease
//! holders. `STEPLINE_CAMPAIGN_SEEDS` sets the number of schedules (default 10,000),
//! `STEPLINE_CAMPAIGN_FIRST_SEED` the first seed (to reproduce a failure: the seed and a count of 1).

use std::io::Write;

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
    let count = env_u64("STEPLINE_CAMPAIGN_SEEDS", 10_000);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let report = campaign(first..first + count, &SimConfig::default(), threads);
    say(&format!(
        "fault campaign: {} schedules, {} violations",
        report.schedules,
        report.violations.len()
    ));
    say(&format!(
        "fault campaign: {} invocations, {} crashes, {} duplicates, {} garbage messages, \
         {} fenced writes, {} step timeouts, {} executions succeeded, {} failed as planned",
        report.counts.invocations,
        report.counts.crashes,
        report.counts.duplicates,
        report.counts.garbage,
        report.counts.fenced_writes,
        report.counts.timeouts,
        report.counts.succeeded,
        report.counts.failed
    ));
    for (seed, violation) in report.violations.iter().take(20) {
        say(&format!("  seed {seed}: {violation}"));
    }
    assert_eq!(report.schedules as u64, count);
    // The campaign must actually exercise the faults it claims to.
    assert!(report.counts.crashes > 0 && report.counts.duplicates > 0 && report.counts.garbage > 0);
    assert!(report.counts.fenced_writes > 0, "no write ever lost a race");
    assert!(report.counts.succeeded > 0 && report.counts.failed > 0);
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
