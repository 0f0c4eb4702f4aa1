//! The workspace's binaries as tests and the benchmark run them. They are built by the build that runs
//! the tests (`infra/test.sh` runs `cargo build --workspace --bins` first: a test target gets only its
//! own package's binaries from cargo), never by a test, and found in that build's profile directory.

use std::path::PathBuf;

use anyhow::{ensure, Result};

/// Where cargo puts the binaries of the running test's profile (the test executable is in its `deps`).
pub fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("target dir")
        .to_path_buf()
}

/// The path of the workspace binary `name`, which the build must have made.
pub fn path(name: &str) -> Result<PathBuf> {
    let path = dir().join(name);
    ensure!(
        path.is_file(),
        "{} is missing: build the binaries first with cargo build --workspace --bins (infra/test.sh does)",
        path.display()
    );
    Ok(path)
}
