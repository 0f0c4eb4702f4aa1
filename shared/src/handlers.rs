//! The Lambda handlers as plain async functions over `aws_lambda_events` types: the function crates wrap
//! them with `lambda_runtime`, and the local runner and the tests call exactly the same functions.

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::coordinator::{
    Applied, ClaimReport, Coordinator, CoordinatorError, Outbox, SubmitRequest,
};
use crate::domain::{Event, Outcome, Sender, Status};
use crate::envelope::{
    fingerprint, InteractionMessage, LaunchWork, ReplyEnvelope, ReplyOutcome, DETAIL_ATTRIBUTE,
    INTERACTION_KIND, REASON_ATTRIBUTE, REPLY_KIND, SOURCE_ATTRIBUTE,
};
use crate::ports::OutMessage;

/// Claim (EventBridge schedule): one sweep of the due-time index.
pub async fn claim(
    coordinator: &Coordinator,
    event: EventBridgeEvent<Value>,
) -> Result<ClaimReport, CoordinatorError> {
    claim_within(coordinator, event, None).await
}

/// A sweep that stops in time before `deadline` (epoch milliseconds: the Lambda invocation's).
pub async fn claim_within(
    coordinator: &Coordinator,
    _event: EventBridgeEvent<Value>,
    deadline: Option<i64>,
) -> Result<ClaimReport, CoordinatorError> {
    let report = coordinator.claim_due(deadline).await?;
    tracing::info!(
        due = report.due,
        claimed = report.claimed,
        skipped = report.skipped,
        failed = report.failed,
        deferred = report.deferred,
        stray = report.stray,
        pages = report.pages,
        failed_queries = report.failed_queries,
        stopped_early = report.stopped_early,
        "claim run"
    );
    Ok(report)
}

/// Replies larger than this are refused: their output would be stored in the execution item, which
/// DynamoDB caps at 400 KB (and bills per 1 KB written). Large payloads belong in a claim-check store.
pub const MAX_REPLY_BYTES: usize = 256 * 1024;

/// Why a message of a batch was not processed.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("undecodable message: {0}")]
    Undecodable(String),
    #[error("message of {bytes} bytes exceeds the {limit} byte limit")]
    Oversized { bytes: usize, limit: usize },
    #[error("unknown message kind {0:?}")]
    UnknownKind(String),
    #[error("execution {execution}: {error}")]
    Coordinator {
        execution: Uuid,
        #[source]
        error: CoordinatorError,
    },
    #[error("event {event}: {error}")]
    Event {
        event: String,
        #[source]
        error: CoordinatorError,
    },
}

impl MessageError {
    pub fn code(&self) -> &'static str {
        match self {
            MessageError::Undecodable(_) => "UNDECODABLE",
            MessageError::Oversized { .. } => "OVERSIZED",
            MessageError::UnknownKind(_) => "UNKNOWN_KIND",
            MessageError::Coordinator { error, .. } | MessageError::Event { error, .. } => {
                error.code()
            }
        }
    }

    /// Retryable failures are left on the queue (redelivered after the visibility timeout); the others
    /// are poison and go to the queue's DLQ at once, with their reason.
    pub fn is_retryable(&self) -> bool {
        match self {
            MessageError::Coordinator { error, .. } | MessageError::Event { error, .. } => {
                error.is_retryable()
            }
            _ => false,
        }
    }

    /// The execution to note the dead letter on. None for a message that did not prove it came from
    /// a party the coordinator addressed: anyone can name an execution, and an adversary's garbage must
    /// not cost the execution a write.
    pub fn execution(&self) -> Option<Uuid> {
        match self {
            MessageError::Coordinator {
                error: CoordinatorError::Rejected(rejection),
                ..
            } if rejection.is_unauthenticated() => None,
            MessageError::Coordinator { execution, .. } => Some(*execution),
            _ => None,
        }
    }
}

fn on(execution: Uuid) -> impl FnOnce(CoordinatorError) -> MessageError {
    move |error| MessageError::Coordinator { execution, error }
}

/// Where a batch's poison messages go, and the name they are reported under.
struct Source<'a> {
    queue: &'a str,
    dlq: &'a str,
}

