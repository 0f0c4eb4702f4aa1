//! History entries as the record and the journal keep them (see `history`): what happened and when,
//! stored in a compact positional form.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::status::{Status, Verdict};

/// What happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum What {
    /// The execution was created, pinned to its release.
    Started {
        release: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
        bytes: usize,
    },
    /// A step's attempt was launched (its request saved with its launch id).
    Launched { step: u32, attempt: u32 },
    /// An await step's attempt began waiting (on its interactions, or a fan-out's children).
    Waiting {
        step: u32,
        attempt: u32,
        interactions: u32,
    },
    /// Heartbeats of a running attempt (consecutive ones counted in one entry, at the last one).
    Heartbeat { step: u32, attempt: u32, count: u32 },
    StepSucceeded {
        step: u32,
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
        bytes: usize,
    },
    StepFailed {
        step: u32,
        attempt: u32,
        code: String,
        retryable: bool,
    },
    /// An interaction of an await unit was answered.
    Answered {
        step: u32,
        interaction: String,
        verdict: Verdict,
    },
    Redriven {
        reason: String,
        from: Status,
        /// The release it was moved onto (a re-drive onto a fixed release).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        release: Option<String>,
    },
    /// A message about the execution went to a DLQ.
    Incident { code: String },
    /// The execution's dead-letter envelope was written (sent to the execution DLQ after the commit).
    DeadLettered,
    /// The execution ended (SUCCEEDED, FAILED, DLQ or CANCELLED).
    Ended {
        status: Status,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
}

/// One entry: `after_ms` after the execution was created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Entry {
    pub after_ms: i64,
    pub what: What,
}

impl What {
    /// The step and attempt an entry of a step's attempt tells of.
    pub fn attempt(&self) -> Option<(u32, u32)> {
        match *self {
            What::Launched { step, attempt }
            | What::Waiting { step, attempt, .. }
            | What::Heartbeat { step, attempt, .. }
            | What::StepSucceeded { step, attempt, .. }
            | What::StepFailed { step, attempt, .. } => Some((step, attempt)),
            _ => None,
        }
    }
}

/// How an entry is stored: a compact JSON array, `[after_ms, kind, fields...]`: every byte of the record
/// is billed on every write while the entry is in it.
impl From<Entry> for String {
    fn from(e: Entry) -> String {
        let t = e.after_ms;
        let (step, attempt) = e.what.attempt().unwrap_or_default();
        let v = match e.what {
            What::Started {
                release,
                input,
                bytes,
            } => json!([t, "S", release, bytes, input]),
            What::Launched { .. } => json!([t, "L", step, attempt]),
            What::Waiting { interactions, .. } => json!([t, "W", step, attempt, interactions]),
            What::Heartbeat { count, .. } => json!([t, "H", step, attempt, count]),
            What::StepSucceeded { output, bytes, .. } => {
                json!([t, "O", step, attempt, bytes, output])
            }
            What::StepFailed {
                code, retryable, ..
            } => json!([t, "F", step, attempt, code, retryable]),
            What::Answered {
                step,
                interaction,
                verdict,
            } => json!([t, "A", step, interaction, verdict]),
            What::Redriven {
                reason,
                from,
                release: None,
            } => json!([t, "R", reason, from]),
            What::Redriven {
                reason,
                from,
                release: Some(release),
            } => json!([t, "R", reason, from, release]),
            What::Incident { code } => json!([t, "I", code]),
            What::DeadLettered => json!([t, "D"]),
            What::Ended { status, code } => json!([t, "E", status, code]),
        };
        v.to_string()
    }
}

impl TryFrom<String> for Entry {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let bad = || format!("not a history entry: {text}");
        let v: Vec<Value> = serde_json::from_str(&text).map_err(|_| bad())?;
        let at = |k: usize| v.get(k).cloned().unwrap_or(Value::Null);
        let num = |k: usize| at(k).as_u64().ok_or_else(bad);
        let n32 = |k: usize| num(k).and_then(|n| u32::try_from(n).map_err(|_| bad()));
        let text_at = |k: usize| at(k).as_str().map(str::to_string).ok_or_else(bad);
        let opt = |k: usize| Some(at(k)).filter(|v| !v.is_null());
        let what = match at(1).as_str().ok_or_else(bad)? {
            "L" => What::Launched {
                step: n32(2)?,
                attempt: n32(3)?,
            },
            "W" => What::Waiting {
                step: n32(2)?,
                attempt: n32(3)?,
                interactions: n32(4)?,
            },
            "H" => What::Heartbeat {
                step: n32(2)?,
                attempt: n32(3)?,
                count: n32(4)?,
            },
            "O" => What::StepSucceeded {
                step: n32(2)?,
                attempt: n32(3)?,
                bytes: num(4)? as usize,
                output: opt(5),
            },
            "F" => What::StepFailed {
                step: n32(2)?,
                attempt: n32(3)?,
                code: text_at(4)?,
                retryable: at(5).as_bool().ok_or_else(bad)?,
            },
            "A" => What::Answered {
                step: n32(2)?,
                interaction: text_at(3)?,
                verdict: typed(&v, 4).ok_or_else(bad)?,
            },
            "R" => What::Redriven {
                reason: text_at(2)?,
                from: typed(&v, 3).ok_or_else(bad)?,
                release: opt(4).and_then(|r| r.as_str().map(str::to_string)),
            },
            "I" => What::Incident { code: text_at(2)? },
            "D" => What::DeadLettered,
            "E" => What::Ended {
                status: typed(&v, 2).ok_or_else(bad)?,
                code: opt(3).and_then(|c| c.as_str().map(str::to_string)),
            },
            "S" => What::Started {
                release: text_at(2)?,
                bytes: num(3)? as usize,
                input: opt(4),
            },
            _ => return Err(bad()),
        };
        Ok(Entry {
            after_ms: at(0).as_i64().ok_or_else(bad)?,
            what,
        })
    }
}

fn typed<T: serde::de::DeserializeOwned>(v: &[Value], k: usize) -> Option<T> {
    serde_json::from_value(v.get(k)?.clone()).ok()
}
