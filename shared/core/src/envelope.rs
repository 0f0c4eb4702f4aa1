//! Wire formats between the coordinator and workers (request and reply envelopes) and between the
//! coordinator's own handlers (launch work). Payloads travel here, not in the execution item.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::domain::{ChildEnd, ParentLink, StepError, Timestamp};

pub const REQUEST_KIND: &str = "stepline.request.v1";
pub const REPLY_KIND: &str = "stepline.reply.v1";
/// A best-effort notice to a worker that the execution of a launch was cancelled (a request header with
/// this kind and a null payload).
pub const CANCEL_KIND: &str = "stepline.cancel.v1";
pub const DEAD_LETTER_KIND: &str = "stepline.dead-letter.v1";
pub const AWAIT_NOTICE_KIND: &str = "stepline.await.v1";
pub const INTERACTION_KIND: &str = "stepline.interaction.v1";
/// A cancelled fan-out's message to one of its children (on the launch queue).
pub const CANCEL_CHILD_KIND: &str = "stepline.cancel-child.v1";
/// A fan-out child's end, to its parent's coordinator.
pub const CHILD_ENDED_KIND: &str = "stepline.child-ended.v1";
/// A worker's announcement of itself, on the reply queue.
pub const WORKER_KIND: &str = "stepline.worker.v1";
/// Message attributes of a message a handler dead-lettered itself.
pub const REASON_ATTRIBUTE: &str = "stepline.reason";
pub const DETAIL_ATTRIBUTE: &str = "stepline.detail";
pub const SOURCE_ATTRIBUTE: &str = "stepline.source";
/// The detail-type of an event that starts an execution.
pub const START_DETAIL_TYPE: &str = "StartExecution";
/// The `source` of the start events the coordinator sends itself (a fan-out's children).
pub const START_SOURCE: &str = "stepline";

/// The pinned identity a command is addressed to; a worker serves exactly one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    pub pipeline_id: String,
    pub contract_version: String,
    pub release_version: String,
}

impl Identity {
    /// The identity of code built from `contract`, deployed as `release_version`.
    pub fn of(contract: &crate::domain::contract::Contract, release_version: &str) -> Self {
        Self {
            pipeline_id: contract.pipeline_id.clone(),
            contract_version: contract.contract_version.clone(),
            release_version: release_version.to_string(),
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} release {} ({})",
            self.pipeline_id, self.release_version, self.contract_version
        )
    }
}

/// Everything of a request but its payload, so a worker can check the identity before decoding it.
/// (The payload sits beside the header, not flattened into it: a raw payload cannot be flattened.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestHeader {
    pub kind: String,
    pub identity: Identity,
    pub tenant: String,
    pub execution_id: Uuid,
    pub step_id: String,
    pub step_index: u32,
    pub attempt: u32,
    pub launch_id: Uuid,
    /// The step's key for its side effects: the same for every attempt of the step and across
    /// re-drives, and unguessable (see `domain::ids::step_key`). Absent where the execution has no
    /// secret (created before reply tokens).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step_key: String,
    /// URL of the queue the reply goes to.
    pub reply_to: String,
    /// When the coordinator stops waiting for this attempt (epoch milliseconds on the wire).
    pub deadline: Timestamp,
    /// Proof that a reply answers this request: the worker copies it into every reply and heartbeat.
    /// Only the coordinator can make it (an HMAC under the execution's secret, over the launch id).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reply_token: String,
}

/// A command to run one step attempt.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestEnvelope<'a> {
    pub header: RequestHeader,
    pub payload: &'a Value,
}

/// A request as a worker first reads it: header decoded, payload left as raw text.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawRequest<'a> {
    pub header: RequestHeader,
    #[serde(borrow)]
    pub payload: &'a RawValue,
}

/// The result of one step attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplyEnvelope {
    pub kind: String,
    pub identity: Identity,
    pub execution_id: Uuid,
    pub step_index: u32,
    pub attempt: u32,
    pub launch_id: Uuid,
    /// The request's reply token, returned untouched.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reply_token: String,
    pub outcome: ReplyOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ReplyOutcome {
    Succeeded {
        output: Value,
    },
    Failed {
        error: StepError,
    },
    /// Still running: extends the attempt's deadline (sent by the worker runtime for long steps).
    Running,
}

