//! An execution's history: what happened to it, entry by entry (launches, heartbeats, step outcomes,
//! answers, re-drives, incidents, dead letters, its end).
//!
//! Entries are derived from each committed transition (`observe`: the record before and after, and
//! what caused it), so every way a record changes is covered by one function. They are kept in the record
//! itself, in a compact positional form, until more than [`JOURNAL_CHUNK`] of them accumulate: the
//! next write of a running execution then moves the oldest [`JOURNAL_CHUNK`] to a journal item of
//! their own (`spill`), written before the record that drops them. So the journal costs one small
//! write per [`JOURNAL_CHUNK`] entries, not one per hop, and no entry is ever in neither place.
//!
//! A spilled chunk holds entries of the record as committed (the version a decision was made on), and
//! entries are only appended (the last one, a heartbeat, may still count on): a chunk's content is
//! the same whoever writes it, so writing it again after a crash or a lost race changes nothing.

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::time::Timestamp;

pub use super::entries::{Entry, What};
use super::execution::{Execution, Status, StepStatus, Verdict};
use super::ids::launch_id;

/// Entries per journal item: the record holds at most about twice this many.
pub const JOURNAL_CHUNK: usize = 8;
/// A step's output (or the execution's input) is kept in its entry up to this size (compact JSON);
/// beyond it only its size is (the value itself travels on, to the next step and the result).
pub const KEPT_VALUE_BYTES: usize = 128;

/// A value as an entry keeps it: itself when small, else nothing; and its size.
fn kept(value: &Value) -> (Option<Value>, usize) {
    let bytes = value.to_string().len();
    ((bytes <= KEPT_VALUE_BYTES).then(|| value.clone()), bytes)
}

/// The first entry of a new record.
pub fn started(record: &mut Execution) {
    let (input, bytes) = kept(record.input.value());
    let release = record.release_version.clone();
    push(
        record,
        record.created_at,
        What::Started {
            release,
            input,
            bytes,
        },
    );
}

/// Milliseconds from `origin` to `at` (an entry's offset from the execution's creation).
fn offset(at: Timestamp, origin: Timestamp) -> i64 {
    i64::try_from(at.since(origin).as_millis()).unwrap_or(i64::MAX)
}

fn push(record: &mut Execution, at: Timestamp, what: What) {
    let after_ms = offset(at, record.created_at);
    record.history.push(Entry { after_ms, what });
}

/// What caused a transition, as far as its history needs to know.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Cause<'a> {
    #[default]
    Other,
    /// A worker's heartbeat for an attempt.
    Heartbeat { step: u32, attempt: u32 },
    /// A worker's reply for an attempt, with the output if it succeeded.
    Reply {
        step: u32,
        attempt: u32,
        output: Option<&'a Value>,
    },
}