/// Runs `process` for each message of a batch, sends what the committed decisions staged (batched per
/// queue), dead-letters poison messages with their reason, and reports the messages to retry.
async fn each_message<F, Fut>(
    coordinator: &Coordinator,
    event: SqsEvent,
    source: Source<'_>,
    mut process: F,
) -> SqsBatchResponse
where
    F: FnMut(SqsMessage) -> Fut,
    Fut: std::future::Future<Output = Result<Applied, MessageError>>,
{
    let mut outbox = Outbox::default();
    let mut retry = Vec::new();
    let mut poison = Vec::new();
    // The records of a batch are applied concurrently: an invocation lasts as long as its slowest
    // record, not the sum of them (Lambda bills the duration). Two records of one execution race like
    // two invocations would, through the conditional write.
    let results = futures_util::future::join_all(event.records.into_iter().map(|message| {
        let message_id = message.message_id.clone().unwrap_or_default();
        let body = message.body.clone().unwrap_or_default();
        let applied = process(message);
        async move { (message_id, body, applied.await) }
    }))
    .await;
    for (index, (message_id, body, result)) in results.into_iter().enumerate() {
        match result {
            Ok(Applied::Committed {
                record,
                actions,
                definition,
            }) => coordinator.stage(&mut outbox, &record, &definition, &actions, index),
            Ok(Applied::Skipped { .. }) => {}
            Err(e) if e.is_retryable() => {
                tracing::warn!(message_id = %message_id, execution_id = ?e.execution(), code = e.code(), error = %e, "message will be retried");
                retry.push(message_id);
            }
            Err(e) => {
                tracing::error!(message_id = %message_id, execution_id = ?e.execution(), code = e.code(), error = %e, queue = source.queue, "poison message dead-lettered");
                poison.push((message_id, body, e));
            }
        }
    }
    coordinator.flush(outbox).await;
    retry.extend(dead_letter(coordinator, &source, poison).await);
    let mut response = SqsBatchResponse::default();
    for id in retry {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}

/// Sends poison messages to the DLQ with their reason, notes them on their execution, and returns the
/// ids of those that could not be dead-lettered (left on the queue: its redrive policy moves them later).
async fn dead_letter(
    coordinator: &Coordinator,
    source: &Source<'_>,
    poison: Vec<(String, String, MessageError)>,
) -> Vec<String> {
    if poison.is_empty() {
        return Vec::new();
    }
    let messages: Vec<OutMessage> = poison
        .iter()
        .map(|(id, body, e)| OutMessage {
            attributes: vec![
                (REASON_ATTRIBUTE.into(), e.code().into()),
                (DETAIL_ATTRIBUTE.into(), e.to_string()),
                (SOURCE_ATTRIBUTE.into(), format!("{}/{id}", source.queue)),
            ],
            ..OutMessage::new(if body.is_empty() {
                "(empty)".into()
            } else {
                body.clone()
            })
        })
        .collect();
    let results = coordinator.sender().send(source.dlq, &messages).await;
    let mut not_sent = Vec::new();
    for ((id, _, e), result) in poison.into_iter().zip(results) {
        match (result, e.execution()) {
            (Err(send), _) => {
                tracing::error!(message_id = %id, error = %send, "dead-lettering failed; left on the queue");
                not_sent.push(id);
            }
            (Ok(()), Some(execution)) => {
                let incident = Event::Incident {
                    code: e.code().into(),
                    detail: format!("message {id} on {}: {e}", source.queue),
                };
                // Best effort: an execution that no longer exists has nothing to note.
                let _ = coordinator.apply(execution, &incident, "incident").await;
            }
            (Ok(()), None) => {}
        }
    }
    not_sent
}

fn body(message: &SqsMessage) -> Result<&str, MessageError> {
    message
        .body
        .as_deref()
        .ok_or_else(|| MessageError::Undecodable("empty body".into()))
}

/// Launch (SQS launch queue, and the start queue the bus's StartExecution rule feeds): under the lease
/// the work carries, saves the step as `launching` with its deterministic launch id, then sends the
/// request to the step's worker; a StartExecution event starts an execution, idempotent on its id.
pub async fn launch(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    let settings = coordinator.settings();
    // Lambda delivers one queue's messages per batch: the start queue's poison goes to its own DLQ.
    if let (Some(start_dlq), true) = (&settings.start_dlq, from_start_queue(settings, &event)) {
        let source = Source {
            queue: "start",
            dlq: start_dlq,
        };
        return each_message(coordinator, event, source, |message| async move {
            let start: StartEvent = serde_json::from_str(body(&message)?).map_err(|e| {
                MessageError::Undecodable(format!("not a StartExecution event: {e}"))
            })?;
            start_from_event(coordinator, start).await
        })
        .await;
    }
    let source = Source {
        queue: "launch",
        dlq: &settings.launch_dlq,
    };
    each_message(coordinator, event, source, |message| async move {
        let text = body(&message)?;
        if let Ok(start) = serde_json::from_str::<StartEvent>(text) {
            return start_from_event(coordinator, start).await;
        }
        let work: LaunchWork =
            serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))?;
        let event = Event::LaunchWork {
            generation: work.generation,
            token: work.token,
        };
        let applied = coordinator
            .apply(work.execution_id, &event, "launch")
            .await
            .map_err(on(work.execution_id))?;
        if let Applied::Skipped { skip, .. } = &applied {
            tracing::info!(execution_id = %work.execution_id, generation = work.generation, ?skip, "launch work skipped");
        }
        Ok(applied)
    })
    .await
}

