//! The workspace's binaries as tests and the benchmark run them: built by the cargo that runs the tests
//! (a test target gets only its own package's binaries built), found in that cargo's profile directory.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Result};

/// Builds the binaries of `packages` (of the whole workspace when empty), quietly.
pub fn build(packages: &[&str]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args(["build", "--bins", "--quiet"])
        .current_dir(crate::workspace_root());
    if packages.is_empty() {
        command.arg("--workspace");
    }
    for package in packages {
        command.args(["-p", package]);
    }
    ensure!(
        command.status()?.success(),
        "building the binaries of {packages:?} failed"
    );
    Ok(())
}

/// Where cargo puts the binaries of the running test's profile (the test executable is in its `deps`).
pub fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf()
}