impl ReplyEnvelope {
    pub fn for_request(header: &RequestHeader, outcome: ReplyOutcome) -> Self {
        Self {
            kind: REPLY_KIND.to_string(),
            identity: header.identity.clone(),
            execution_id: header.execution_id,
            step_index: header.step_index,
            attempt: header.attempt,
            launch_id: header.launch_id,
            reply_token: header.reply_token.clone(),
            outcome,
        }
    }
}

/// A worker's announcement, sent to the coordinator's reply queue when it starts, at most every
/// [`ANNOUNCE_EVERY`](crate::release::ANNOUNCE_EVERY) while it runs, and when it drains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerAnnouncement {
    pub kind: String,
    /// Unique per worker process (or Lambda execution environment).
    pub worker_id: String,
    pub identity: Identity,
    /// The name of the request queue it reads.
    pub queue: String,
    pub state: crate::release::WorkerState,
}

impl WorkerAnnouncement {
    pub fn new(
        worker_id: impl Into<String>,
        identity: Identity,
        queue: impl Into<String>,
        state: crate::release::WorkerState,
    ) -> Self {
        Self {
            kind: WORKER_KIND.to_string(),
            worker_id: worker_id.into(),
            identity,
            queue: queue.into(),
            state,
        }
    }
}

/// Work for the launch handler: act on an execution under the lease (generation and token) it was
/// enqueued with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchWork {
    pub execution_id: Uuid,
    pub generation: u64,
    pub token: Uuid,
}

/// A cancelled parent's message to a fan-out child still running: cancel it. `token` is the parent's
/// resume token for the child, which the child's record holds: nobody else can name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildCancel {
    pub kind: String,
    pub execution_id: Uuid,
    pub token: String,
    pub reason: String,
}

/// What the execution DLQ holds for an execution that failed for good: everything needed to re-drive it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterEnvelope {
    pub kind: String,
    /// Identifies the failure; replaying an envelope whose failure was already re-driven does nothing.
    pub dead_letter_id: Uuid,
    pub execution_id: Uuid,
    pub tenant: String,
    pub pipeline_id: String,
    pub release_version: String,
    pub status: crate::domain::Status,
    pub step_index: u32,
    pub step_id: String,
    pub attempt: u32,
    pub error: Option<StepError>,
    pub failed_at: Timestamp,
    pub version: u64,
}

/// One interaction as announced: who completes it presents its token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NoticeInteraction {
    pub id: String,
    pub idempotency_key: String,
    pub token: String,
}

/// The announcement of an await unit, sent to the await step's queue (e.g. a notifier that asks a
/// manager for approval). Sent at least once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AwaitNotice {
    pub kind: String,
    pub execution_id: Uuid,
    pub tenant: String,
    pub pipeline_id: String,
    pub release_version: String,
    pub step_id: String,
    pub step_index: u32,
    pub await_unit_id: Uuid,
    pub deadline: Timestamp,
    pub interactions: Vec<NoticeInteraction>,
    /// The await step's input (what is to be approved).
    pub input: Value,
    /// URL of the queue that takes `InteractionMessage`s (the API takes them too).
    pub complete_to: String,
}

/// Completion of an interaction, as sent to the await-completion queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InteractionMessage {
    pub kind: String,
    pub execution_id: Uuid,
    pub interaction: String,
    pub token: String,
    pub verdict: crate::domain::Verdict,
    #[serde(default)]
    pub payload: Value,
    /// The await unit (a fan-out step's attempt) the answer is for: a fan-out child names the one that
    /// started it; an answer for an earlier unit is stale. Absent: the current unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<Uuid>,
}

