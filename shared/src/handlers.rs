//! The Lambda handlers as plain async functions over `aws_lambda_events` types: each decodes its
//! event into the coordinator's commands and encodes what the coordinator reports (a batch response,
//! a claim report); nothing else. The function crates wrap them with `lambda_runtime`, and the local
//! runner and the tests call exactly the same functions.

use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::Queues;
use crate::coordinator::{
    interaction_event, Applied, BatchReport, ClaimReport, Command, Coordinator, CoordinatorError,
    Inbound, Inbox, MessageError, Role, Settings, SubmitRequest,
};
pub use crate::coordinator::{
    CancelRequest, RedriveRequest, RedriveResponse, Refused, ReplayFilter, ReplayReport,
    ReplayRequest,
};
use crate::domain::{Event, Outcome, Sender, Timestamp};
use crate::envelope::{
    fingerprint, ChildCancel, InteractionMessage, LaunchWork, ReplyEnvelope, ReplyOutcome,
    StartEvent, CANCEL_CHILD_KIND, CHILD_ENDED_KIND, INTERACTION_KIND, REPLY_KIND, WORKER_KIND,
};
pub use crate::envelope::{StartDetail, START_DETAIL_TYPE};
use crate::ports::DeadLetterQueue;

/// Claim (EventBridge schedule): one sweep of the due-time index.
pub async fn claim(
    coordinator: &Coordinator,
    event: EventBridgeEvent<Value>,
) -> Result<ClaimReport, CoordinatorError> {
    claim_within(coordinator, event, None).await
}

