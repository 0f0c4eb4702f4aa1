//! The execution record: one run of a pinned pipeline release on one input, with its progress, lease,
//! fencing generation and version. This is what the execution table stores (one item per execution).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::time::Timestamp;

use super::fan_out::{FanOutUnit, Tally};
use super::payload::Payload;
pub use super::status::{Status, Verdict};

/// A time-bounded right to act on an execution. Taking one increments the record's generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub owner: String,
    pub token: Uuid,
    /// Epoch milliseconds.
    pub expires_at: Timestamp,
}

/// A step failure as reported by a worker or decided by the coordinator (timeouts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepError {
    /// Stable, machine-readable code, e.g. `STEP_TIMEOUT` or a worker's own code.
    pub code: String,
    pub message: String,
    pub retryable: bool,
    /// Where the whole message is when it was too long to carry: a payload reference (see
    /// `payload::PayloadRef`); `message` then holds its beginning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

impl StepError {
    pub fn new(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        Self {
            code: code.to_string(),
            message: message.into(),
            retryable,
            detail: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StepStatus {
    /// Saved with its launch id before the request is sent.
    Launching,
    /// The last attempt failed; a retry is scheduled or the execution failed.
    Failed,
    Succeeded,
}

/// The consumer receipt of the last reply applied to a step: its launch id and the fingerprint of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    pub launch_id: Uuid,
    pub fingerprint: String,
}

/// Progress of one step (present once the step was first launched, kept while it is the current step).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "StepProgressItem", from = "StepProgressItem")]
pub struct StepProgress {
    pub status: StepStatus,
    pub launch_id: Uuid,
    pub receipt: Option<Receipt>,
    /// Receipts of replies applied before `receipt` (failed attempts of this step): a launch id answers
    /// once, so a later, different reply for any of them is a conflict.
    pub earlier_receipts: Vec<Receipt>,
    pub error: Option<StepError>,
}

/// How a step's progress is serialized: the receipt's launch id is left out when it is the step's own
/// (the usual case): there is one entry per step launched, and every write is billed by the item's size.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StepProgressItem {
    status: StepStatus,
    launch_id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    receipt: Option<ReceiptItem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    earlier_receipts: Vec<Receipt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<StepError>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReceiptItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    launch_id: Option<Uuid>,
    fingerprint: String,
}

impl From<StepProgress> for StepProgressItem {
    fn from(p: StepProgress) -> Self {
        Self {
            status: p.status,
            launch_id: p.launch_id,
            receipt: p.receipt.map(|r| ReceiptItem {
                launch_id: (r.launch_id != p.launch_id).then_some(r.launch_id),
                fingerprint: r.fingerprint,
            }),
            earlier_receipts: p.earlier_receipts,
            error: p.error,
        }
    }
}

impl From<StepProgressItem> for StepProgress {
    fn from(p: StepProgressItem) -> Self {
        Self {
            status: p.status,
            launch_id: p.launch_id,
            receipt: p.receipt.map(|r| Receipt {
                launch_id: r.launch_id.unwrap_or(p.launch_id),
                fingerprint: r.fingerprint,
            }),
            earlier_receipts: p.earlier_receipts,
            error: p.error,
        }
    }
}

/// Marks the dead-letter envelope of a failed execution: written in the same commit as the failure,
/// sent to the execution DLQ after it, and marked sent by a later write. Until then the execution stays
/// due, so the sweeper re-sends an envelope a crash left unsent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterMark {
    /// Identifies this failure; a replayed envelope re-drives only the failure it was written for.
    pub id: Uuid,
    pub sent: bool,
}

/// A message about this execution that could not be processed and went to a DLQ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Incident {
    pub at: Timestamp,
    pub code: String,
    pub detail: String,
}

/// The recorded completion of an interaction: completing it again with the same answer returns this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InteractionCompletion {
    pub verdict: Verdict,
    /// The answer, until the unit resolves: then it has gone on in the step's outcome.
    #[serde(default, skip_serializing_if = "Payload::is_null")]
    pub payload: Payload,
    /// Fingerprint of the verdict and payload: the same answer is a duplicate, another a conflict.
    pub fingerprint: String,
    pub at: Timestamp,
}

