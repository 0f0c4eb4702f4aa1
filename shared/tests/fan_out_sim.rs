//! A fan-out in the deterministic simulation (`stepline::sim::fan_out`): the real handlers, worker
//! runtime and ledger protocol over in-memory ports, with crashes, duplicate deliveries and
//! reordering. `STEPLINE_FAN_OUT_CHILDREN` sets the large run's children (default 100,000).

use std::io::Write;

use stepline::domain::Status;
use stepline::sim::fan_out::{run, FanOutConfig, FanOutReport};

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
fn a_hundred_thousand_children_are_each_counted_once_under_crashes_and_duplicates() {
    let children = std::env::var("STEPLINE_FAN_OUT_CHILDREN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let config = FanOutConfig {
        children,
        failing_every: 1000,
        tolerated: children / 1000,
        ..FanOutConfig::default()
    };
    let report = run(7, &config);
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
    for seed in 0..20 {
        for (failing_every, tolerated) in [(0, 0), (5, 100), (5, 1)] {
            let config = FanOutConfig {
                children: 40,
                failing_every,
                tolerated,
                crash_rate: 0.05,
                duplicate_rate: 0.1,
                broken_store: false,
                window: None,
                cancel_after: None,
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
    for seed in 0..5 {
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
