//! Worker runtime: the library side of an SQS request/reply worker. It decodes each request header,
//! refuses a command addressed to another pipeline release before touching the payload, runs the step,
//! and sends the result envelope to the reply queue the request names (batched per queue). Step failures
//! are replies (the coordinator decides retries); only messages that cannot be handled are reported as
//! batch item failures, to be retried and finally dead-lettered by their queue.
//!
//! Delivery to a worker is at least once: a step can run more than once for one launch id (a redelivered
//! or re-sent request), so its side effects should be idempotent on the launch id.
//!
//! On top of that contract the runtime adds, all optional or best effort:
//!
//! - **Cancel notices** (`header.kind == CANCEL_KIND`): the launch id is remembered in a bounded,
//!   process-local set; a later request for it is acknowledged without running and without a reply.
//!   Best effort only: a notice received by another container (or after eviction, or after the request)
//!   does not stop the step, and a step already running is not interrupted.
//! - **In-process deduplication**: the reply bodies of the last completed launches are kept; a redelivered
//!   request for one of them is not run again, the cached reply is re-sent byte for byte (the coordinator
//!   treats identical bytes as a duplicate). This is per process — one Lambda container — so across
//!   containers, and after eviction, side effects remain at least once.
//! - **Heartbeats**: while a step runs, a `RUNNING` reply is sent every interval (default: a third of the
//!   time left until the request's deadline, at least a second) and, with a [`VisibilityExtender`], the
//!   request message's SQS visibility is extended so that the queue does not hand it to another worker.
//! - **Typed dead-lettering**: with a dead-letter queue configured, a request that cannot be decoded or is
//!   addressed to another release is moved there with a reason, a detail and its message id as message
//!   attributes, then acknowledged; without one (or if that send fails) it is a batch item failure and
//!   the queue's redrive policy moves it later, without the reason.
//!
//! The messages of a batch are decoded in order, then their steps run concurrently (bounded, see
//! [`Worker::with_concurrency`]). Replies are still sent batched per reply queue once every step of the
//! batch has finished, so a reply waits for the batch's slowest step: give long steps a small batch size.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::adapters::batches::MAX_BATCH_BYTES;
use crate::claims::{ClaimCheck, ClaimError, MAX_INLINE_BYTES};
use crate::domain::payload::PayloadRef;
use crate::domain::{Code, StepError, Timestamp};
use crate::envelope::{
    Identity, RawRequest, ReplyEnvelope, ReplyOutcome, RequestHeader, CANCEL_KIND,
    DETAIL_ATTRIBUTE, REASON_ATTRIBUTE, REQUEST_KIND, SOURCE_ATTRIBUTE,
};
use crate::ports::{Clock, MessageSender, OutMessage, SendError, SystemClock};

mod announce;
mod memory;

use announce::Announcer;
use memory::{InFlight, LaunchMemory};

// The SQS side of the runtime, where it has always been named.
pub use crate::adapters::sqs::{parse_queue_arn, SqsVisibilityExtender};

/// Default number of cancelled launch ids a worker remembers.
pub const DEFAULT_CANCEL_CAPACITY: usize = 10_000;
/// Default number of completed launches whose reply a worker keeps for redeliveries.
pub const DEFAULT_DEDUP_CAPACITY: usize = 1_024;
/// Default number of steps of one batch that run at the same time.
pub const DEFAULT_CONCURRENCY: usize = 10;
/// The default heartbeat interval never goes below this, however close the deadline.
pub const MIN_DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// SQS refuses a visibility timeout above 12 hours.
const MAX_VISIBILITY_SECS: i64 = 43_200;
/// Slack added to each visibility extension, so that one late or failed extension does not release the
/// message to another worker.
const VISIBILITY_SLACK: Duration = Duration::from_secs(30);
/// A message attribute value is kept short: the original body travels with the message anyway.
const MAX_DETAIL_BYTES: usize = 1_024;

/// The step code a worker hosts.
#[async_trait]
pub trait StepFunction: Send + Sync {
    /// Runs one attempt of `request.step_id` on `input`.
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError>;
}