/// Appends to `next` the entries the transition from `before` amounts to (`event`: what caused it).
pub fn observe(before: &Execution, next: &mut Execution, cause: Cause<'_>, now: Timestamp) {
    let mut found = Vec::new();
    // Answers, before what they lead to.
    if let (Some(was), Some(unit)) = (&before.await_unit, &next.await_unit) {
        if was.id == unit.id {
            for (i, interaction) in unit.interactions.iter().enumerate() {
                let answered_before = was
                    .interactions
                    .get(i)
                    .is_some_and(|w| w.completion.is_some());
                if let (Some(done), false) = (&interaction.completion, answered_before) {
                    found.push(What::Answered {
                        step: unit.step,
                        interaction: interaction.id.clone(),
                        verdict: done.verdict,
                    });
                }
            }
        }
    }
    // Step outcomes.
    let reply = match cause {
        Cause::Reply {
            step,
            attempt,
            output,
        } => Some((step, attempt, output)),
        _ => None,
    };
    let attempt_of = |k: u32| match reply {
        Some((step, attempt, _)) if step == k => attempt,
        _ if k == before.step => before.attempt,
        _ => next.attempt,
    };
    for k in next.steps_succeeded_since(before) {
        let output = match reply {
            Some((step, _, Some(v))) if step == k => Some(v.clone()),
            _ if next.status == Status::Succeeded && k == next.step => {
                next.result.as_ref().map(|r| r.value().clone())
            }
            _ if next.step == k + 1 => Some(next.input.value().clone()),
            _ => None,
        };
        let (output, bytes) = output.as_ref().map_or((None, 0), kept);
        found.push(What::StepSucceeded {
            step: k,
            attempt: attempt_of(k),
            output,
            bytes,
        });
    }
    for (progress, k) in next.steps.iter().zip(next.first_step..) {
        let was = before
            .progress(k)
            .map(|w| (w.status, w.launch_id, w.error.as_ref()));
        if progress.status == StepStatus::Failed
            && was
                != Some((
                    StepStatus::Failed,
                    progress.launch_id,
                    progress.error.as_ref(),
                ))
        {
            let (code, retryable) = progress
                .error
                .as_ref()
                .map_or((String::new(), false), |e| (e.code.clone(), e.retryable));
            found.push(What::StepFailed {
                step: k,
                attempt: attempt_of(k),
                code,
                retryable,
            });
        }
    }
    if next.redrives.len() != before.redrives.len()
        || next.redrives.last() != before.redrives.last()
    {
        if let Some(note) = next.redrives.last() {
            found.push(What::Redriven {
                reason: note.reason.clone(),
                from: note.from_status,
                release: note.to_release.clone(),
            });
        }
    }
    for incident in &next.incidents {
        if !before.incidents.contains(incident) {
            found.push(What::Incident {
                code: incident.code.clone(),
            });
        }
    }
    // A new attempt.
    if next.launch_id.is_some() && next.launch_id != before.launch_id {
        let waiting = next
            .await_unit
            .as_ref()
            .filter(|u| Some(u.id) == next.launch_id && !u.resolved);
        found.push(match waiting {
            Some(unit) => What::Waiting {
                step: next.step,
                attempt: next.attempt,
                interactions: unit
                    .fan_out
                    .map_or(unit.interactions.len() as u32, |f| f.items),
            },
            None => What::Launched {
                step: next.step,
                attempt: next.attempt,
            },
        });
    }
    let dead_letter = |r: &Execution| r.dead_letter.as_ref().map(|d| d.id);
    if dead_letter(next).is_some() && dead_letter(next) != dead_letter(before) {
        found.push(What::DeadLettered);
    }
    if next.status.is_terminal() && next.status != before.status {
        found.push(What::Ended {
            status: next.status,
            code: next.error.as_ref().map(|e| e.code.clone()),
        });
    }
    if let Cause::Heartbeat { step, attempt } = cause {
        let after_ms = offset(now, next.created_at);
        match next.history.last_mut() {
            Some(Entry {
                after_ms: at,
                what:
                    What::Heartbeat {
                        step: s,
                        attempt: a,
                        count,
                    },
            }) if (*s, *a) == (step, attempt) => {
                *count += 1;
                *at = after_ms;
            }
            _ => found.push(What::Heartbeat {
                step,
                attempt,
                count: 1,
            }),
        }
    }
    for what in found {
        push(next, now, what);
    }
}

/// Moves the oldest [`JOURNAL_CHUNK`] entries out of `next` when the committed `before` holds more
/// than that many (so none of them is its last, which a heartbeat may still change) and `next` runs
/// on. Returns the
/// chunk to write to the journal before `next` is: its number and entries.
pub fn spill(before: &Execution, next: &mut Execution) -> Option<(u32, Vec<Entry>)> {
    // An execution that ends keeps what it holds: its record is not written on every hop any more,
    // so a journal write would cost more than the entries do there (a re-drive spills them later).
    if next.status.is_terminal()
        || before.history.len() <= JOURNAL_CHUNK
        || next.history_base != before.history_base
        || next.history.get(..JOURNAL_CHUNK) != before.history.get(..JOURNAL_CHUNK)
    {
        return None;
    }
    let chunk = (before.history_base / JOURNAL_CHUNK as u64) as u32;
    let entries: Vec<Entry> = next.history.drain(..JOURNAL_CHUNK).collect();
    next.history_base += JOURNAL_CHUNK as u64;
    Some((chunk, entries))
}

/// An entry as shown: when it happened and, for a step's attempt, its launch id.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shown {
    pub at: Timestamp,
    #[serde(flatten)]
    pub what: What,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_id: Option<Uuid>,
}

/// One attempt of one step, as the history tells it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    pub step: u32,
    pub attempt: u32,
    pub launch_id: Uuid,
    pub started_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// RUNNING, WAITING, SUCCEEDED, FAILED, or ABANDONED (the execution ended or moved on without it).
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    pub heartbeats: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<usize>,
}

