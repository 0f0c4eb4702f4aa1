//! Where an execution is (its status) and how an interaction was answered: the words the record,
//! its history and its messages share.

use serde::{Deserialize, Serialize};

/// Lifecycle of an execution.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr, strum::Display,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    /// Accepted, first step not launched yet (or re-driven and waiting for its new attempt).
    Queued,
    /// A step attempt is launched and its reply awaited.
    Running,
    /// Parked on an await unit (human or external system).
    WaitingExternal,
    /// The last attempt failed; the next one is scheduled.
    WaitRetry,
    Succeeded,
    /// A step failed for good (attempt budget exhausted or non-retryable); can be re-driven.
    Failed,
    /// Dead-lettered; can be re-driven.
    Dlq,
    Cancelled,
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Status::Succeeded | Status::Failed | Status::Dlq | Status::Cancelled
        )
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// How an interaction was completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Approved,
    Rejected,
}