/// Extends the visibility timeout of a message being processed, so that its queue does not deliver it
/// again while a long step is still running.
#[async_trait]
pub trait VisibilityExtender: Send + Sync {
    /// Makes the message invisible for `seconds` from now.
    async fn extend(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), String>;
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("undecodable request: {0}")]
    Undecodable(String),
    #[error("request for {got} delivered to a worker of {expected}")]
    IdentityMismatch { expected: Identity, got: Identity },
    #[error(transparent)]
    ReplyFailed(#[from] SendError),
    /// The step panicked (or its task was aborted); the request is redelivered.
    #[error("step crashed: {0}")]
    StepCrashed(String),
}

impl WorkerError {
    pub fn code(&self) -> Code {
        match self {
            WorkerError::Undecodable(_) => Code::Undecodable,
            WorkerError::IdentityMismatch { .. } => Code::IdentityMismatch,
            WorkerError::ReplyFailed(_) => Code::ReplyFailed,
            WorkerError::StepCrashed(_) => Code::StepCrashed,
        }
    }
}

/// How often a running step reports that it is still alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Heartbeat {
    /// A third of the time left until the request's deadline, at least [`MIN_DEFAULT_HEARTBEAT`]: three
    /// chances to reach the coordinator before it gives up on the attempt.
    #[default]
    FromDeadline,
    /// A fixed interval.
    Every(Duration),
    /// No heartbeats and no visibility extensions.
    Off,
}

/// The default heartbeat interval for a request due at `deadline`, at `now`.
pub fn default_heartbeat_interval(deadline: Timestamp, now: Timestamp) -> Duration {
    (deadline.since(now) / 3).max(MIN_DEFAULT_HEARTBEAT)
}

/// The visibility timeout set at each heartbeat: two intervals and some slack, so a message stays hidden
/// through one missed extension; within SQS's limits.
pub fn visibility_timeout_for(interval: Duration) -> i32 {
    let secs = (interval * 2 + VISIBILITY_SLACK).as_secs_f64().ceil() as i64;
    secs.clamp(1, MAX_VISIBILITY_SECS) as i32
}

pub struct Worker {
    core: Core,
    concurrency: usize,
    /// Announcements of this worker to the coordinator (none: it does not announce itself).
    announcer: Option<Mutex<Announcer>>,
}

/// Everything a step's task needs; cloned into an `Arc` per batch so tasks can be spawned.
#[derive(Clone)]
struct Core {
    identity: Identity,
    sender: Arc<dyn MessageSender>,
    steps: Arc<dyn StepFunction>,
    dead_letter_queue: Option<String>,
    visibility: Option<Arc<dyn VisibilityExtender>>,
    heartbeat: Heartbeat,
    memory: Arc<Mutex<LaunchMemory>>,
    claims: Option<ClaimCheck>,
}

impl Worker {
    pub fn new(
        identity: Identity,
        sender: Arc<dyn MessageSender>,
        steps: Arc<dyn StepFunction>,
    ) -> Self {
        Self {
            core: Core {
                identity,
                sender,
                steps,
                dead_letter_queue: None,
                visibility: None,
                heartbeat: Heartbeat::default(),
                memory: Arc::new(Mutex::new(LaunchMemory::new(
                    DEFAULT_CANCEL_CAPACITY,
                    DEFAULT_DEDUP_CAPACITY,
                ))),
                claims: None,
            },
            concurrency: DEFAULT_CONCURRENCY,
            announcer: None,
        }
    }

    /// Sends undecodable and misaddressed requests to this queue (URL or name) with a typed reason.
    pub fn with_dead_letter_queue(mut self, queue: impl Into<String>) -> Self {
        self.core.dead_letter_queue = Some(queue.into());
        self
    }

    /// Resolves payload references in step inputs, and claim-checks outputs and error messages longer
    /// than the check's threshold (see `claims`).
    pub fn with_claim_check(mut self, claims: ClaimCheck) -> Self {
        self.core.claims = Some(claims);
        self
    }

    /// Extends the request message's visibility at every heartbeat.
    pub fn with_visibility(mut self, extender: Arc<dyn VisibilityExtender>) -> Self {
        self.core.visibility = Some(extender);
        self
    }

