//! The example demos (`stepline-local demo`), driven as processes on the local emulator.

mod support;

use support::run;

#[test]
fn every_example_demo_succeeds() {
    stepline_local::needs_emulator!();
    for example in ["orders", "restaurant", "csv"] {
        let out = run(
            env!("CARGO_BIN_EXE_stepline-local"),
            &["demo", "--example", example, "--executions", "3"],
        );
        assert!(
            out.status.success(),
            "{example} demo failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_csv_demo_pays_a_generated_batch_each_row_once() {
    stepline_local::needs_emulator!();
    let out = run(
        env!("CARGO_BIN_EXE_stepline-local"),
        &[
            "demo",
            "--example",
            "csv",
            "--rows",
            "150",
            "--timeout-secs",
            "300",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "csv demo of 150 rows failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 150 rows: one malformed (row 99), two declined (rows 49 and 149), the rest paid once each.
    assert!(
        stdout.contains("SUCCEEDED") && stdout.contains("147 paid, 2 failed, 1 bad rows"),
        "{stdout}"
    );
    assert!(
        stdout.contains("149 rows sent to the bank, 0 of them under more than one reference"),
        "{stdout}"
    );
}