impl InteractionMessage {
    /// The approval of the interaction `link` names, with `payload`.
    pub fn approving(link: &ParentLink, payload: Value) -> Self {
        Self {
            kind: INTERACTION_KIND.to_string(),
            execution_id: link.execution_id,
            interaction: link.interaction.clone(),
            token: link.token.clone(),
            verdict: crate::domain::Verdict::Approved,
            payload,
            unit: link.unit,
        }
    }
    /// Fingerprint of the answer (verdict and payload): the same answer twice is one completion.
    pub fn answer_fingerprint(verdict: crate::domain::Verdict, payload: &Value) -> String {
        fingerprint(
            serde_json::to_string(&(verdict, payload))
                .expect("answer serializes")
                .as_bytes(),
        )
    }
}

/// A fan-out child's end, sent to its parent's coordinator (the queue its link names) and counted in
/// the parent's fan-out ledger. `token` proves the parent started this child for this item and step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildEnded {
    pub kind: String,
    /// The parent execution.
    pub parent: Uuid,
    /// The parent's fan-out attempt (await unit) the child answers.
    pub unit: Uuid,
    pub step: u32,
    pub token: String,
    pub end: ChildEnd,
    /// The child's record version at this end: a re-driven child ends again at a later version, and
    /// its parent counts the later end in place of the earlier one (0: not given).
    #[serde(default)]
    pub version: u64,
}

impl ChildEnded {
    /// The notice of the child `link` starts, ended as `end` at its record's version `version`.
    pub fn of(link: &ParentLink, end: ChildEnd, version: u64) -> Self {
        Self {
            kind: CHILD_ENDED_KIND.to_string(),
            parent: link.execution_id,
            unit: link.unit.unwrap_or_default(),
            step: link.step,
            token: link.token.clone(),
            end,
            version,
        }
    }
}

/// Fingerprint of a message's bytes (SHA-256, first 128 bits in hex): tells a duplicate from a conflict.
pub fn fingerprint(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> RequestHeader {
        RequestHeader {
            kind: REQUEST_KIND.into(),
            identity: Identity {
                pipeline_id: "p".into(),
                contract_version: "sha256:00".into(),
                release_version: "1".into(),
            },
            tenant: "t".into(),
            execution_id: Uuid::from_u128(1),
            step_id: "s".into(),
            step_index: 0,
            attempt: 1,
            launch_id: Uuid::from_u128(2),
            step_key: String::new(),
            reply_to: "http://q".into(),
            deadline: Timestamp::from_millis(5),
            reply_token: "t".into(),
        }
    }

    #[test]
    fn request_round_trips_with_raw_payload() {
        let payload = serde_json::json!({"a": [1, 2]});
        let text = serde_json::to_string(&RequestEnvelope {
            header: header(),
            payload: &payload,
        })
        .unwrap();
        let raw: RawRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(raw.header, header());
        assert_eq!(raw.payload.get(), r#"{"a":[1,2]}"#);
    }

    #[test]
    fn reply_outcome_is_tagged_by_status() {
        let reply = ReplyEnvelope::for_request(
            &header(),
            ReplyOutcome::Failed {
                error: StepError::new("E", "boom", true),
            },
        );
        let text = serde_json::to_string(&reply).unwrap();
        assert!(text.contains(r#""status":"FAILED""#), "{text}");
        assert_eq!(serde_json::from_str::<ReplyEnvelope>(&text).unwrap(), reply);
    }

    #[test]
    fn fingerprints_differ_by_bytes() {
        assert_eq!(fingerprint(b"a"), fingerprint(b"a"));
        assert_ne!(fingerprint(b"a"), fingerprint(b"b"));
        assert_eq!(fingerprint(b"a").len(), 32);
    }
}

/// An EventBridge event asking for an execution, as the bus's StartExecution rule delivers it to the
/// start queue, and as a fan-out step starts its children. Started idempotently on its `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartEvent {
    pub id: String,
    #[serde(rename = "detail-type")]
    pub detail_type: String,
    #[serde(default)]
    pub source: String,
    pub detail: StartDetail,
}

/// The `detail` of a StartExecution event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartDetail {
    pub pipeline_id: String,
    pub tenant: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default)]
    pub release_version: Option<String>,
    /// Set when a fan-out starts the execution as its child.
    #[serde(default)]
    pub parent: Option<ParentLink>,
}