    /// Overrides the heartbeat interval (default [`Heartbeat::FromDeadline`]).
    pub fn with_heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.core.heartbeat = heartbeat;
        self
    }

    /// At most this many steps of a batch run at once (default [`DEFAULT_CONCURRENCY`], at least 1).
    pub fn with_concurrency(mut self, steps: usize) -> Self {
        self.concurrency = steps.max(1);
        self
    }

    /// How many completed launches keep their reply for redeliveries (0 turns deduplication off).
    pub fn with_dedup_capacity(self, launches: usize) -> Self {
        self.core.memory().completed.set_max_entries(launches);
        self
    }

    /// How many cancelled launch ids are remembered (0 ignores cancel notices).
    pub fn with_cancel_capacity(self, launches: usize) -> Self {
        self.core.memory().cancelled.set_max_entries(launches);
        self
    }

    pub fn identity(&self) -> &Identity {
        &self.core.identity
    }

    /// Handles one SQS batch of requests.
    pub async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        self.announce_from(&event).await;
        let core = Arc::new(self.core.clone());
        let mut dispositions: Vec<(String, Disposition)> = Vec::with_capacity(event.records.len());
        let mut jobs = Vec::new();
        // Decoding is synchronous and in order, so a cancel notice or a duplicate earlier in the batch
        // takes effect on the messages after it; only the steps run concurrently.
        for (index, message) in event.records.into_iter().enumerate() {
            let id = message.message_id.clone().unwrap_or_default();
            match core.triage(&id, &message) {
                Triage::Done(disposition) => dispositions.push((id, disposition)),
                Triage::Run(job) => {
                    dispositions.push((id, Disposition::Ack));
                    jobs.push((index, job));
                }
            }
        }

        if self.concurrency == 1 {
            // One at a time: run inline, without spawning (a panic then fails the whole invocation,
            // and the batch is redelivered). Deterministic executors (the simulation) rely on this.
            for (index, job) in jobs {
                dispositions[index].1 = core.clone().run_job(job).await;
            }
            return self.deliver(dispositions).await;
        }
        let permits = Arc::new(Semaphore::new(self.concurrency));
        let mut tasks = JoinSet::new();
        let mut slots = HashMap::new();
        for (index, job) in jobs {
            let (core, permits) = (core.clone(), permits.clone());
            let span = tracing::info_span!(
                "step", execution_id = %job.header.execution_id, step = %job.header.step_id,
                attempt = job.header.attempt, launch_id = %job.header.launch_id
            );
            let task = tasks.spawn(
                async move {
                    // The semaphore is never closed, so acquiring only waits.
                    let _permit = permits.acquire_owned().await;
                    core.run_job(job).await
                }
                .instrument(span),
            );
            slots.insert(task.id(), index);
        }
        // Dropping the set (if this future is dropped) aborts the steps still running.
        while let Some(joined) = tasks.join_next_with_id().await {
            match joined {
                Ok((task, disposition)) => dispositions[slots[&task]].1 = disposition,
                Err(e) => {
                    let text = if e.is_panic() {
                        "the step panicked"
                    } else {
                        "the step was aborted"
                    };
                    dispositions[slots[&e.id()]].1 =
                        Disposition::Fail(WorkerError::StepCrashed(text.into()));
                }
            }
        }

        self.deliver(dispositions).await
    }

    /// Sends the replies and dead letters batched per queue; returns the messages to retry.
    async fn deliver(&self, dispositions: Vec<(String, Disposition)>) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        let fail = |id: String, err: &WorkerError, response: &mut SqsBatchResponse| {
            tracing::error!(message_id = %id, code = %err.code(), error = %err, "request not handled");
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        };
        let mut outgoing: BTreeMap<String, Vec<(String, OutMessage, Option<WorkerError>)>> =
            BTreeMap::new();
        for (id, disposition) in dispositions {
            match disposition {
                Disposition::Ack => {}
                Disposition::Fail(e) => fail(id, &e, &mut response),
                Disposition::Reply { queue, body } => {
                    outgoing
                        .entry(queue)
                        .or_default()
                        .push((id, OutMessage::new(body), None))
                }
                Disposition::DeadLetter {
                    queue,
                    message,
                    error,
                    notify,
                } => {
                    if let Some((reply_queue, body)) = notify {
                        outgoing.entry(reply_queue).or_default().push((
                            id.clone(),
                            OutMessage::new(body),
                            None,
                        ));
                    }
                    outgoing
                        .entry(queue)
                        .or_default()
                        .push((id, message, Some(error)))
                }
            }
        }
        for (queue, entries) in outgoing {
            let messages: Vec<OutMessage> = entries.iter().map(|(_, m, _)| m.clone()).collect();
            let results = self.core.sender.send(&queue, &messages).await;
            for ((id, _, rejected), result) in entries.into_iter().zip(results) {
                match (result, rejected) {
                    (Ok(()), _) => {}
                    // The queue's redrive policy dead-letters it later, without the reason.
                    (Err(e), Some(rejected)) => {
                        tracing::error!(message_id = %id, error = %e, "dead-letter send failed");
                        fail(id, &rejected, &mut response);
                    }
                    // The request is redelivered; the reply cache spares a second run in this process.
                    (Err(e), None) => fail(id, &WorkerError::ReplyFailed(e), &mut response),
                }
            }
        }
        response
    }
}