/// One thing an await unit waits for (a manager's approval, a partner's callback).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interaction {
    pub id: String,
    /// Idempotency key of the interaction (stable across re-sent notices).
    pub idempotency_key: String,
    /// Unguessable resume token (122 random bits) the completer must present.
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<InteractionCompletion>,
}

/// What an execution waits on at an await step. Kept after it resolves, so repeated completions get
/// the recorded answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AwaitUnit {
    /// The await step's launch id.
    pub id: Uuid,
    pub step: u32,
    /// Epoch milliseconds; past it the step fails with `AWAIT_TIMEOUT`.
    pub deadline: Timestamp,
    /// An await step's interactions (none for a fan-out: its children are counted in the ledger).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interactions: Vec<Interaction>,
    /// Whether the announcement reached the step's queue (until then the sweeper re-sends it). A
    /// fan-out's: whether every child's start was sent.
    pub notice_sent: bool,
    pub resolved: bool,
    /// A fan-out's children, counted outside the record (see `fan_out`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fan_out: Option<FanOutUnit>,
}

/// How far an await unit is: its interactions, those still open, and the answers by outcome (a
/// fan-out child's end status, `SUCCEEDED`, `FAILED`, `CANCELLED`, ...; else the verdict).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnitProgress {
    pub interactions: usize,
    pub open: usize,
    pub answered: std::collections::BTreeMap<String, usize>,
}

impl AwaitUnit {
    /// A fan-out's progress from its ledger's tally: its children, those not yet counted, and those
    /// counted by outcome.
    pub fn fan_out_progress(&self, tally: &Tally) -> UnitProgress {
        let items = self.fan_out.map_or(0, |f| f.items) as usize;
        let mut answered = std::collections::BTreeMap::new();
        for (outcome, n) in [("SUCCEEDED", tally.succeeded), ("FAILED", tally.failed)] {
            if n > 0 {
                answered.insert(outcome.to_string(), n as usize);
            }
        }
        UnitProgress {
            interactions: items,
            open: items.saturating_sub(tally.counted() as usize),
            answered,
        }
    }

    pub fn progress(&self) -> UnitProgress {
        let mut progress = UnitProgress {
            interactions: self.interactions.len(),
            ..UnitProgress::default()
        };
        for interaction in &self.interactions {
            let Some(done) = &interaction.completion else {
                progress.open += 1;
                continue;
            };
            let outcome = match done.payload.value().get("status").and_then(|s| s.as_str()) {
                Some(status) => status.to_string(),
                None => format!("{:?}", done.verdict).to_uppercase(),
            };
            *progress.answered.entry(outcome).or_default() += 1;
        }
        progress
    }
}

/// What happened to an execution, for subscribers (published to the event bus).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifecycleKind {
    ExecutionStarted,
    StepSucceeded,
    StepFailed,
    AwaitRequested,
    ExecutionSucceeded,
    ExecutionFailed,
    ExecutionCancelled,
}

/// A lifecycle event waiting in the record's outbox: committed with the transition it describes, then
/// published, then removed by a later write. Its id is stable, so a re-publication is recognisable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleEvent {
    pub seq: u64,
    pub kind: LifecycleKind,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// The fan-out a child execution is counted in when it ends: its parent, item and token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    pub execution_id: Uuid,
    pub interaction: String,
    pub token: String,
    /// Where the completion goes (the coordinator's reply queue).
    pub complete_to: String,
    /// The parent's attempt of its fan-out step (its await unit) this child answers: set when the
    /// child is started, moved when a later attempt starts it again. A notice naming an earlier one is
    /// stale and changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Uuid>,
    /// The parent's fan-out step (its token is the parent's for this step and item).
    #[serde(default)]
    pub step: u32,
    /// The coordinator's MAC over the link and the child's tenant and pipeline (`signed`): a start
    /// event's link is honoured only with it, and stripped otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

impl ParentLink {
    /// What the signature covers: every field of the link but itself, and the child's tenant and
    /// pipeline.
    fn signed_part(&self, tenant: &str, pipeline: &str) -> Vec<u8> {
        serde_json::to_vec(&(
            tenant,
            pipeline,
            self.execution_id,
            &self.interaction,
            &self.token,
            &self.complete_to,
            self.unit,
            self.step,
        ))
        .expect("a link serializes")
    }

