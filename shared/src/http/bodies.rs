//! The API's request bodies and response views, as `openapi.yaml` describes them.

use super::*;

/// `POST /executions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitBody {
    pub pipeline_id: String,
    pub tenant: String,
    pub input: Value,
    /// The same key (same tenant and pipeline) returns the first execution.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Defaults to the pipeline's active release.
    #[serde(default)]
    pub release_version: Option<String>,
}

impl SubmitBody {
    pub fn into_request(self) -> SubmitRequest {
        SubmitRequest {
            pipeline_id: self.pipeline_id,
            release_version: self.release_version,
            tenant: self.tenant,
            input: self.input,
            idempotency_key: self.idempotency_key,
            parent: None,
        }
    }
}

/// `POST /executions:batch`: up to [`MAX_BATCH_ITEMS`] submissions, each a `POST /executions` body
/// (read one by one: a malformed item is refused in its place).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitBatchBody {
    pub executions: Vec<Value>,
}

/// `POST /executions/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    pub reason: String,
}

/// `POST /executions/{id}/redrive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedriveBody {
    pub expected_version: u64,
    pub reason: String,
    /// Continue on this release of the pipeline instead (a hotfix; see `RedriveRequest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_version: Option<String>,
}

/// `POST /executions/{id}/interactions/{interactionId}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBody {
    pub token: String,
    pub verdict: Verdict,
    #[serde(default)]
    pub payload: Value,
}

/// `POST /pipelines/{pipelineId}/activations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivateBody {
    pub release_version: String,
    pub reason: String,
}

// --------------------------------------------------------------------------------------- responses

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmitResponse {
    pub execution_id: Uuid,
    pub duplicate: bool,
    pub version: u64,
}

/// `POST /executions:batch`: each item's outcome, in the order submitted.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmitBatchResponse {
    pub submitted: usize,
    pub refused: usize,
    pub results: Vec<BatchItem>,
}

/// One item of a batch: submitted (created, or the execution its idempotency key names), or refused
/// with the error a `POST /executions` of it would have answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum BatchItem {
    Submitted {
        index: usize,
        execution_id: Uuid,
        duplicate: bool,
        version: u64,
    },
    Refused {
        index: usize,
        error: ErrorDetail,
    },
}

impl BatchItem {
    pub(super) fn refused(index: usize, error: ApiError) -> Self {
        BatchItem::Refused {
            index,
            error: error.detail(),
        }
    }
}

/// `GET /executions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionView {
    pub execution_id: Uuid,
    pub tenant: String,
    pub pipeline_id: String,
    pub release_version: String,
    pub contract_version: String,
    pub status: Status,
    /// Index of the current step.
    pub step: u32,
    /// Id of the current step (absent past the last step or if the release cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    pub attempt: u32,
    pub version: u64,
    /// Epoch milliseconds.
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
}

/// `GET /executions/{id}/result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultView {
    pub execution_id: Uuid,
    pub status: Status,
    pub result: Value,
}

/// Cancel and re-drive responses: the execution after the change.
pub type ExecutionState = crate::coordinator::RedriveResponse;

/// `GET /executions/{id}/interactions` (one entry per interaction of the pending await unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InteractionView {
    pub interaction_id: String,
    pub idempotency_key: String,
    /// The resume token a completion must present.
    pub token: String,
    /// Epoch milliseconds; past it the await step fails with `AWAIT_TIMEOUT`.
    pub deadline: Timestamp,
    pub completed: bool,
}

/// `POST /executions/{id}/interactions/{interactionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletionResponse {
    pub execution_id: Uuid,
    pub interaction_id: String,
    pub status: Status,
    pub version: u64,
    /// The same answer was already recorded: nothing changed.
    pub duplicate: bool,
}

/// `POST /releases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationResponse {
    pub pipeline_id: String,
    pub release_version: String,
    pub contract_version: String,
    /// `CREATED` or `UNCHANGED` (the identical descriptor was already registered).
    pub registration: String,
}

// --------------------------------------------------------------------------------------- audiences