/// A sweep that stops in time before `deadline` (the Lambda invocation's).
pub async fn claim_within(
    coordinator: &Coordinator,
    _event: EventBridgeEvent<Value>,
    deadline: Option<Timestamp>,
) -> Result<ClaimReport, CoordinatorError> {
    let report = coordinator.claim_due(deadline).await?;
    tracing::info!(
        due = report.due,
        claimed = report.claimed,
        moved = report.moved,
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

/// Launch (SQS launch queue, and the start queue the bus's StartExecution rule feeds): under the lease
/// the work carries, saves the step as `launching` with its deterministic launch id, then sends the
/// request to the step's worker; a StartExecution event starts an execution, idempotent on its id.
pub async fn launch(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    // Lambda delivers one queue's messages per batch: the start queue's poison goes to its own DLQ.
    if from_start_queue(coordinator.settings(), &event) {
        return batch(coordinator, Inbox::Start, event, |text| {
            let start: StartEvent = serde_json::from_str(text).map_err(|e| {
                MessageError::Undecodable(format!("not a StartExecution event: {e}"))
            })?;
            start_command(start)
        })
        .await;
    }
    batch(coordinator, Inbox::Launch, event, |text| {
        if let Ok(start) = serde_json::from_str::<StartEvent>(text) {
            return start_command(start);
        }
        if serde_json::from_str::<KindOnly>(text).is_ok_and(|k| k.kind == CANCEL_CHILD_KIND) {
            let cancel: ChildCancel = decode(text)?;
            return Ok(Command::Apply {
                execution: cancel.execution_id,
                event: Event::CancelFromParent {
                    token: cancel.token,
                    reason: cancel.reason,
                },
                role: Role::FanOut,
                hot: false,
            });
        }
        let work: LaunchWork = decode(text)?;
        Ok(Command::Apply {
            execution: work.execution_id,
            event: Event::LaunchWork {
                generation: work.generation,
                token: work.token,
            },
            role: Role::Launch,
            hot: false,
        })
    })
    .await
}

/// Completion (SQS reply queue): correlates a reply by launch id, commits the step's outcome together with
/// the next step's `launching` state in one conditional write, then sends the next request directly.
/// Interaction completions arrive on the same queue.
pub async fn completion(coordinator: &Coordinator, event: SqsEvent) -> SqsBatchResponse {
    batch(coordinator, Inbox::Reply, event, reply_command).await
}

/// Decodes each message of a batch with `decode`, has the coordinator apply the batch, and encodes its
/// report as the partial batch response (the messages to redeliver).
async fn batch(
    coordinator: &Coordinator,
    inbox: Inbox,
    event: SqsEvent,
    decode: impl Fn(&str) -> Result<Command, MessageError>,
) -> SqsBatchResponse {
    let messages = event
        .records
        .into_iter()
        .map(|message: SqsMessage| {
            let body = message.body.unwrap_or_default();
            let command = if body.is_empty() {
                Err(MessageError::Undecodable("empty body".into()))
            } else {
                decode(&body)
            };
            let receive_count = message
                .attributes
                .get("ApproximateReceiveCount")
                .and_then(|count| count.parse::<u32>().ok())
                .unwrap_or(1);
            Inbound {
                message_id: message.message_id.unwrap_or_default(),
                receipt: message.receipt_handle,
                body,
                command,
                receive_count,
            }
        })
        .collect();
    batch_response(coordinator.apply_batch(inbox, messages).await)
}

fn batch_response(report: BatchReport) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for id in report.retry {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}

fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, MessageError> {
    serde_json::from_str(text).map_err(|e| MessageError::Undecodable(e.to_string()))
}

/// Whether a batch came from the start queue (its source ARN names the queue the start URL names).
fn from_start_queue(settings: &Settings, event: &SqsEvent) -> bool {
    let (Some(url), Some(arn)) = (
        &settings.queues.start,
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

fn start_command(event: StartEvent) -> Result<Command, MessageError> {
    if event.detail_type != START_DETAIL_TYPE {
        return Err(MessageError::Undecodable(format!(
            "unexpected event detail-type {:?}",
            event.detail_type
        )));
    }
    let request = SubmitRequest {
        pipeline_id: event.detail.pipeline_id,
        release_version: event.detail.release_version,
        tenant: event.detail.tenant,
        input: event.detail.input,
        // A redelivered event (same id) starts nothing new.
        idempotency_key: Some(crate::domain::start_event_key(&event.id)),
        parent: event.detail.parent,
    };
    Ok(Command::Start {
        event: event.id,
        request,
    })
}

/// A message of the reply queue: a worker's reply, or an interaction's completion.
fn reply_command(text: &str) -> Result<Command, MessageError> {
    if text.len() > MAX_REPLY_BYTES {
        return Err(MessageError::Oversized {
            bytes: text.len(),
            limit: MAX_REPLY_BYTES,
        });
    }
    let kind: KindOnly = decode(text)?;
    if kind.kind == CHILD_ENDED_KIND {
        return Ok(Command::ChildEnded(decode(text)?));
    }
    if kind.kind == WORKER_KIND {
        return Ok(Command::Announce(decode(text)?));
    }
    if kind.kind == INTERACTION_KIND {
        let (execution, event) = interaction_event(decode(text)?);
        return Ok(Command::Apply {
            execution,
            event,
            role: Role::Interaction,
            hot: false,
        });
    }
    if kind.kind != REPLY_KIND {
        return Err(MessageError::UnknownKind(kind.kind));
    }
    let reply: ReplyEnvelope = decode(text)?;
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
            token: reply.reply_token,
            pipeline_id: reply.identity.pipeline_id,
            contract_version: reply.identity.contract_version,
            release_version: reply.identity.release_version,
        },
        event: Box::new(event),
    };
    Ok(Command::Apply {
        execution: reply.execution_id,
        event,
        role: Role::Completion,
        hot: true,
    })
}

/// What the operator function accepts: `{"action": "redrive" | "cancel" | "replay", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum OperatorRequest {
    Redrive(RedriveRequest),
    Cancel(CancelRequest),
    Replay(ReplayRequest),
    /// Move messages from the launch or reply queue's DLQ back to that queue.
    Move(MoveRequest),
}

/// Moves a coordinator queue's dead letters back to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MoveRequest {
    pub queue: Inbox,
    #[serde(flatten)]
    pub replay: ReplayRequest,
}

