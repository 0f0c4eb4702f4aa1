//! What each execution is planned to meet, and how it must end (the oracle): [`judge_end`] judges an
//! end state, here and in the emulator campaign.

use crate::*;

/// What each execution is planned to do, and what the scheduler does to it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub(crate) id: Uuid,
    /// Attempts of each step that fail with a retryable error.
    pub(crate) fail: [u32; STEPS as usize],
    /// What the approver does with the await step's notices.
    pub(crate) approval: Approval,
    /// A step that fails for good.
    pub(crate) fatal: Option<u32>,
    /// A step whose output does not fit in the record.
    pub(crate) huge: Option<u32>,
    /// Large payloads are claim-checked (the huge output too).
    pub(crate) claim_checked: bool,
    /// An attempt (step, attempt) whose worker hangs every time it gets the request.
    pub(crate) hang: Option<(u32, u32)>,
    /// The faulty action at which an operator cancels it.
    pub(crate) cancel_at: Option<usize>,
    /// Re-driven once if it fails.
    pub(crate) redrive: bool,
}

/// What the approver (the user's system, taking the await step's notices) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Approval {
    #[default]
    Approve,
    Reject,
    /// Never answers: the await step times out.
    Ignore,
    /// Presents a forged token first (it must be refused), then approves.
    ForgeThenApprove,
}

impl Plan {
    /// How attempt `a` of step `k` ends when it is answered: `None` for success, else the error code.
    pub(crate) fn answer(&self, k: u32, a: u32) -> Option<&'static str> {
        if k == AWAIT_STEP {
            return match self.approval {
                Approval::Approve | Approval::ForgeThenApprove => None,
                Approval::Reject => Some("REJECTED"),
                Approval::Ignore => Some("AWAIT_TIMEOUT"),
            };
        }
        if self.fatal == Some(k) {
            Some("FATAL")
        } else if a <= self.fail[k as usize] {
            Some("FLAKY")
        } else if self.huge == Some(k) && !self.claim_checked {
            Some("ITEM_TOO_LARGE")
        } else {
            None
        }
    }
}

/// How an execution must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Succeeded,
    /// FAILED at this step with this code.
    Failed {
        step: u32,
        code: String,
    },
}

impl End {
    /// How `record` ended (`None`: not SUCCEEDED or FAILED).
    pub fn of(record: &Execution) -> Option<End> {
        match record.status {
            Status::Succeeded => Some(End::Succeeded),
            Status::Failed => Some(End::Failed {
                step: record.step,
                code: record
                    .error
                    .as_ref()
                    .map(|e| e.code.clone())
                    .unwrap_or_default(),
            }),
            _ => None,
        }
    }
}

/// The end-state checks every campaign makes of an execution, in the simulation and on the emulator:
/// it ended as `expected` (when given), is off the due index, left no lifecycle event unpublished, and,
/// if it failed, marked its dead letter sent and has its envelope among `execution_dlq` (the bodies of
/// the execution DLQ's messages).
pub fn judge_end(
    record: &Execution,
    expected: Option<&End>,
    execution_dlq: &[&str],
) -> Vec<String> {
    let id = record.id;
    let mut violations = Vec::new();
    let ended = End::of(record);
    if let Some(expected) = expected.filter(|e| ended.as_ref() != Some(*e)) {
        violations.push(format!(
            "{id} ended {} ({ended:?}), expected {expected:?}",
            record.status
        ));
    }
    if record.due_at().is_some() {
        violations.push(format!("{id} still due at the end"));
    }
    if !record.events.is_empty() {
        violations.push(format!(
            "{id} kept {} unpublished lifecycle events",
            record.events.len()
        ));
    }
    if record.status == Status::Failed {
        match &record.dead_letter {
            Some(mark) if mark.sent => {
                let in_dlq = execution_dlq.iter().any(|body| {
                    serde_json::from_str::<DeadLetterEnvelope>(body)
                        .is_ok_and(|e| e.dead_letter_id == mark.id && e.execution_id == id)
                });
                if !in_dlq {
                    violations.push(format!(
                        "{id} FAILED but its envelope is not in the execution DLQ"
                    ));
                }
            }
            other => violations.push(format!("{id} FAILED with dead letter {other:?} not sent")),
        }
    }
    violations
}

pub(crate) fn retryable(code: &str) -> bool {
    matches!(code, "FLAKY" | "STEP_TIMEOUT" | "PAYLOAD_UNAVAILABLE")
}

/// The codes of attempts that faults ended (each end explained by the fault, as it was committed).
pub(crate) const FAULT_CODES: [&str; 3] = ["STEP_TIMEOUT", "AWAIT_TIMEOUT", "PAYLOAD_UNAVAILABLE"];

/// The end a plan leads to, given the attempts that faults ended (a parked message, a payload store
/// that failed the worker) and the re-drives committed.
pub(crate) fn expected_end(
    plan: &Plan,
    faulted: &BTreeMap<(u32, u32), String>,
    redrives: u32,
    max: u32,
) -> End {
    let mut redrives_left = redrives;
    for k in 0..STEPS {
        let mut limit = max;
        let mut a = 0;
        loop {
            a += 1;
            let code = match faulted.get(&(k, a)) {
                Some(code) => Some(code.as_str()),
                None => plan.answer(k, a),
            };
            let Some(code) = code else { break };
            if retryable(code) && a < limit {
                continue;
            }
            if redrives_left > 0 {
                redrives_left -= 1;
                limit = a + max;
                continue;
            }
            return End::Failed {
                step: k,
                code: code.to_string(),
            };
        }
    }
    End::Succeeded
}