    /// The link signed under the coordinator's key for a child of `pipeline` for `tenant`.
    pub fn signed(mut self, key: &super::seal::SealKey, tenant: &str, pipeline: &str) -> Self {
        let mac = key.mac(LINK_PURPOSE, &self.signed_part(tenant, pipeline));
        self.signature = Some(hex::encode(mac));
        self
    }

    /// Whether the coordinator made this link, for a child of `pipeline` for `tenant`.
    pub fn is_signed(&self, key: &super::seal::SealKey, tenant: &str, pipeline: &str) -> bool {
        let Some(signature) = self.signature.as_deref().and_then(|s| hex::decode(s).ok()) else {
            return false;
        };
        let mac = key.mac(LINK_PURPOSE, &self.signed_part(tenant, pipeline));
        super::crypto::same(&mac, &signature)
    }
}

/// The purpose the key of parent links' signatures is derived for (see `SealKey::mac`).
const LINK_PURPOSE: &str = "stepline/parent-link/v1";

/// A child's end, as its notice reports it and the ledger keeps it: the element of the step's
/// `results` at its item's place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildEnd {
    pub item: u32,
    pub execution_id: Uuid,
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
}

impl ChildEnd {
    pub fn succeeded(&self) -> bool {
        self.status == Status::Succeeded
    }
}

/// Incidents kept on the record (oldest dropped first): the DLQ holds the messages themselves.
pub const MAX_INCIDENTS: usize = 10;
/// An incident's detail is cut to this many bytes on the record (the DLQ holds the whole message).
pub const MAX_INCIDENT_DETAIL: usize = 512;
/// Re-drive notes kept on the record (oldest dropped first; each re-drive is also logged when made).
pub const MAX_REDRIVE_NOTES: usize = 5;
/// Receipts of a step's earlier failed attempts kept on the record (oldest dropped first). Replies of
/// older attempts than these are not adopted (see `Execution::adoptable`), so a dropped receipt can
/// never let a second, different reply of its launch through.
pub const MAX_EARLIER_RECEIPTS: usize = 4;

/// Audit entry of an operator re-drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveNote {
    pub at: Timestamp,
    pub reason: String,
    pub from_status: Status,
    pub from_version: u64,
    /// A re-drive onto another release (a hotfix): the release the execution was pinned to, and
    /// the one it was moved onto.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_release: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_release: Option<String>,
}

/// The execution record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Execution {
    pub id: Uuid,
    pub tenant: String,
    pub pipeline_id: String,
    /// The release this execution is pinned to; retries and re-drives keep it.
    pub release_version: String,
    /// The contract of the pinned release: workers check it before touching a command.
    #[serde(default)]
    pub contract_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    pub status: Status,
    /// Index of the current step.
    pub step: u32,
    /// Attempt number of the current step (1-based once launched, counting every attempt ever made).
    pub attempt: u32,
    /// Attempts made before the current retry budget started (a re-drive opens a new budget).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub budget_base: u32,
    /// Incremented by every write; every write is conditional on the version read.
    pub version: u64,
    /// Fencing generation: incremented whenever a lease is taken.
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// When the execution next needs the coordinator's attention (retry time, step deadline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<Timestamp>,
    /// Launch id of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_id: Option<Uuid>,
    /// How often the current attempt's request was re-sent by the sweeper.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resends: u32,
    /// The current step's input: the execution's input, then each step's output as the next step
    /// launches (for re-sends, retries and re-drives); null once the execution succeeded.
    #[serde(default, skip_serializing_if = "Payload::is_null")]
    pub input: Payload,
    /// The step of `steps[0]`. The record keeps only the current step's progress: the entries of
    /// earlier steps are dropped as the next one launches, so the item does not grow with the
    /// pipeline. A late reply to an earlier step is known by its deterministic launch id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub first_step: u32,
    /// Progress of the steps from `first_step` (the current one).
    #[serde(default)]
    pub steps: Vec<StepProgress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Payload>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redrives: Vec<RedriveNote>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterMark>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incidents: Vec<Incident>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub await_unit: Option<AwaitUnit>,
    /// For a child of a fan-out: the parent's interaction this execution completes when it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// Whether the parent was told of this execution's end.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parent_notified: bool,
    /// Lifecycle events committed but not yet confirmed published (the outbox).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<LifecycleEvent>,
    /// Sequence number of the next lifecycle event.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub event_seq: u64,
    /// While the outbox is not empty: when the sweeper publishes it if nobody confirmed it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_by: Option<Timestamp>,
    /// Times the sweeper re-published the outbox without a confirmation (reset when it empties).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub publish_attempts: u32,
    /// The execution's reply secret (random, made at creation): each request carries a reply token
    /// derived from it and the launch id (`ids::reply_token`), and a reply or heartbeat is applied only
    /// with the token of the launch it names. Never shown outside the coordinator.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret: String,
    /// When the current attempt was launched: heartbeats extend its deadline only up to a bound from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launched_at: Option<Timestamp>,
    /// Identifies the write that produced this version (random per decision). When a write's response
    /// is lost and the SDK's retry then fails the version condition, the writer reads the record back
    /// and knows its own write by this id, so it goes on to send what it decided.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub write_id: String,
    /// What happened, newest last (see `history`): the entries not yet moved to the journal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<super::entries::Entry>,
    /// How many entries were moved to the journal (whole chunks of `history::JOURNAL_CHUNK`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_base: u64,
    /// The due time its due-index entry was last keyed by (`index_due`): kept while it is not later
    /// than `due_at`, so the hops of a running execution leave the entry where it is.
    #[serde(rename = "ix", default, skip_serializing_if = "Option::is_none")]
    pub indexed_due: Option<Timestamp>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
}