/// Whether a batch came from the start queue (its source ARN names the queue the start URL names).
fn from_start_queue(settings: &crate::coordinator::Settings, event: &SqsEvent) -> bool {
    let (Some(url), Some(arn)) = (
        &settings.start_queue,
        event
            .records
            .first()
            .and_then(|m| m.event_source_arn.as_deref()),
    ) else {
        return false;
    };
    let last = |s: &str| s.rsplit([':', '/']).next().unwrap_or_default().to_string();
    !url.is_empty() && last(url) == last(arn)
}

/// An EventBridge event asking for an execution (as the bus's StartExecution rule delivers it).
#[derive(Debug, Clone, Deserialize)]
struct StartEvent {
    id: String,
    #[serde(rename = "detail-type")]
    detail_type: String,
    detail: StartDetail,
}

/// The `detail` of a StartExecution event.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    pub parent: Option<crate::domain::ParentLink>,
}

/// The detail-type that starts an execution.
pub const START_DETAIL_TYPE: &str = "StartExecution";

async fn start_from_event(
    coordinator: &Coordinator,
    event: StartEvent,
) -> Result<Applied, MessageError> {
    if event.detail_type != START_DETAIL_TYPE {
        return Err(MessageError::Undecodable(format!(
            "unexpected event detail-type {:?}",
            event.detail_type
        )));
    }
    let submitted = coordinator
        .submit(SubmitRequest {
            pipeline_id: event.detail.pipeline_id,
            release_version: event.detail.release_version,
            tenant: event.detail.tenant,
            input: event.detail.input,
            // A redelivered event (same id) starts nothing new.
            idempotency_key: Some(format!("event:{}", event.id)),
            parent: event.detail.parent,
        })
        .await
        .map_err(|error| MessageError::Event {
            event: event.id.clone(),
            error,
        })?;
    tracing::info!(event_id = %event.id, execution_id = %submitted.execution, duplicate = submitted.duplicate, "execution started by event");
    let record = coordinator
        .get(submitted.execution)
        .await
        .map_err(on(submitted.execution))?;
    // Submission dispatched its own launch work already: nothing left for the batch to stage.
    Ok(Applied::Skipped {
        skip: crate::domain::Skip::Duplicate,
        record,
    })
}

/// Completion (SQS reply queue): correlates a reply by launch id, commits the step's outcome together with
/// the next step's `launching` state in one conditional write, then sends the next request directly.
pub async fn completion(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    let settings = coordinator.settings();
    let source = Source {
        queue: "reply",
        dlq: &settings.reply_dlq,
    };
    each_message(coordinator, event, source, |message| async move {
        let text = body(&message)?;
        if text.len() > MAX_REPLY_BYTES {
            return Err(MessageError::Oversized {
                bytes: text.len(),
                limit: MAX_REPLY_BYTES,
            });
        }
        let kind: KindOnly =
            serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))?;
        if kind.kind == INTERACTION_KIND {
            let message: InteractionMessage =
                serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))?;
            // Applied here, dispatched with the rest of the batch.
            let (execution, event) = interaction_event(message);
            return coordinator
                .apply(execution, &event, "interaction")
                .await
                .map_err(on(execution));
        }
        if kind.kind != REPLY_KIND {
            return Err(MessageError::UnknownKind(kind.kind));
        }
        let reply: ReplyEnvelope =
            serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))?;
        let applied_reply = |outcome| Event::Reply {
            launch_id: reply.launch_id,
            step: reply.step_index,
            attempt: reply.attempt,
            fingerprint: fingerprint(text.as_bytes()),
            outcome,
        };
        let event = match reply.outcome.clone() {
            ReplyOutcome::Running => Event::Heartbeat {
                launch_id: reply.launch_id,
                step: reply.step_index,
                attempt: reply.attempt,
            },
            ReplyOutcome::Succeeded { output } => applied_reply(Outcome::Succeeded(output)),
            ReplyOutcome::Failed { error } => applied_reply(Outcome::Failed(error)),
        };
        // Applied only if it proves it answers a request of this execution's pinned release.
        let event = Event::FromWorker {
            sender: Sender {
                token: reply.reply_token.clone(),
                pipeline_id: reply.identity.pipeline_id.clone(),
                contract_version: reply.identity.contract_version.clone(),
                release_version: reply.identity.release_version.clone(),
            },
            event: Box::new(event),
        };
        let applied = coordinator
            .apply_hot(reply.execution_id, &event, "completion")
            .await
            .map_err(on(reply.execution_id))?;
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
        Ok(applied)
    })
    .await
}

