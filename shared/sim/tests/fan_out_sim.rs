//! A fan-out in the deterministic simulation (`stepline_sim::fan_out`): the real handlers, worker
//! runtime and ledger protocol over in-memory ports, with crashes, duplicate deliveries and
//! reordering. The large run has 100,000 children in the full tier and 10,000 in the quick one
//! (`STEPLINE_FAN_OUT_CHILDREN` sets them); every run takes its schedules from the run's seed
//! (`STEPLINE_SEED`, fresh every run and printed), which reproduces them.

mod soak;

use std::io::Write;

use stepline::domain::Status;
use stepline_sim::fan_out::{run, FanOutConfig, FanOutReport};

fn say(report: &FanOutReport, children: u32) {
    let _ = writeln!(
        std::io::stderr().lock(),
        "fan-out sim seed {}: {children} children, {:?}, tally {:?}; {} invocations, {} deliveries, \
         {} crashes, {} duplicates, {} sweeps, {} step runs for {} rows paid (each under one \
         reference), {} ledger writes, {} parent writes, {} resumptions, at most {} running",
        report.seed,
        report.status,
        report.tally,
        report.invocations,
        report.deliveries,
        report.crashes,
        report.duplicates,
        report.sweeps,
        report.step_runs,
        report.rows_paid,
        report.ledger_writes,
        report.parent_writes,
        report.resumptions,
        report.most_running
    );
}

#[test]
fn a_large_fan_out_counts_each_child_once_under_crashes_and_duplicates() {
    let children = soak::env_u64("STEPLINE_FAN_OUT_CHILDREN")
        .unwrap_or_else(|| soak::size(10_000, 100_000)) as u32;
    let config = FanOutConfig {
        children,
        failing_every: 1000,
        tolerated: children / 1000,
        ..FanOutConfig::default()
    };
    let report = run(soak::seed(), &config);
    say(&report, children);
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert!(
        report.crashes > 0 && report.duplicates > 0,
        "faults were injected"
    );
    assert_eq!(
        report.status,
        Some(Status::Running),
        "resumed at its next step"
    );
}

#[test]
fn small_fan_outs_settle_once_under_many_schedules() {
    let first = soak::seed();
    for seed in first..first + 20 {
        // The last: every failed child re-driven while its parent waits, counted once.
        for (failing_every, tolerated, redrive_failed) in
            [(0, 0, false), (5, 100, false), (5, 1, false), (5, 40, true)]
        {
            let config = FanOutConfig {
                children: 40,
                failing_every,
                tolerated,
                crash_rate: 0.05,
                duplicate_rate: 0.1,
                broken_store: false,
                window: None,
                cancel_after: None,
                redrive_failed,
            };
            let report = run(seed, &config);
            assert!(
                report.violations.is_empty(),
                "seed {seed}, {config:?}: {:?}",
                report.violations
            );
        }
    }
}

#[test]
fn the_checker_catches_a_parent_resumed_twice() {
    // A store that ignores the version condition lets two settlers both resume the parent.
    let caught = (0..200).any(|seed| {
        let config = FanOutConfig {
            children: 20,
            crash_rate: 0.0,
            duplicate_rate: 0.5,
            broken_store: true,
            ..FanOutConfig::default()
        };
        run(seed, &config)
            .violations
            .iter()
            .any(|v| v.starts_with("the parent resumed"))
    });
    assert!(caught, "no schedule of the broken store was caught");
}

#[test]
fn a_window_keeps_at_most_so_many_children_running_under_crashes_and_duplicates() {
    let first = soak::seed();
    for seed in first..first + 5 {
        let config = FanOutConfig {
            children: 2000,
            window: Some(25),
            crash_rate: 0.02,
            ..FanOutConfig::default()
        };
        let report = run(seed, &config);
        say(&report, config.children);
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:?}",
            report.violations
        );
        assert!(
            report.most_running <= 25 && report.most_running > 1,
            "{}",
            report.most_running
        );
        assert_eq!(
            report.status,
            Some(Status::Running),
            "resumed at its next step"
        );
    }
}

#[test]
fn a_fan_out_schedule_is_a_pure_function_of_its_seed() {
    let config = FanOutConfig {
        children: 200,
        failing_every: 7,
        tolerated: 100,
        ..FanOutConfig::default()
    };
    let seed = soak::seed();
    let trace = |report: FanOutReport| {
        (
            report.invocations,
            report.deliveries,
            report.crashes,
            report.duplicates,
            report.ledger_writes,
            report.parent_writes,
            format!("{:?} {:?}", report.status, report.tally),
        )
    };
    assert_eq!(
        trace(run(seed, &config)),
        trace(run(seed, &config)),
        "seed {seed} is not reproducible"
    );
}
