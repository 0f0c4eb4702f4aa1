//! A batch of queue messages, as one SQS-triggered invocation delivers it: each message's command is
//! decided and committed (concurrently: an invocation lasts as long as its slowest message), the
//! committed actions of the whole batch are sent together (batched per queue), poison messages are
//! parked in the queue's DLQ with their reason, and what should be redelivered is reported.

use uuid::Uuid;

use super::{Coordinator, CoordinatorError, Outbox, Read, Role, SubmitRequest};
use crate::domain::{Code, Event, Skip};
use crate::envelope::{ChildEnded, DETAIL_ATTRIBUTE, REASON_ATTRIBUTE, SOURCE_ATTRIBUTE};
use crate::ports::OutMessage;

pub use crate::config::Inbox;

/// What one message asks of the coordinator, as its handler decoded it.
#[derive(Debug, Clone)]
pub enum Command {
    /// Apply an event to an execution. `hot`: decide on the record this process committed last,
    /// when it has it, without a read first (a worker's reply).
    Apply {
        execution: Uuid,
        event: Event,
        role: Role,
        hot: bool,
    },
    /// Count a fan-out child's end in its parent's fan-out (settling the parent when it was the last).
    ChildEnded(ChildEnded),
    /// Start an execution asked for by event `event` (idempotent on the request's key).
    Start {
        event: String,
        request: SubmitRequest,
    },
    /// Record a worker's announcement of itself.
    Announce(crate::envelope::WorkerAnnouncement),
}

/// One message of a batch: its id and body (kept for the DLQ), and what it asks, or why it cannot be
/// processed.
#[derive(Debug)]
pub struct Inbound {
    pub message_id: String,
    pub body: String,
    pub command: Result<Command, MessageError>,
    /// The receipt handle it was received with (to bring it back early when it is retried).
    pub receipt: Option<String>,
    /// How many times it was received (SQS `ApproximateReceiveCount`). Above 1, it came back
    /// unacknowledged: what it asked for may have been committed without what the commit staged
    /// having been sent.
    pub receive_count: u32,
}

impl Inbound {
    fn redelivered(&self) -> bool {
        self.receive_count > 1
    }
}

/// How soon a message left unacknowledged comes back, by how many times it was received: in seconds
/// at its first two receives (a lost response or a failed send is recovered in seconds, not at the
/// end of the queue's visibility timeout); from the third on, the visibility timeout applies, so that
/// an outage of the store is outlasted before the queue's redrive policy dead-letters the message.
pub fn redelivery_delay(receive_count: u32) -> Option<u32> {
    match receive_count {
        0 | 1 => Some(2),
        2 => Some(8),
        _ => None,
    }
}

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
    pub fn code(&self) -> Code {
        match self {
            MessageError::Undecodable(_) => Code::Undecodable,
            MessageError::Oversized { .. } => Code::Oversized,
            MessageError::UnknownKind(_) => Code::UnknownKind,
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
            } if rejection.is_unauthenticated()
                && !crate::planted!(UnauthenticatedMessagesWrite) =>
            {
                None
            }
            MessageError::Coordinator { execution, .. } => Some(*execution),
            _ => None,
        }
    }
}

/// What a batch came to.
#[derive(Debug, Default)]
pub struct BatchReport {
    /// Messages to redeliver (a transient failure, or poison that could not be parked).
    pub retry: Vec<String>,
    /// Of those, the ones brought back early: (seconds, receipt handles).
    pub early: Vec<(u32, Vec<String>)>,
}

/// How one message ended.
enum Handled {
    Committed,
    Skipped(Skip),
    Started { execution: Uuid, duplicate: bool },
}

impl Coordinator {
    /// Decides and commits every message of a batch, sends what the commits staged, parks poison in
    /// the inbox's DLQ (noting it on the execution it names) and reports what to redeliver. A message
    /// is acknowledged only once what it asked for is committed, or it is parked.
    pub async fn apply_batch(&self, inbox: Inbox, messages: Vec<Inbound>) -> BatchReport {
        let mut report = BatchReport::default();
        // The keys the batch seals and signs with, read (or refreshed) once.
        let keys = self.seal_keys().await;
        let keys = &keys;
        // Each message stages into its own outbox (concurrently), merged in message order before the
        // one send. Two messages of one execution race like two invocations would: through the
        // conditional write.
        let returns: Vec<(String, Option<String>, u32)> = messages
            .iter()
            .map(|m| (m.message_id.clone(), m.receipt.clone(), m.receive_count))
            .collect();
        let results = futures_util::future::join_all(messages.into_iter().enumerate().map(
            |(index, message)| async move {
                let mut outbox = Outbox::sealing_with(keys.clone());
                let redelivered = message.redelivered();
                let result = match message.command {
                    Ok(command) => self.handle(&mut outbox, index, command, redelivered).await,
                    Err(e) => Err(e),
                };
                (message.message_id, message.body, result, outbox)
            },
        ))
        .await;
        let mut outbox = Outbox::sealing_with(keys.clone());
        let mut poison = Vec::new();
        let mut ids = Vec::with_capacity(results.len());
        for (message_id, body, result, staged) in results {
            ids.push(message_id.clone());
            outbox.extend(staged);
            match result {
                Ok(Handled::Committed) => {}
                Ok(Handled::Skipped(skip)) => {
                    tracing::info!(message_id = %message_id, ?skip, "message acknowledged without a write");
                }
                Ok(Handled::Started {
                    execution,
                    duplicate,
                }) => {
                    tracing::info!(message_id = %message_id, execution_id = %execution, duplicate, "execution started by event");
                }
                Err(e) if e.is_retryable() => {
                    tracing::warn!(message_id = %message_id, execution_id = ?e.execution(), code = %e.code(), error = %e, "message will be retried");
                    report.retry.push(message_id);
                }
                Err(e) => {
                    tracing::error!(message_id = %message_id, execution_id = ?e.execution(), code = %e.code(), error = %e, queue = inbox.name(), "poison message dead-lettered");
                    poison.push((message_id, body, e));
                }
            }
        }
        // A send that failed after its commit: its message comes back, and finds its commit applied
        // (a duplicate), which sends what that commit staged again.
        for (source, error) in self.flush(outbox).await {
            if let Some(id) = ids.get(source) {
                if !report.retry.contains(id) {
                    tracing::warn!(message_id = %id, error = %error, "a send after its commit failed: the message will be retried");
                    report.retry.push(id.clone());
                }
            }
        }
        report.retry.extend(self.park(inbox, poison).await);
        self.redeliver_early(inbox, &mut report, &returns).await;
        report
    }