/// What becomes of one message of a batch.
enum Disposition {
    /// Acknowledged, nothing to send.
    Ack,
    /// A reply to send; if it cannot be sent the request is retried.
    Reply { queue: String, body: String },
    /// A rejected request to move to the dead-letter queue; if that fails, `error` is reported.
    /// `notify` is a failure reply for the coordinator (queue, body), so that the execution fails at
    /// once instead of timing out attempt after attempt.
    DeadLetter {
        queue: String,
        message: OutMessage,
        error: WorkerError,
        notify: Option<(String, String)>,
    },
    /// A batch item failure.
    Fail(WorkerError),
}

enum Triage {
    Done(Disposition),
    Run(Job),
}

/// A step attempt to run (or a reply to build, for an undecodable payload).
struct Job {
    header: RequestHeader,
    input: Result<Value, StepError>,
    event_source_arn: Option<String>,
    receipt_handle: Option<String>,
    claim: InFlight,
}

/// The header alone: names the ids of a request whose payload does not decode, and reads a cancel
/// notice that carries no payload at all.
#[derive(Deserialize)]
struct HeaderOnly {
    header: RequestHeader,
}

impl Core {
    fn memory(&self) -> MutexGuard<'_, LaunchMemory> {
        // The lock is never held across user code or an await, so a poisoned lock still holds sound data.
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn triage(&self, id: &str, message: &SqsMessage) -> Triage {
        let Some(text) = message.body.as_deref() else {
            return self.reject(
                id,
                message,
                None,
                WorkerError::Undecodable("empty body".into()),
            );
        };
        let (header, payload) = match serde_json::from_str::<RawRequest>(text) {
            Ok(raw) => (raw.header, Some(raw.payload)),
            Err(e) => match serde_json::from_str::<HeaderOnly>(text) {
                Ok(only) if only.header.kind == CANCEL_KIND => (only.header, None),
                Ok(only) => {
                    let err = WorkerError::Undecodable(e.to_string());
                    return self.reject(id, message, Some(&only.header), err);
                }
                Err(_) => {
                    return self.reject(id, message, None, WorkerError::Undecodable(e.to_string()))
                }
            },
        };
        if header.kind == CANCEL_KIND {
            return Triage::Done(self.cancel(id, header));
        }
        if header.kind != REQUEST_KIND {
            let err = WorkerError::Undecodable(format!("unknown kind {:?}", header.kind));
            return self.reject(id, message, Some(&header), err);
        }
        // Checked before the payload is decoded: a misaddressed payload may follow another schema.
        if header.identity != self.identity {
            let err = WorkerError::IdentityMismatch {
                expected: self.identity.clone(),
                got: header.identity.clone(),
            };
            return self.reject(id, message, Some(&header), err);
        }
        let Some(payload) = payload else {
            let err = WorkerError::Undecodable("request without payload".into());
            return self.reject(id, message, Some(&header), err);
        };

        let claim = {
            let mut memory = self.memory();
            if memory.cancelled.get(&header.launch_id).is_some() {
                tracing::info!(
                    message_id = %id, execution_id = %header.execution_id, launch_id = %header.launch_id,
                    "launch was cancelled: acknowledged without running"
                );
                return Triage::Done(Disposition::Ack);
            }
            if let Some(body) = memory.completed.get(&header.launch_id) {
                tracing::info!(
                    message_id = %id, execution_id = %header.execution_id, launch_id = %header.launch_id,
                    "launch already completed in this process: re-sending its reply"
                );
                return Triage::Done(Disposition::Reply {
                    queue: header.reply_to,
                    body: body.clone(),
                });
            }
            if !memory.in_flight.insert(header.launch_id) {
                // Its running twin replies; should that reply fail, the twin is redelivered.
                tracing::info!(
                    message_id = %id, execution_id = %header.execution_id, launch_id = %header.launch_id,
                    "launch already running in this process: acknowledged without running"
                );
                return Triage::Done(Disposition::Ack);
            }
            InFlight {
                memory: self.memory.clone(),
                launch_id: header.launch_id,
            }
        };
        let input = serde_json::from_str::<Value>(payload.get())
            .map_err(|e| StepError::new(Code::UndecodableInput.as_str(), e.to_string(), false));
        Triage::Run(Job {
            header,
            input,
            event_source_arn: message.event_source_arn.clone(),
            receipt_handle: message.receipt_handle.clone(),
            claim,
        })
    }