/// What the operator function accepts: `{"action": "redrive" | "cancel" | "replay", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum OperatorRequest {
    Redrive(RedriveRequest),
    Cancel(CancelRequest),
    Replay(crate::dlq::ReplayRequest),
    /// Move messages from the launch or reply queue's DLQ back to that queue.
    Move(MoveRequest),
}

/// Which coordinator queue's DLQ to move back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MoveSource {
    Launch,
    Reply,
    Start,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveRequest {
    pub queue: MoveSource,
    #[serde(flatten)]
    pub replay: crate::dlq::ReplayRequest,
}

/// The DLQs the operator function reads.
pub struct DeadLetterQueues<'a> {
    pub execution: &'a dyn crate::dlq::DeadLetterQueue,
    pub launch: &'a dyn crate::dlq::DeadLetterQueue,
    pub reply: &'a dyn crate::dlq::DeadLetterQueue,
    /// The start queue's DLQ (none where the stack has no start queue).
    pub start: Option<&'a dyn crate::dlq::DeadLetterQueue>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OperatorResponse {
    Execution(RedriveResponse),
    Replay(crate::dlq::ReplayReport),
}

/// Operator function: re-drive or cancel one execution, replay the execution DLQ, or move a queue's
/// dead letters back to it.
pub async fn operator(
    coordinator: &Coordinator,
    dlqs: &DeadLetterQueues<'_>,
    request: OperatorRequest,
) -> Result<OperatorResponse, CoordinatorError> {
    Ok(match request {
        OperatorRequest::Redrive(r) => OperatorResponse::Execution(redrive(coordinator, r).await?),
        OperatorRequest::Cancel(c) => OperatorResponse::Execution(cancel(coordinator, c).await?),
        OperatorRequest::Replay(r) => {
            OperatorResponse::Replay(crate::dlq::replay(coordinator, dlqs.execution, &r).await?)
        }
        OperatorRequest::Move(m) => {
            let settings = coordinator.settings();
            let (dlq, target) = match m.queue {
                MoveSource::Launch => (dlqs.launch, settings.launch_queue.clone()),
                MoveSource::Reply => (dlqs.reply, settings.reply_queue.clone()),
                MoveSource::Start => match (dlqs.start, &settings.start_queue) {
                    (Some(dlq), Some(queue)) => (dlq, queue.clone()),
                    _ => {
                        return Err(CoordinatorError::Invalid(
                            "this stack has no start queue".into(),
                        ))
                    }
                },
            };
            OperatorResponse::Replay(
                crate::dlq::move_messages(coordinator, dlq, &target, &m.replay).await?,
            )
        }
    })
}

/// Cancellation of one execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelRequest {
    pub execution_id: Uuid,
    pub reason: String,
}

/// Records the cancellation (no further launch; a reply arriving later does not advance) and tells an
/// in-flight worker, best effort.
pub async fn cancel(
    coordinator: &Coordinator,
    request: CancelRequest,
) -> Result<RedriveResponse, CoordinatorError> {
    let event = Event::Cancel {
        reason: request.reason,
    };
    let applied = coordinator
        .apply_and_dispatch(request.execution_id, &event, "cancel")
        .await?;
    let record = applied.record();
    tracing::info!(execution_id = %record.id, version = record.version, "execution cancelled");
    Ok(RedriveResponse {
        execution_id: record.id,
        status: record.status,
        version: record.version,
    })
}

/// The `kind` of a message on the reply queue (worker replies and interaction completions share it).
#[derive(Deserialize)]
struct KindOnly {
    kind: String,
}

/// Completes an interaction of an execution's await unit and carries out what the commit decided (the
/// next step's launch, a dead-letter envelope): what the API and the CLI call. Completing it again with
/// the same answer is acknowledged without a second resume (`Applied::Skipped`).
pub async fn complete_interaction(
    coordinator: &Coordinator,
    message: InteractionMessage,
) -> Result<Applied, CoordinatorError> {
    let (execution, event) = interaction_event(message);
    let applied = coordinator
        .apply_and_dispatch(execution, &event, "interaction")
        .await?;
    tracing::info!(execution_id = %execution, status = %applied.record().status, "interaction completed");
    Ok(applied)
}

/// The event of an interaction completion.
fn interaction_event(message: InteractionMessage) -> (Uuid, Event) {
    let event = Event::CompleteInteraction {
        fingerprint: InteractionMessage::answer_fingerprint(message.verdict, &message.payload),
        interaction: message.interaction,
        token: message.token,
        verdict: message.verdict,
        payload: message.payload,
    };
    (message.execution_id, event)
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
