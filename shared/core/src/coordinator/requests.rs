//! Requests on one execution: cancel, re-drive, complete an interaction. Each is one event applied and
//! carried out; the API, the operator function and the CLI call these.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Applied, Coordinator, CoordinatorError, Role};
use crate::domain::release;
use crate::domain::{Event, Execution, Pin, Status};
use crate::envelope::InteractionMessage;

/// Cancellation of one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelRequest {
    pub execution_id: Uuid,
    pub reason: String,
}

/// Operator re-drive of one FAILED or DLQ execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveRequest {
    pub execution_id: Uuid,
    /// The version the operator looked at; the re-drive is refused if the record changed since.
    pub expected_version: u64,
    pub reason: String,
    /// Another release of the pipeline to continue on (a hotfix), from the step the execution
    /// stopped at; refused (`INCOMPATIBLE_RELEASE`) unless it can (`release::continues_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_version: Option<String>,
}

/// An execution after a cancel or a re-drive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveResponse {
    pub execution_id: Uuid,
    pub status: Status,
    pub version: u64,
}

impl From<&Execution> for RedriveResponse {
    fn from(record: &Execution) -> Self {
        Self {
            execution_id: record.id,
            status: record.status,
            version: record.version,
        }
    }
}

/// An operator request's answer: the execution after the change.
type Changed = Result<RedriveResponse, CoordinatorError>;

impl Coordinator {
    /// Records the cancellation (no further launch; a reply arriving later does not advance) and tells
    /// an in-flight worker, best effort.
    pub async fn cancel(&self, request: CancelRequest) -> Changed {
        require_reason(&request.reason, "a cancellation")?;
        let reason = request.reason;
        self.operate(request.execution_id, Event::Cancel { reason }, Role::Cancel)
            .await
    }

    /// Re-drive: reopens the failed step with a new attempt and a new retry budget, keeping the
    /// execution's pinned release.
    pub async fn redrive(&self, request: RedriveRequest) -> Changed {
        require_reason(&request.reason, "a re-drive")?;
        // The audit trail: the record keeps only the latest re-drive notes.
        tracing::info!(execution_id = %request.execution_id, expected_version = request.expected_version, reason = %request.reason, "re-drive requested");
        let onto = match &request.release_version {
            Some(to) => Some(
                self.hotfix_pin(&self.get(request.execution_id).await?, to)
                    .await?,
            ),
            None => None,
        };
        let event = Event::Redrive {
            expected_version: request.expected_version,
            reason: request.reason,
            onto,
        };
        self.operate(request.execution_id, event, Role::Redrive)
            .await
    }

    /// Release `to` of `record`'s pipeline, as the pin it moves onto, if `to` can continue the
    /// execution from its step. (Checked on the record as read: the re-drive's expected version
    /// makes sure it is the record the move is applied to.)
    pub(super) async fn hotfix_pin(
        &self,
        record: &Execution,
        to: &str,
    ) -> Result<Pin, CoordinatorError> {
        let pipeline_id = &record.pipeline_id;
        let release = |version: String| async move {
            self.registry
                .get(pipeline_id, &version)
                .await?
                .ok_or_else(|| CoordinatorError::UnknownRelease {
                    pipeline_id: pipeline_id.clone(),
                    release_version: version,
                })
        };
        let from = release(record.release_version.clone()).await?;
        let onto = release(to.to_string()).await?;
        release::continues_on(&from, &onto, record.step as usize).map_err(|incompatible| {
            CoordinatorError::IncompatibleRelease {
                release_version: to.to_string(),
                incompatible: Box::new(incompatible),
            }
        })?;
        Ok(Pin {
            release_version: onto.release_version,
            contract_version: onto.contract_version,
        })
    }

    /// An operator's event on one execution, applied and carried out.
    async fn operate(&self, id: Uuid, event: Event, role: Role) -> Changed {
        let applied = self.apply(id, &event, role).await?;
        tracing::info!(execution_id = %id, version = applied.record.version, status = %applied.record.status, role = role.as_str(), "operator request applied");
        Ok(RedriveResponse::from(&applied.record))
    }

    /// Completes an interaction of an execution's await unit and carries out what the commit decided
    /// (the next step's launch, a dead-letter envelope). Completing it again with the same answer is
    /// acknowledged without a second resume (`Applied::skipped` is set).
    pub async fn complete_interaction(
        &self,
        message: InteractionMessage,
    ) -> Result<Applied, CoordinatorError> {
        let (execution, event) = interaction_event(message);
        let applied = self.apply(execution, &event, Role::Interaction).await?;
        tracing::info!(execution_id = %execution, status = %applied.record.status, "interaction completed");
        Ok(applied)
    }
}

/// The event of an interaction completion.
pub fn interaction_event(message: InteractionMessage) -> (Uuid, Event) {
    let event = Event::CompleteInteraction {
        fingerprint: InteractionMessage::answer_fingerprint(message.verdict, &message.payload),
        interaction: message.interaction,
        token: message.token,
        verdict: message.verdict,
        payload: message.payload,
        unit: message.unit,
    };
    (message.execution_id, event)
}

/// Refuses a request without an audit reason.
pub(crate) fn require_reason(reason: &str, what: &str) -> Result<(), CoordinatorError> {
    if reason.trim().is_empty() {
        return Err(CoordinatorError::Invalid(format!("{what} needs a reason")));
    }
    Ok(())
}
