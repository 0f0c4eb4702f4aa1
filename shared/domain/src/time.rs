//! Time as the coordinator keeps it. A moment is a [`Timestamp`]: milliseconds since the Unix epoch,
//! UTC, stored and sent as that number (records, items, messages and the API keep their format). A
//! span is a [`std::time::Duration`]. A moment plus a span is a moment; a moment minus an earlier one
//! is a span; a moment is never mixed up with a span or a count. A moment has no `Display`: text
//! says which it wants, its milliseconds (keys, cursors) or its UTC reading (people).

use std::ops::{Add, Sub};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A moment, to the millisecond: milliseconds since 1970-01-01T00:00:00Z.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(i64);

impl Timestamp {
    /// 1970-01-01T00:00:00Z.
    pub const EPOCH: Self = Self(0);

    pub const fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the epoch: what is stored and sent.
    pub const fn millis(self) -> i64 {
        self.0
    }

    /// Now, by the system's clock.
    pub fn now() -> Self {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Self(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }

    /// The span from `earlier` to this moment; zero when `earlier` is not earlier.
    pub fn since(self, earlier: Self) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    /// Whole seconds since the epoch (rounded down), as SQS, EventBridge and TTLs count.
    pub const fn seconds(self) -> i64 {
        self.0.div_euclid(1000)
    }

    /// The first moment of UTC day `day` (days since the epoch).
    pub const fn day_start(day: i64) -> Self {
        Self(day.saturating_mul(86_400_000))
    }

    /// Whole UTC days since the epoch (rounded down).
    pub const fn days(self) -> i64 {
        self.0.div_euclid(86_400_000)
    }

    /// The moment as people read it, in UTC: `2026-12-03 21:45:01.123`.
    pub fn utc(self) -> String {
        let nanos = i128::from(self.0) * 1_000_000;
        match ::time::OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(t) => format!(
                "{:04}-{:02}-{:02} {:02}:{:02}:{:02}.{:03}",
                t.year(),
                u8::from(t.month()),
                t.day(),
                t.hour(),
                t.minute(),
                t.second(),
                t.millisecond()
            ),
            Err(_) => format!("{} ms since the epoch", self.0),
        }
    }
}

/// Milliseconds of a span, saturating (no span the coordinator keeps comes near the bound).
fn millis_of(span: Duration) -> i64 {
    i64::try_from(span.as_millis()).unwrap_or(i64::MAX)
}

impl Add<Duration> for Timestamp {
    type Output = Self;

    fn add(self, span: Duration) -> Self {
        Self(self.0.saturating_add(millis_of(span)))
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Self;

    fn sub(self, span: Duration) -> Self {
        Self(self.0.saturating_sub(millis_of(span)))
    }
}

/// A span of `millis` milliseconds, none when negative.
pub fn millis(millis: i64) -> Duration {
    Duration::from_millis(u64::try_from(millis).unwrap_or(0))
}

/// A span of `seconds` seconds.
pub const fn seconds(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moment_is_stored_as_its_milliseconds_and_read_back_the_same() {
        let at = Timestamp::from_millis(1_764_797_101_123);
        assert_eq!(serde_json::to_string(&at).unwrap(), "1764797101123");
        assert_eq!(
            serde_json::from_str::<Timestamp>("1764797101123").unwrap(),
            at
        );
        assert_eq!(at.millis(), 1_764_797_101_123);
        assert_eq!(at.seconds(), 1_764_797_101);
    }

    #[test]
    fn a_moment_moves_by_spans_and_two_moments_differ_by_a_span() {
        let at = Timestamp::from_millis(10_000);
        assert_eq!(
            at + Duration::from_millis(2_500),
            Timestamp::from_millis(12_500)
        );
        assert_eq!(at - seconds(4), Timestamp::from_millis(6_000));
        assert_eq!((at + seconds(3)).since(at), seconds(3));
        assert_eq!(at.since(at + seconds(3)), Duration::ZERO, "never negative");
        assert_eq!(millis(-5), Duration::ZERO);
    }

    #[test]
    fn a_moment_reads_as_its_utc_date_and_time() {
        assert_eq!(
            Timestamp::from_millis(1_764_797_101_123).utc(),
            "2025-12-03 21:25:01.123"
        );
        assert_eq!(Timestamp::EPOCH.utc(), "1970-01-01 00:00:00.000");
        assert_eq!(
            Timestamp::from_millis(951_825_600_000).utc(),
            "2000-02-29 12:00:00.000",
            "a leap day"
        );
    }
}
