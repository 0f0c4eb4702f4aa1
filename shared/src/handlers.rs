//! The Lambda handlers as plain async functions over `aws_lambda_events` types: the function crates wrap
//! them with `lambda_runtime`, and the local runner and the tests call exactly the same functions.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::coordinator::{Applied, ClaimReport, Coordinator, CoordinatorError, Outbox};
use crate::domain::{Event, Outcome, Status};
use crate::envelope::{fingerprint, LaunchWork, ReplyEnvelope, ReplyOutcome};

/// Claim (EventBridge schedule): one sweep of the due-time index.
pub async fn claim(
    coordinator: &Coordinator,
    _event: EventBridgeEvent<Value>,
) -> Result<ClaimReport, CoordinatorError> {
    let report = coordinator.claim_due().await?;
    tracing::info!(
        due = report.due,
        claimed = report.claimed,
        skipped = report.skipped,
        failed = report.failed,
        "claim run"
    );
    Ok(report)
}

/// Why a message of a batch was not processed; it stays on its queue, is retried, and lands in the
/// queue's DLQ after `maxReceiveCount` receives.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("undecodable message: {0}")]
    Undecodable(String),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
}

impl MessageError {
    pub fn code(&self) -> &'static str {
        match self {
            MessageError::Undecodable(_) => "UNDECODABLE",
            MessageError::Coordinator(e) => e.code(),
        }
    }
}

/// Runs `event` for each message of a batch, sends what the committed decisions staged (batched per
/// queue), and reports the messages that failed.
async fn each_message<F, Fut>(
    coordinator: &Coordinator,
    event: SqsEvent,
    mut process: F,
) -> SqsBatchResponse
where
    F: FnMut(SqsMessage) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Applied>, MessageError>>,
{
    let mut outbox = Outbox::default();
    let mut response = SqsBatchResponse::default();
    for (index, message) in event.records.into_iter().enumerate() {
        let message_id = message.message_id.clone().unwrap_or_default();
        match process(message).await {
            Ok(Some(Applied::Committed {
                record,
                actions,
                definition,
            })) => coordinator.stage(&mut outbox, &record, &definition, &actions, index),
            Ok(_) => {}
            Err(e) => {
                tracing::error!(message_id = %message_id, code = e.code(), error = %e, "message not processed");
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = message_id;
                response.batch_item_failures.push(failure);
            }
        }
    }
    coordinator.flush(outbox).await;
    response
}

fn body(message: &SqsMessage) -> Result<&str, MessageError> {
    message
        .body
        .as_deref()
        .ok_or_else(|| MessageError::Undecodable("empty body".into()))
}

/// Launch (SQS launch queue): under the lease the work carries, saves the step as `launching` with its
/// deterministic launch id, then sends the request to the step's worker.
pub async fn launch(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    each_message(coordinator, event, |message| async move {
        let work: LaunchWork = serde_json::from_str(body(&message)?)
            .map_err(|e| MessageError::Undecodable(e.to_string()))?;
        let event = Event::LaunchWork {
            generation: work.generation,
            token: work.token,
        };
        let applied = coordinator.apply(work.execution_id, &event, "launch").await?;
        if let Applied::Skipped { skip, .. } = &applied {
            tracing::info!(execution_id = %work.execution_id, generation = work.generation, ?skip, "launch work skipped");
        }
        Ok(Some(applied))
    })
    .await
}

/// Completion (SQS reply queue): correlates a reply by launch id, commits the step's outcome together with
/// the next step's `launching` state in one conditional write, then sends the next request directly.
pub async fn completion(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    each_message(coordinator, event, |message| async move {
        let text = body(&message)?;
        let reply: ReplyEnvelope =
            serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))?;
        let event = Event::Reply {
            launch_id: reply.launch_id,
            step: reply.step_index,
            attempt: reply.attempt,
            fingerprint: fingerprint(text.as_bytes()),
            outcome: match reply.outcome {
                ReplyOutcome::Succeeded { output } => Outcome::Succeeded(output),
                ReplyOutcome::Failed { error } => Outcome::Failed(error),
            },
        };
        let applied = coordinator
            .apply(reply.execution_id, &event, "completion")
            .await?;
        let record = applied.record();
        match &applied {
            Applied::Committed { .. } => tracing::info!(
                execution_id = %record.id, tenant = %record.tenant, step = reply.step_index,
                attempt = reply.attempt, launch_id = %reply.launch_id, status = %record.status,
                "reply applied"
            ),
            Applied::Skipped { skip, .. } => tracing::info!(
                execution_id = %record.id, step = reply.step_index, attempt = reply.attempt,
                launch_id = %reply.launch_id, ?skip, "reply not applied"
            ),
        }
        Ok(Some(applied))
    })
    .await
}

/// Operator re-drive of one FAILED or DLQ execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveRequest {
    pub execution_id: Uuid,
    /// The version the operator looked at; the re-drive is refused if the record changed since.
    pub expected_version: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RedriveResponse {
    pub execution_id: Uuid,
    pub status: Status,
    pub version: u64,
}

/// Redrive (operator-invoked): reopens the failed step with a new attempt and a new retry budget, keeping
/// the execution's pinned release.
pub async fn redrive(
    coordinator: &Coordinator,
    request: RedriveRequest,
) -> Result<RedriveResponse, CoordinatorError> {
    if request.reason.trim().is_empty() {
        return Err(CoordinatorError::Invalid(
            "a re-drive needs a reason".into(),
        ));
    }
    let event = Event::Redrive {
        expected_version: request.expected_version,
        reason: request.reason,
    };
    let applied = coordinator
        .apply_and_dispatch(request.execution_id, &event, "redrive")
        .await?;
    let record = applied.record();
    tracing::info!(execution_id = %record.id, version = record.version, "execution re-driven");
    Ok(RedriveResponse {
        execution_id: record.id,
        status: record.status,
        version: record.version,
    })
}