/// The entries with their times, and the attempts they tell of, in order.
pub fn attempts(
    execution: Uuid,
    created_at: Timestamp,
    entries: &[Entry],
) -> (Vec<Shown>, Vec<AttemptView>) {
    let mut shown = Vec::with_capacity(entries.len());
    let mut attempts: Vec<AttemptView> = Vec::new();
    for entry in entries {
        let at = created_at + crate::time::millis(entry.after_ms);
        let launch = entry
            .what
            .attempt()
            .map(|(step, attempt)| (step, attempt, launch_id(execution, step, attempt)));
        let mut this_attempt = |f: &dyn Fn(&mut AttemptView)| {
            let Some((step, attempt, _)) = launch else {
                return;
            };
            let mut latest = attempts.iter_mut().rev();
            if let Some(a) = latest.find(|a| (a.step, a.attempt) == (step, attempt)) {
                f(a);
            }
        };
        match &entry.what {
            What::Launched { .. } | What::Waiting { .. } => {
                let (step, attempt, id) = launch.expect("an attempt's entry");
                let outcome = match entry.what {
                    What::Waiting { .. } => "WAITING",
                    _ => "RUNNING",
                };
                attempts.push(AttemptView {
                    step,
                    attempt,
                    launch_id: id,
                    started_at: at,
                    ended_at: None,
                    duration_ms: None,
                    outcome: outcome.into(),
                    code: None,
                    retryable: None,
                    heartbeats: 0,
                    output: None,
                    output_bytes: None,
                });
            }
            What::Heartbeat { count, .. } => this_attempt(&|a| a.heartbeats += count),
            What::StepSucceeded { output, bytes, .. } => this_attempt(&|a| {
                a.end(at, "SUCCEEDED");
                a.output = output.clone();
                a.output_bytes = Some(*bytes);
            }),
            What::StepFailed {
                code, retryable, ..
            } => this_attempt(&|a| {
                a.end(at, "FAILED");
                a.code = Some(code.clone());
                a.retryable = Some(*retryable);
            }),
            What::Ended { .. } | What::Redriven { .. } => {
                for a in attempts.iter_mut().filter(|a| a.ended_at.is_none()) {
                    a.end(at, "ABANDONED");
                }
            }
            _ => {}
        }
        shown.push(Shown {
            at,
            what: entry.what.clone(),
            launch_id: launch.map(|(_, _, id)| id),
        });
    }
    (shown, attempts)
}

impl AttemptView {
    fn end(&mut self, at: Timestamp, outcome: &str) {
        self.ended_at = Some(at);
        self.duration_ms = Some(offset(at, self.started_at));
        self.outcome = outcome.into();
    }
}

/// One line of text per entry, for people (`stepline history`).
pub fn describe(what: &What, step_name: impl Fn(u32) -> String) -> String {
    match what {
        What::Started { release, bytes, .. } => {
            format!("started on release {release} (input {bytes} bytes)")
        }
        What::Launched { step, attempt } => {
            format!("step {} launched, attempt {attempt}", step_name(*step))
        }
        What::Waiting {
            step,
            attempt,
            interactions,
        } => format!(
            "step {} waiting on {interactions} interaction(s), attempt {attempt}",
            step_name(*step)
        ),
        What::Heartbeat {
            step,
            attempt,
            count,
        } => format!(
            "step {} attempt {attempt}: {count} heartbeat(s)",
            step_name(*step)
        ),
        What::StepSucceeded {
            step,
            attempt,
            bytes,
            ..
        } => format!(
            "step {} succeeded, attempt {attempt} (output {bytes} bytes)",
            step_name(*step)
        ),
        What::StepFailed {
            step,
            attempt,
            code,
            retryable,
        } => format!(
            "step {} failed, attempt {attempt}: {code}{}",
            step_name(*step),
            if *retryable { " (retryable)" } else { "" }
        ),
        What::Answered {
            step,
            interaction,
            verdict,
        } => format!(
            "step {}: {interaction} {}",
            step_name(*step),
            match verdict {
                Verdict::Approved => "approved",
                Verdict::Rejected => "rejected",
            }
        ),
        What::Redriven {
            reason,
            from,
            release: None,
        } => format!("re-driven from {from}: {reason}"),
        What::Redriven {
            reason,
            from,
            release: Some(release),
        } => format!("re-driven from {from} onto release {release}: {reason}"),
        What::Incident { code } => format!("incident {code} (a message went to a DLQ)"),
        What::DeadLettered => "dead-lettered (envelope to the execution DLQ)".into(),
        What::Ended { status, code } => match code {
            Some(code) => format!("ended {status}: {code}"),
            None => format!("ended {status}"),
        },
    }
}
