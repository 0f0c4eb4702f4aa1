//! The example demos (`stepline-local demo`), driven as processes on the local emulator.

mod support;

use support::{require_emulator, run};

#[test]
fn every_example_demo_succeeds() {
    require_emulator();
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