/// Zero-valued counters are left out of the item (they read back as their default).
fn is_zero<T: Default + PartialEq>(n: &T) -> bool {
    *n == T::default()
}

impl Execution {
    /// The due time its due-index entry is keyed by: the one it was keyed by before while that is not
    /// later than `due_at` (the sweeper may find it early, never late: it then moves the entry to
    /// `due_at`, see `machine::rekeyed`), else `due_at`. No entry when nothing is due. A running
    /// execution whose steps end before its first deadline writes its entry once, at its creation,
    /// and removes it once, at its end: its hops move the deadline, never the entry.
    pub fn index_due(&self) -> Option<Timestamp> {
        let due = self.due_at()?;
        Some(self.indexed_due.filter(|kept| *kept <= due).unwrap_or(due))
    }

    /// When the sweeper should look at this execution: once terminal, only while its dead-letter envelope
    /// is unsent; at lease expiry while leased (the holder is expected to act first); otherwise at
    /// `wake_at`. Stored as the due-index sort key.
    pub fn due_at(&self) -> Option<Timestamp> {
        let work = self.work_due_at();
        match (work, self.publish_by.filter(|_| !self.events.is_empty())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the execution's own work (not its outbox) is due.
    pub fn work_due_at(&self) -> Option<Timestamp> {
        if self.status.is_terminal() {
            return self.wake_at.filter(|_| self.terminal_work_pending());
        }
        match &self.lease {
            Some(lease) => Some(lease.expires_at),
            None => self.wake_at,
        }
    }

    /// Once terminal: whether its dead-letter envelope or its parent's notice still has to go out.
    pub fn terminal_work_pending(&self) -> bool {
        self.dead_letter.as_ref().is_some_and(|d| !d.sent)
            || (self.parent.is_some() && !self.parent_notified)
    }

    /// The input of step `index`, while it is the current step.
    pub fn step_input(&self, index: u32) -> Option<&Payload> {
        (index == self.step).then_some(&self.input)
    }

    /// The progress of step `index`, if the record still holds it.
    pub fn progress(&self, index: u32) -> Option<&StepProgress> {
        let k = index.checked_sub(self.first_step)?;
        self.steps.get(k as usize)
    }

    pub fn progress_mut(&mut self, index: u32) -> Option<&mut StepProgress> {
        let k = index.checked_sub(self.first_step)?;
        self.steps.get_mut(k as usize)
    }

    /// The steps that succeeded between `before` and this version of the record: those the record
    /// moved past (it only leaves a step that succeeded) and those now marked succeeded.
    pub fn steps_succeeded_since(&self, before: &Execution) -> Vec<u32> {
        let was_done = |k: u32| {
            k < before.first_step
                || before
                    .progress(k)
                    .is_some_and(|p| p.status == StepStatus::Succeeded)
        };
        let left = before.first_step..self.first_step;
        let now_done = self
            .steps
            .iter()
            .zip(self.first_step..)
            .filter(|(p, _)| p.status == StepStatus::Succeeded)
            .map(|(_, k)| k);
        left.chain(now_done).filter(|k| !was_done(*k)).collect()
    }

    /// Whether a success reply of an earlier attempt of the current step may be adopted: only the
    /// latest attempts, whose receipts (if they answered) the record still holds.
    pub fn adoptable(&self, attempt: u32) -> bool {
        attempt + MAX_EARLIER_RECEIPTS as u32 >= self.attempt
    }

    /// Attempts used in the current retry budget.
    pub fn attempts_in_budget(&self) -> u32 {
        self.attempt.saturating_sub(self.budget_base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn progress(receipt_launch: Uuid, own: Uuid) -> StepProgress {
        StepProgress {
            status: StepStatus::Succeeded,
            launch_id: own,
            receipt: Some(Receipt {
                launch_id: receipt_launch,
                fingerprint: "f00d".into(),
            }),
            earlier_receipts: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn a_units_progress_counts_open_interactions_and_answers_by_outcome() {
        let interaction = |id: &str, answer: Option<(Verdict, serde_json::Value)>| Interaction {
            id: id.into(),
            idempotency_key: id.into(),
            token: "t".into(),
            completion: answer.map(|(verdict, payload)| InteractionCompletion {
                verdict,
                payload: Payload::new(payload),
                fingerprint: "f".into(),
                at: Timestamp::EPOCH,
            }),
        };
        let unit = AwaitUnit {
            id: Uuid::from_u128(1),
            step: 1,
            deadline: Timestamp::EPOCH,
            interactions: vec![
                interaction(
                    "item-0",
                    Some((Verdict::Approved, json!({"status": "SUCCEEDED"}))),
                ),
                interaction(
                    "item-1",
                    Some((Verdict::Approved, json!({"status": "FAILED"}))),
                ),
                interaction(
                    "item-2",
                    Some((Verdict::Approved, json!({"status": "SUCCEEDED"}))),
                ),
                interaction("item-3", None),
                interaction(
                    "manager",
                    Some((Verdict::Rejected, json!({"reason": "no"}))),
                ),
            ],
            notice_sent: true,
            resolved: false,
            fan_out: None,
        };
        let progress = unit.progress();
        assert_eq!((progress.interactions, progress.open), (5, 1));
        assert_eq!(
            progress.answered,
            [
                ("FAILED".to_string(), 1),
                ("REJECTED".to_string(), 1),
                ("SUCCEEDED".to_string(), 2)
            ]
            .into_iter()
            .collect()
        );
        // A fan-out's, from its ledger's tally.
        let fan_out = AwaitUnit {
            interactions: Vec::new(),
            fan_out: Some(FanOutUnit::of(None, 1000)),
            ..unit
        };
        let tally = Tally {
            succeeded: 600,
            failed: 3,
        };
        let progress = fan_out.fan_out_progress(&tally);
        assert_eq!((progress.interactions, progress.open), (1000, 397));
        assert_eq!(
            progress.answered,
            [("FAILED".to_string(), 3), ("SUCCEEDED".to_string(), 600)]
                .into_iter()
                .collect()
        );
    }

    #[test]
    fn a_receipt_of_the_steps_own_launch_is_stored_without_its_launch_id() {
        let own = Uuid::from_u128(1);
        let stored = serde_json::to_value(progress(own, own)).unwrap();
        assert_eq!(stored["receipt"], json!({"fingerprint": "f00d"}));
        assert_eq!(
            serde_json::from_value::<StepProgress>(stored).unwrap(),
            progress(own, own)
        );
        // An adopted reply of an older attempt keeps its own launch id.
        let older = Uuid::from_u128(2);
        let stored = serde_json::to_value(progress(older, own)).unwrap();
        assert_eq!(stored["receipt"]["launchId"], older.to_string());
        assert_eq!(
            serde_json::from_value::<StepProgress>(stored).unwrap(),
            progress(older, own)
        );
        // Items written with the launch id always present read the same.
        let full = json!({"status": "SUCCEEDED", "launchId": own, "receipt": {"launchId": own, "fingerprint": "f00d"}});
        assert_eq!(
            serde_json::from_value::<StepProgress>(full).unwrap(),
            progress(own, own)
        );
    }
}
