//! How big the simulation tests run and on which seeds. `STEPLINE_TIER=full` (infra/test.sh --full)
//! runs them at soak size, anything else at the quick tier's. Each run takes fresh seeds: the run's
//! `STEPLINE_SEED` when set (infra/test.sh sets and prints it), otherwise a random one, printed here;
//! setting it again reproduces the run's schedules.
#![allow(dead_code)]

use std::io::Write;

/// `quick` or `full`, as the tier says.
pub fn size(quick: u64, full: u64) -> u64 {
    match std::env::var("STEPLINE_TIER").as_deref() {
        Ok("full") => full,
        _ => quick,
    }
}

/// A number from the environment variable `name`, if set.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The first seed of this run's schedules.
pub fn seed() -> u64 {
    env_u64("STEPLINE_SEED").unwrap_or_else(|| {
        let seed = fastrand::u64(..1 << 40);
        say(&format!(
            "fresh seed {seed} (reproduce with STEPLINE_SEED={seed})"
        ));
        seed
    })
}

/// Printed past the test harness's capture, so the line shows in every run.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