    fn cancel(&self, id: &str, header: RequestHeader) -> Disposition {
        if header.identity != self.identity {
            // Not worth a dead letter: a notice is best effort, and a misrouted one changes nothing here.
            tracing::warn!(
                message_id = %id, execution_id = %header.execution_id, launch_id = %header.launch_id,
                identity = %header.identity, "cancel notice for another release ignored"
            );
            return Disposition::Ack;
        }
        tracing::info!(
            message_id = %id, execution_id = %header.execution_id, launch_id = %header.launch_id,
            "cancel notice recorded"
        );
        self.memory().cancelled.insert(header.launch_id, (), 16);
        Disposition::Ack
    }

    /// A request that cannot be handled: to the dead-letter queue if there is one, else a batch failure.
    fn reject(
        &self,
        id: &str,
        message: &SqsMessage,
        header: Option<&RequestHeader>,
        error: WorkerError,
    ) -> Triage {
        tracing::error!(
            message_id = %id,
            execution_id = header.map(|h| tracing::field::display(h.execution_id)),
            launch_id = header.map(|h| tracing::field::display(h.launch_id)),
            code = %error.code(), error = %error,
            dead_letter_queue = self.dead_letter_queue.as_deref(),
            "request rejected"
        );
        let Some(queue) = &self.dead_letter_queue else {
            return Triage::Done(Disposition::Fail(error));
        };
        let mut out = OutMessage::new(message.body.clone().unwrap_or_default());
        out.attributes = vec![
            (REASON_ATTRIBUTE.to_string(), error.code().to_string()),
            (
                DETAIL_ATTRIBUTE.to_string(),
                crate::domain::machine::truncated(&error.to_string(), MAX_DETAIL_BYTES),
            ),
            (SOURCE_ATTRIBUTE.to_string(), id.to_string()),
        ];
        // A command for another release is answered with a non-retryable failure: retrying it would
        // reach the same wrong worker, so the execution fails now, visibly, and can be re-driven once
        // the routing is fixed.
        let notify = match (&error, header) {
            (WorkerError::IdentityMismatch { .. }, Some(header)) => {
                let reply = ReplyEnvelope::for_request(
                    header,
                    ReplyOutcome::Failed {
                        error: StepError::new(error.code().as_str(), error.to_string(), false),
                    },
                );
                Some((
                    header.reply_to.clone(),
                    serde_json::to_string(&reply).expect("reply serializes"),
                ))
            }
            _ => None,
        };
        Triage::Done(Disposition::DeadLetter {
            queue: queue.clone(),
            message: out,
            error,
            notify,
        })
    }

    async fn run_job(self: Arc<Self>, job: Job) -> Disposition {
        let Job {
            header,
            input,
            event_source_arn,
            receipt_handle,
            claim,
        } = job;
        let outcome = match self.resolved(input).await {
            Ok(input) => {
                let step = self.steps.run(&header, input);
                let result = self
                    .with_heartbeat(
                        step,
                        &header,
                        event_source_arn.as_deref(),
                        receipt_handle.as_deref(),
                    )
                    .await;
                self.offloaded(&header, result).await
            }
            Err(error) => ReplyOutcome::Failed { error },
        };
        tracing::info!(
            execution_id = %header.execution_id, tenant = %header.tenant, step = %header.step_id,
            attempt = header.attempt, launch_id = %header.launch_id,
            ok = matches!(outcome, ReplyOutcome::Succeeded { .. }), "step ran"
        );
        let mut reply = ReplyEnvelope::for_request(&header, outcome);
        let mut body = serde_json::to_string(&reply).expect("reply serializes");
        if body.len() > MAX_BATCH_BYTES {
            // It cannot be sent (no payload bucket took it): the attempt fails for good, now, instead
            // of timing out send after send.
            let error = ClaimError::TooLarge {
                bytes: body.len(),
                limit: MAX_BATCH_BYTES,
            };
            reply.outcome = ReplyOutcome::Failed {
                error: error.step_error(),
            };
            body = serde_json::to_string(&reply).expect("reply serializes");
        }
        claim.complete(body.clone());
        Disposition::Reply {
            queue: header.reply_to,
            body,
        }
    }