/// The coordinator's dead-letter queues, as the operator function and the operators' tools read
/// them: of failed executions, and of its three inboxes.
pub struct DeadLetterQueues {
    pub execution: Arc<dyn DeadLetterQueue>,
    pub launch: Arc<dyn DeadLetterQueue>,
    pub reply: Arc<dyn DeadLetterQueue>,
    /// The start queue's DLQ (none where the stack has no start queue).
    pub start: Option<Arc<dyn DeadLetterQueue>>,
}

impl DeadLetterQueues {
    /// The dead-letter queues `queues` names, each opened from its URL by `open`.
    pub fn of<Q: DeadLetterQueue + 'static>(queues: &Queues, open: impl Fn(&str) -> Q) -> Self {
        let open = |url: &str| Arc::new(open(url)) as Arc<dyn DeadLetterQueue>;
        Self {
            execution: open(&queues.execution_dlq),
            launch: open(&queues.launch_dlq),
            reply: open(&queues.reply_dlq),
            start: queues.start_dlq.as_deref().map(open),
        }
    }

    /// The names [`DeadLetterQueues::named`] knows.
    pub const NAMES: [&'static str; 4] = ["execution", "launch", "reply", "start"];

    /// A dead-letter queue by name (one of [`DeadLetterQueues::NAMES`]).
    pub fn named(&self, name: &str) -> Option<&Arc<dyn DeadLetterQueue>> {
        match name {
            "execution" => Some(&self.execution),
            "launch" => Some(&self.launch),
            "reply" => Some(&self.reply),
            "start" => self.start.as_ref(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OperatorResponse {
    Execution(RedriveResponse),
    Replay(ReplayReport),
}

/// Operator function: re-drive or cancel one execution, replay the execution DLQ, or move a queue's
/// dead letters back to it.
pub async fn operator(
    coordinator: &Coordinator,
    dlqs: &DeadLetterQueues,
    request: OperatorRequest,
) -> Result<OperatorResponse, CoordinatorError> {
    Ok(match request {
        OperatorRequest::Redrive(r) => OperatorResponse::Execution(redrive(coordinator, r).await?),
        OperatorRequest::Cancel(c) => OperatorResponse::Execution(cancel(coordinator, c).await?),
        OperatorRequest::Replay(r) => {
            OperatorResponse::Replay(coordinator.replay(dlqs.execution.as_ref(), &r).await?)
        }
        OperatorRequest::Move(m) => {
            let queues = &coordinator.settings().queues;
            let (Some(dlq), Some(target)) = (dlqs.named(m.queue.name()), queues.inbox(m.queue))
            else {
                return Err(CoordinatorError::Invalid(
                    "this stack has no start queue".into(),
                ));
            };
            OperatorResponse::Replay(
                coordinator
                    .move_dead_letters(dlq.as_ref(), target, &m.replay)
                    .await?,
            )
        }
    })
}

/// Records a cancellation: what the operator function and the CLI call (see [`Coordinator::cancel`]).
pub async fn cancel(
    coordinator: &Coordinator,
    request: CancelRequest,
) -> Result<RedriveResponse, CoordinatorError> {
    coordinator.cancel(request).await
}

/// Re-drives a failed execution (see [`Coordinator::redrive`]).
pub async fn redrive(
    coordinator: &Coordinator,
    request: RedriveRequest,
) -> Result<RedriveResponse, CoordinatorError> {
    coordinator.redrive(request).await
}

/// Completes an interaction (see [`Coordinator::complete_interaction`]).
pub async fn complete_interaction(
    coordinator: &Coordinator,
    message: InteractionMessage,
) -> Result<Applied, CoordinatorError> {
    coordinator.complete_interaction(message).await
}

/// The `kind` of a message on the reply queue (worker replies and interaction completions share it).
#[derive(Deserialize)]
struct KindOnly {
    kind: String,
}