    /// Brings the messages to retry back in seconds (`redelivery_delay`) rather than at the end of
    /// the queue's visibility timeout. Should that fail, the visibility timeout brings them back.
    async fn redeliver_early(
        &self,
        inbox: Inbox,
        report: &mut BatchReport,
        returns: &[(String, Option<String>, u32)],
    ) {
        let Some(queue) = self.settings.queues.inbox(inbox) else {
            return;
        };
        let mut by_delay: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
        for (id, receipt, count) in returns {
            if let (true, Some(receipt), Some(delay)) =
                (report.retry.contains(id), receipt, redelivery_delay(*count))
            {
                by_delay.entry(delay).or_default().push(receipt.clone());
            }
        }
        for (delay, receipts) in by_delay {
            match self.sender.redeliver_in(queue, &receipts, delay).await {
                Ok(()) => report.early.push((delay, receipts)),
                Err(e) => {
                    tracing::warn!(queue = inbox.name(), error = %e, "messages to retry come back at the visibility timeout")
                }
            }
        }
    }

    async fn handle(
        &self,
        outbox: &mut Outbox,
        index: usize,
        command: Command,
        redelivered: bool,
    ) -> Result<Handled, MessageError> {
        match command {
            Command::Apply {
                execution,
                event,
                role,
                hot,
            } => {
                let applied = match self
                    .decide_into(outbox, index, execution, &event, role, (hot, redelivered))
                    .await
                {
                    // A cancelled fan-out's child that never started (a window's later one): there
                    // is nothing to cancel.
                    Err(CoordinatorError::NotFound(_))
                        if matches!(event, Event::CancelFromParent { .. }) =>
                    {
                        return Ok(Handled::Skipped(Skip::Stale));
                    }
                    applied => {
                        applied.map_err(|error| MessageError::Coordinator { execution, error })?
                    }
                };
                let record = &applied.record;
                tracing::info!(execution_id = %record.id, tenant = %record.tenant, role = role.as_str(), status = %record.status, version = record.version, skipped = ?applied.skipped, "event applied");
                Ok(match applied.skipped {
                    None => Handled::Committed,
                    Some(skip) => Handled::Skipped(skip),
                })
            }
            Command::ChildEnded(notice) => {
                let execution = notice.parent;
                let skipped = self
                    .child_ended(outbox, index, &notice)
                    .await
                    .map_err(|error| MessageError::Coordinator { execution, error })?;
                Ok(match skipped {
                    None => Handled::Committed,
                    Some(skip) => Handled::Skipped(skip),
                })
            }
            Command::Announce(announcement) => {
                self.announce_worker(&announcement)
                    .await
                    .map_err(|error| MessageError::Event {
                        event: format!("worker {}", announcement.worker_id),
                        error,
                    })?;
                Ok(Handled::Committed)
            }
            Command::Start { event, request } => {
                let submitted = self
                    .submit_into(outbox, index, request)
                    .await
                    .map_err(|error| MessageError::Event { event, error })?;
                Ok(Handled::Started {
                    execution: submitted.execution,
                    duplicate: submitted.duplicate,
                })
            }
        }
    }

    /// Sends poison messages to the inbox's DLQ with their reason, notes them on their execution, and
    /// returns the ids of those that could not be parked (left on the queue: its redrive policy moves
    /// them later).
    async fn park(&self, inbox: Inbox, poison: Vec<(String, String, MessageError)>) -> Vec<String> {
        if poison.is_empty() {
            return Vec::new();
        }
        let dlq = self.settings.queues.dead_letters_of(inbox);
        let messages: Vec<OutMessage> = poison
            .iter()
            .map(|(id, body, e)| OutMessage {
                attributes: vec![
                    (REASON_ATTRIBUTE.into(), e.code().into()),
                    (DETAIL_ATTRIBUTE.into(), e.to_string()),
                    (SOURCE_ATTRIBUTE.into(), format!("{}/{id}", inbox.name())),
                ],
                ..OutMessage::new(if body.is_empty() {
                    "(empty)".into()
                } else {
                    body.clone()
                })
            })
            .collect();
        let results = self.sender.send(dlq, &messages).await;
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
                        detail: format!("message {id} on {}: {e}", inbox.name()),
                    };
                    // Best effort: an execution that no longer exists has nothing to note.
                    let _ = self
                        .commit_event(execution, &incident, Role::Incident, Read::Fresh)
                        .await;
                }
                (Ok(()), None) => {}
            }
        }
        not_sent
    }
}