    /// The step's input with its payload references resolved.
    async fn resolved(&self, input: Result<Value, StepError>) -> Result<Value, StepError> {
        let input = input?;
        match &self.claims {
            Some(claims) => claims.resolve(input).await.map_err(|e| e.step_error()),
            None if PayloadRef::any_in(&input) => Err(ClaimError::Unresolvable(
                "the input holds a payload reference and this worker has no payload bucket".into(),
            )
            .step_error()),
            None => Ok(input),
        }
    }

    /// The step's outcome with a long output or error message claim-checked.
    async fn offloaded(
        &self,
        header: &RequestHeader,
        result: Result<Value, StepError>,
    ) -> ReplyOutcome {
        let Some(claims) = &self.claims else {
            // No payload bucket: what cannot travel inline fails the attempt for good (an output) or
            // is cut (an error message keeps the worker's code).
            return match result {
                Ok(output) => match crate::claims::check_inline(&output) {
                    Ok(()) => ReplyOutcome::Succeeded { output },
                    Err(too_large) => ReplyOutcome::Failed {
                        error: too_large.step_error(),
                    },
                },
                Err(mut error) => {
                    error.message =
                        crate::domain::machine::truncated(&error.message, MAX_INLINE_BYTES);
                    ReplyOutcome::Failed { error }
                }
            };
        };
        let offloaded = match result {
            Ok(output) => claims
                .offload(header.execution_id, output)
                .await
                .map(|output| ReplyOutcome::Succeeded { output }),
            Err(error) => claims
                .offload_error(header.execution_id, error)
                .await
                .map(|error| ReplyOutcome::Failed { error }),
        };
        offloaded.unwrap_or_else(|e| ReplyOutcome::Failed {
            error: e.step_error(),
        })
    }

    fn heartbeat_interval(&self, header: &RequestHeader) -> Option<Duration> {
        match self.heartbeat {
            Heartbeat::Off => None,
            // A zero period would spin.
            Heartbeat::Every(interval) => Some(interval.max(Duration::from_millis(1))),
            Heartbeat::FromDeadline => Some(default_heartbeat_interval(
                header.deadline,
                SystemClock.now(),
            )),
        }
    }

    /// Drives `step` to completion, beating every interval until it is done.
    async fn with_heartbeat<F: std::future::Future>(
        &self,
        step: F,
        header: &RequestHeader,
        event_source_arn: Option<&str>,
        receipt_handle: Option<&str>,
    ) -> F::Output {
        let Some(interval) = self.heartbeat_interval(header) else {
            return step.await;
        };
        let beats = async {
            let mut ticks =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            // After a stall, one beat says as much as several.
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                self.beat(header, interval, event_source_arn, receipt_handle)
                    .await;
            }
        };
        tokio::pin!(step, beats);
        // The beats run beside the step, not between its polls; a beat cut short by the step's end is
        // simply dropped.
        tokio::select! {
            biased;
            output = &mut step => output,
            () = &mut beats => unreachable!("the heartbeat loop never ends"),
        }
    }

    async fn beat(
        &self,
        header: &RequestHeader,
        interval: Duration,
        event_source_arn: Option<&str>,
        receipt_handle: Option<&str>,
    ) {
        let reply = ReplyEnvelope::for_request(header, ReplyOutcome::Running);
        let body = serde_json::to_string(&reply).expect("reply serializes");
        // A lost heartbeat only costs the attempt its extension; the step goes on either way.
        for result in self
            .sender
            .send(&header.reply_to, &[OutMessage::new(body)])
            .await
        {
            if let Err(e) = result {
                tracing::warn!(error = %e, "heartbeat not sent");
            }
        }
        if let (Some(extender), Some(arn), Some(handle)) =
            (&self.visibility, event_source_arn, receipt_handle)
        {
            if let Err(e) = extender
                .extend(arn, handle, visibility_timeout_for(interval))
                .await
            {
                tracing::warn!(error = %e, "visibility not extended");
            }
        }
        tracing::debug!("heartbeat sent");
    }
}
