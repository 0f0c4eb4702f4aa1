//! What the test suites share about where and how big they run: the tier (`STEPLINE_TIER`), the seed of
//! a run (`STEPLINE_SEED`), and skipping a test that needs what this run does not have (the emulator, or
//! the full tier), said out loud rather than passed in silence.
//!
//! - `quick` (the default): every test, the simulations and emulator runs at sizes that answer in
//!   minutes; the tests that only make sense at soak size (a browser, a cold build, peak memory, the
//!   benchmark) are skipped, by name.
//! - `full`: everything, at soak size.
//!
//! A skipped test writes one line to standard error (past the test harness's capture) and, when
//! `STEPLINE_SKIPPED` names a file, appends it there, where `infra/test.sh` counts and prints it.
//! `STEPLINE_REQUIRE_EMULATOR=1` (set by `infra/test.sh`) turns a missing emulator into a failure.

use std::io::Write;

/// How big a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Quick,
    Full,
}

impl Tier {
    /// The tier `STEPLINE_TIER` names (`quick` when unset).
    ///
    /// # Panics
    /// On any other value, so that a misspelt tier never runs the wrong sizes quietly.
    pub fn current() -> Self {
        match std::env::var("STEPLINE_TIER").as_deref() {
            Err(_) | Ok("") | Ok("quick") => Tier::Quick,
            Ok("full") => Tier::Full,
            Ok(other) => panic!("STEPLINE_TIER={other}: expected quick or full"),
        }
    }

    /// `quick` in the quick tier, `full` in the full one.
    pub fn pick<T>(self, quick: T, full: T) -> T {
        match self {
            Tier::Quick => quick,
            Tier::Full => full,
        }
    }
}

/// The size a test runs at in the current tier.
pub fn sized<T>(quick: T, full: T) -> T {
    Tier::current().pick(quick, full)
}

/// The run's seed: `STEPLINE_SEED` when set (a run prints it; set it to reproduce), otherwise a fresh
/// one, printed.
pub fn seed() -> u64 {
    if let Some(seed) = std::env::var("STEPLINE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return seed;
    }
    let seed = fastrand::u64(..1 << 40);
    say(&format!(
        "{}: fresh seed {seed} (reproduce with STEPLINE_SEED={seed})",
        test_name()
    ));
    seed
}

/// The running test's name: libtest (and nextest, through it) names the test's thread after it.
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .map(str::to_owned)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .unwrap_or_default()
        })
}

/// A line on standard error that the test harness does not capture.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Records that the running test was skipped, and why.
pub fn skip(reason: &str) {
    let line = format!("skipped: {} ({reason})", test_name());
    say(&line);
    if let Some(path) = std::env::var_os("STEPLINE_SKIPPED") {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// Whether the emulator is there (`AWS_ENDPOINT_URL` set); records a skip when it is not.
///
/// # Panics
/// When it is not there but `STEPLINE_REQUIRE_EMULATOR` says it must be.
pub fn has_emulator() -> bool {
    if std::env::var_os("AWS_ENDPOINT_URL").is_some() {
        return true;
    }
    assert!(
        std::env::var_os("STEPLINE_REQUIRE_EMULATOR").is_none(),
        "AWS_ENDPOINT_URL is not set, and this run requires the emulator"
    );
    skip("needs the emulator: AWS_ENDPOINT_URL is unset; infra/test.sh starts one");
    false
}

/// Whether this is the full tier; records a skip when it is not.
pub fn is_full_tier(why: &str) -> bool {
    if Tier::current() == Tier::Full {
        return true;
    }
    skip(&format!("full tier only: {why}"));
    false
}

/// What a skipped test returns: `()` or `Ok(())`.
pub trait Skipped {
    fn skipped() -> Self;
}

impl Skipped for () {
    fn skipped() -> Self {}
}

impl<E> Skipped for Result<(), E> {
    fn skipped() -> Self {
        Ok(())
    }
}

/// Returns from the test (recording the skip) unless the emulator is there.
#[macro_export]
macro_rules! needs_emulator {
    () => {
        if !$crate::testing::has_emulator() {
            return $crate::testing::Skipped::skipped();
        }
    };
}

/// Returns from the test (recording the skip and `$why`) unless this is the full tier.
#[macro_export]
macro_rules! full_tier_only {
    ($why:expr) => {
        if !$crate::testing::is_full_tier($why) {
            return $crate::testing::Skipped::skipped();
        }
    };
}
