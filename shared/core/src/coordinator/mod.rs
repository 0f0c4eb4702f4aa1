//! The coordinator: the one place where an event becomes a committed record and its actions are
//! carried out. Every path goes the same way: load the record (or take this process's last committed
//! copy), `decide`, commit conditionally on the version read (deciding again after a lost race), stage
//! the committed actions as messages, send them batched per queue, and record what went out.
//!
//! - [`Coordinator::apply_batch`]: a batch of queue messages (launch work, start events, replies,
//!   interaction completions), with the retry and dead-letter handling of each message;
//! - [`Coordinator::apply`] and [`Coordinator::submit`]: one request (cancel, re-drive, an
//!   interaction's completion, a new execution);
//! - [`Coordinator::claim_due`]: the sweeper (`sweep`);
//! - [`Coordinator::replay`] and [`Coordinator::move_dead_letters`]: dead letters (`dead_letters`).
//!
//! `outbox` is where actions become messages. The handlers above only decode and encode.

mod batch;
pub use releases::WORKERS_CACHED;
mod dead_letters;
mod fan_out;
pub mod items;
mod outbox;
mod payloads;
mod releases;
mod requests;
mod submit;
mod sweep;
mod visibility;

pub use batch::{BatchReport, Command, Inbound, Inbox, MessageError};
pub use dead_letters::{Refused, ReplayFilter, ReplayReport, ReplayRequest};
pub use fan_out::count_child;
use outbox::Outbox;
pub use requests::interaction_event;
pub use requests::{CancelRequest, RedriveRequest, RedriveResponse};
pub use submit::{SubmitRequest, Submitted};
pub use sweep::{ClaimReport, MAX_DUE_SHARDS};
pub use visibility::{
    step_state, ExecutionSummary, HistoryView, ListRequest, ListResponse, StepState,
    DEFAULT_WINDOW, MAX_EXAMINED, MAX_INDEX_READS, MAX_LIMIT,
};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::cache::{byte_budget, json_size, BoundedCache};
use crate::claims::{ClaimCheck, ClaimError};
use crate::config::{CoordinatorConfig, Queues};
use crate::domain::release::WorkerRecord;
use crate::domain::seal::{self, SealKeys};
use crate::domain::{
    self, Action, Code, Context, Decision, Event, Execution, NewExecution, ParentLink, PipelineDef,
    Rejection, Skip, Timestamp,
};
use crate::ports::{
    Clock, EventPublisher, ExecutionStore, FanOutLedger, MessageSender, ReleaseRegistry,
    SealKeySource, StoreError,
};

/// How often a decision is re-made after losing a conditional write before giving up (the message is
/// then retried by its queue, a whole visibility timeout later). Every lost race means another writer
/// committed, so N writers racing on one record are all done within N rounds: this covers a full batch
/// of ten messages on one execution (a parent's children ending together) with the other functions'
/// writes beside it.
const MAX_RACES: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("execution {0} not found")]
    NotFound(Uuid),
    #[error("pipeline {pipeline_id} release {release_version} is not registered")]
    UnknownRelease {
        pipeline_id: String,
        release_version: String,
    },
    #[error("pipeline {0} has no active release")]
    NoActiveRelease(String),
    #[error("every worker of pipeline {pipeline_id} release {release_version} is draining")]
    ReleaseDraining {
        pipeline_id: String,
        release_version: String,
    },
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error(
        "release {release_version} cannot continue the execution from its step: {}; the diff: {}",
        incompatible.reasons.join("; "),
        serde_json::to_string(&incompatible.diff).unwrap_or_default()
    )]
    IncompatibleRelease {
        release_version: String,
        incompatible: Box<crate::domain::release::Incompatible>,
    },
    #[error("inconsistent release descriptor: {0}")]
    InvalidRelease(String),
    #[error("pipeline {pipeline_id} release {release_version} is already registered with another descriptor")]
    ReleaseConflict {
        pipeline_id: String,
        release_version: String,
    },
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("gave up after {0} conflicting writes")]
    Contention(u32),
    #[error(transparent)]
    Payload(#[from] ClaimError),
}

impl CoordinatorError {
    /// Stable error code.
    pub fn code(&self) -> Code {
        match self {
            CoordinatorError::NotFound(_) => Code::NotFound,
            CoordinatorError::UnknownRelease { .. } => Code::UnknownRelease,
            CoordinatorError::NoActiveRelease(_) => Code::NoActiveRelease,
            CoordinatorError::ReleaseDraining { .. } => Code::ReleaseDraining,
            CoordinatorError::Invalid(_) => Code::InvalidRequest,
            CoordinatorError::IncompatibleRelease { .. } => Code::IncompatibleRelease,
            CoordinatorError::InvalidRelease(_) => Code::InvalidRelease,
            CoordinatorError::ReleaseConflict { .. } => Code::ReleaseConflict,
            CoordinatorError::Rejected(r) => r.code(),
            CoordinatorError::Store(StoreError::Corrupt(_)) => Code::CorruptRecord,
            CoordinatorError::Store(StoreError::Missing(_)) => Code::NotFound,
            CoordinatorError::Store(StoreError::TooLarge(_)) => Code::ItemTooLarge,
            CoordinatorError::Store(_) => Code::StoreUnavailable,
            CoordinatorError::Contention(_) => Code::Contention,
            CoordinatorError::Payload(e) => e.code(),
        }
    }

    /// Whether the same request may succeed later (the message should be redelivered).
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordinatorError::Store(e) => e.is_retryable(),
            CoordinatorError::Contention(_) => true,
            CoordinatorError::Payload(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// Runtime settings of the coordinator.
#[derive(Debug, Clone)]
pub struct Settings {
    pub queues: Queues,
    /// How long a lease lasts.
    pub lease: Duration,
    pub claim_limit: i32,
    /// Identifies this process in lease owners.
    pub instance: String,
}

impl Settings {
    /// Settings whose queues are plain names (what an in-memory sender records), with no start
    /// queue: tests and simulations over in-memory ports.
    #[cfg(any(test, feature = "testing"))]
    pub fn named() -> Self {
        Self {
            queues: Queues::named(),
            lease: Duration::from_secs(30),
            claim_limit: 10,
            instance: "test".into(),
        }
    }

    pub fn from_config(config: &CoordinatorConfig) -> Self {
        Self {
            queues: config.queues.clone(),
            lease: Duration::from_secs(u64::from(config.lease_seconds)),
            claim_limit: config.claim_limit,
            instance: Uuid::new_v4().simple().to_string()[..12].to_string(),
        }
    }
}

/// What applying an event did: the execution as it is now, and why nothing was written, if so.
#[derive(Debug, Clone)]
pub struct Applied {
    pub record: Execution,
    /// Set when the decision wrote nothing (a duplicate, a stale reply, ...): the message is
    /// acknowledged all the same.
    pub skipped: Option<Skip>,
}

impl Applied {
    pub fn record(&self) -> &Execution {
        &self.record
    }

    /// Whether the event changed the record.
    pub fn committed(&self) -> bool {
        self.skipped.is_none()
    }
}

/// A registered release as executions are pinned to it.
struct Pinned {
    definition: Arc<PipelineDef>,
    contract_version: String,
}

/// Who acts on an execution: recorded in the lease owner (`<role>:<instance>`) and the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum Role {
    Launch,
    Completion,
    Interaction,
    FanOut,
    Claim,
    Outbox,
    Incident,
    Cancel,
    Redrive,
    Replay,
    Submit,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A decision as the coordinator carries it out (the definition the actions are staged with).
enum Decided {
    Committed {
        record: Execution,
        actions: Vec<Action>,
        definition: Arc<PipelineDef>,
    },
    Unchanged {
        record: Execution,
        skip: Skip,
    },
}

/// Where a decision reads its record: from the store, or hot (see `Coordinator::commit_event`):
/// from this process's last commit, or from the record sealed in the worker's token, opened with
/// the cycle's keys (none: not opened).
enum Read {
    Fresh,
    Hot(Option<Arc<SealKeys>>),
}

/// One round of deciding and writing.
enum Attempt {
    Done(Box<Decided>),
    Rejected(Rejection),
    /// The write lost a race: the record as it is now.
    Lost(Box<Execution>),
}

/// An event's payloads claim-checked: not yet (`None`), nothing to store (`Some(None)`), or the
/// event with references in place of its large payloads.
type Checked = Option<Option<Event>>;

pub struct Coordinator {
    store: Arc<dyn ExecutionStore>,
    registry: Arc<dyn ReleaseRegistry>,
    sender: Arc<dyn MessageSender>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    /// Pinned releases; immutable once registered, so kept for the life of the process.
    releases: Mutex<HashMap<(String, String), Arc<Pinned>>>,
    /// Each pipeline's workers as last read, and when (re-read after [`WORKERS_CACHED`]).
    workers: Mutex<HashMap<String, WorkersRead>>,
    publisher: Option<Arc<dyn EventPublisher>>,
    /// Records this process committed last (bounded): the hot path decides on them without a read.
    recent: Mutex<RecentRecords>,
    /// When this process last re-sent each execution's first request for a duplicate submission.
    resent: Mutex<BoundedCache<Uuid, Timestamp>>,
    /// Where payloads above the threshold go (none: kept inline).
    claims: Option<ClaimCheck>,
    /// Where fan-out children are counted (none: a child's end cannot be counted).
    ledger: Option<Arc<dyn FanOutLedger>>,
    /// Where the keys requests' records are sealed under come from (`domain::seal`); none: requests
    /// go unsealed and their replies' completions read the record.
    key_source: Option<Arc<dyn SealKeySource>>,
    /// The keys as last loaded, and when.
    keys: std::sync::RwLock<Option<(Timestamp, Arc<SealKeys>)>>,
}

/// How long a process uses the sealing keys it loaded before it reads them again: a rotation reaches
/// every warm process within this (what an older key sealed meanwhile still opens as the previous).
pub const KEYS_CACHED: Duration = Duration::from_secs(5 * 60);

/// A parent link that no loaded key signed is checked once more on keys at most this old (it may be
/// signed under a key a rotation made since they were loaded).
const KEYS_RECHECKED: Duration = Duration::from_secs(10);

/// A duplicate submission re-sends its execution's first request at most once in this long per
/// process: however often a caller submits the same key, its worker sees a bounded number of copies.
pub const RESEND_WINDOW: Duration = Duration::from_secs(10);

/// How many executions' re-sends a process remembers, at most.
const RESENT_CAPACITY: usize = 1024;

/// A pipeline's workers as read from the registry, and when.
type WorkersRead = (Timestamp, Arc<Vec<WorkerRecord>>);

/// Records a process committed, oldest evicted first, bounded by count and by bytes (a share of the
/// function's memory: records carry step outputs until the next step consumed them).
struct RecentRecords(BoundedCache<Uuid, Execution>);

/// How many committed records a process keeps for the hot path, at most.
const RECENT_CAPACITY: usize = 1024;

impl Default for RecentRecords {
    fn default() -> Self {
        Self(BoundedCache::new(RECENT_CAPACITY, byte_budget()))
    }
}

impl RecentRecords {
    fn remember(&mut self, record: &Execution) {
        self.0.insert(record.id, record.clone(), json_size(record));
    }

    fn get(&self, id: &Uuid) -> Option<&Execution> {
        self.0.get(id)
    }
}

impl Coordinator {
    pub fn new(
        store: Arc<dyn ExecutionStore>,
        registry: Arc<dyn ReleaseRegistry>,
        sender: Arc<dyn MessageSender>,
        clock: Arc<dyn Clock>,
        settings: Settings,
    ) -> Self {
        Self {
            store,
            registry,
            sender,
            clock,
            settings,
            releases: Mutex::new(HashMap::new()),
            workers: Mutex::new(HashMap::new()),
            publisher: None,
            recent: Mutex::new(RecentRecords::default()),
            resent: Mutex::new(BoundedCache::new(RESENT_CAPACITY, usize::MAX)),
            claims: None,
            ledger: None,
            key_source: None,
            keys: std::sync::RwLock::new(None),
        }
    }

    /// Seals requests' records and signs fan-out children's links under the keys of `source`.
    pub fn with_keys(mut self, source: Arc<dyn SealKeySource>) -> Self {
        self.key_source = Some(source);
        self
    }

    /// Turns lifecycle events on: recorded in each commit's outbox, published after it.
    pub fn with_publisher(mut self, publisher: Arc<dyn EventPublisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }

    pub fn store(&self) -> &Arc<dyn ExecutionStore> {
        &self.store
    }

    pub fn registry(&self) -> &Arc<dyn ReleaseRegistry> {
        &self.registry
    }

    /// Where this coordinator's sealing keys come from, if anywhere.
    pub fn key_source(&self) -> Option<&Arc<dyn SealKeySource>> {
        self.key_source.as_ref()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn context(&self, role: Role) -> Context {
        Context {
            now: self.clock.now(),
            jitter: self.clock.jitter(),
            token: self.clock.token(),
            secret: self.clock.secret(),
            owner: format!("{role}:{}", self.settings.instance),
            lease: self.settings.lease,
            lifecycle: self.publisher.is_some(),
        }
    }

    /// The sealing keys: loaded by the first call of the process, read again once they are
    /// [`KEYS_CACHED`] old. None without a key source, or while the keys cannot be read (requests
    /// then go unsealed and replies are read; parent links wait).
    pub async fn seal_keys(&self) -> Option<Arc<SealKeys>> {
        self.keys_newer_than(KEYS_CACHED).await
    }

    async fn keys_newer_than(&self, age: Duration) -> Option<Arc<SealKeys>> {
        let now = self.clock.now();
        let loaded = self.keys.read().expect("keys").clone();
        if let Some((at, keys)) = &loaded {
            if now.since(*at) < age {
                return Some(keys.clone());
            }
        }
        let source = self.key_source.as_ref()?;
        match source.keys().await {
            Ok(keys) => {
                let keys = Arc::new(keys);
                *self.keys.write().expect("keys") = Some((now, keys.clone()));
                Some(keys)
            }
            Err(e) => {
                tracing::warn!(code = %CoordinatorError::from(e).code(), "sealing keys unreadable: requests go unsealed");
                loaded.map(|(_, keys)| keys)
            }
        }
    }

    /// A pinned release's definition.
    pub async fn definition(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Arc<PipelineDef>, CoordinatorError> {
        Ok(self
            .pinned(pipeline_id, release_version)
            .await?
            .definition
            .clone())
    }

    /// A registered release, read once per process.
    async fn pinned(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Arc<Pinned>, CoordinatorError> {
        let key = (pipeline_id.to_string(), release_version.to_string());
        if let Some(pinned) = self.releases.lock().expect("releases").get(&key) {
            return Ok(pinned.clone());
        }
        let release = self
            .registry
            .get(pipeline_id, release_version)
            .await?
            .ok_or_else(|| CoordinatorError::UnknownRelease {
                pipeline_id: pipeline_id.to_string(),
                release_version: release_version.to_string(),
            })?;
        let pinned = Arc::new(Pinned {
            definition: Arc::new(release.definition),
            contract_version: release.contract_version,
        });
        self.releases
            .lock()
            .expect("releases")
            .insert(key, pinned.clone());
        Ok(pinned)
    }

    pub async fn get(&self, id: Uuid) -> Result<Execution, CoordinatorError> {
        self.store
            .get(id)
            .await?
            .ok_or(CoordinatorError::NotFound(id))
    }

    /// Applies an event to one execution and carries out what the commit decided (sends the next
    /// request, the dead-letter envelope, the cancel notice, ...): what a single request does (cancel,
    /// re-drive, an interaction's completion). Batches of queue messages go through [`Coordinator::apply_batch`].
    pub async fn apply(
        &self,
        id: Uuid,
        event: &Event,
        role: Role,
    ) -> Result<Applied, CoordinatorError> {
        let mut outbox = Outbox::sealing_with(self.seal_keys().await);
        let applied = self
            .decide_into(&mut outbox, 0, id, event, role, (false, false))
            .await?;
        self.flush(outbox).await;
        Ok(applied)
    }

    /// Decides and commits an event, then stages the committed actions in `outbox` (sent by the
    /// caller's `flush`). With `hot`, the record this process committed last is decided on without a
    /// read first (see `commit_event`).
    /// `(hot, redelivered)`: see [`Coordinator::commit_event`] for `hot`; `redelivered`: the message
    /// came back unacknowledged, so a reply found applied re-sends what its commit staged.
    async fn decide_into(
        &self,
        outbox: &mut Outbox,
        source: usize,
        id: Uuid,
        event: &Event,
        role: Role,
        (hot, redelivered): (bool, bool),
    ) -> Result<Applied, CoordinatorError> {
        let read = match hot {
            true => Read::Hot(outbox.keys.clone()),
            false => Read::Fresh,
        };
        match self.commit_event(id, event, role, read).await? {
            Decided::Committed {
                record,
                actions,
                definition,
            } => {
                self.stage(outbox, &record, &definition, &actions, source);
                Ok(Applied {
                    record,
                    skipped: None,
                })
            }
            Decided::Unchanged { record, skip } => {
                // A reply applied before, that came back unacknowledged: what its write launched is
                // sent again while nothing happened since (that write's response, or its send, may
                // have been lost). A fresh copy (an SQS duplicate, a worker's re-sent reply) sends
                // nothing: a duplicate would otherwise cascade down the pipeline.
                let again = redelivered.then(|| replied(event)).flatten();
                if let (Skip::Duplicate | Skip::Stale, Some(step)) = (&skip, again) {
                    let definition = self
                        .definition(&record.pipeline_id, &record.release_version)
                        .await?;
                    let again = domain::reply_actions(&record, &definition, step);
                    if !again.is_empty() {
                        tracing::info!(execution_id = %record.id, step = record.step, "a reply applied before came again: its next request is sent again");
                        self.stage(outbox, &record, &definition, &again, source);
                    }
                }
                Ok(Applied {
                    record,
                    skipped: Some(skip),
                })
            }
        }
    }

    /// Load, decide, commit on the version read; on a lost race, decide again on the fresh record.
    ///
    /// With `hot` (a worker's reply), when this process committed the record last, or the reply carries
    /// the record sealed in its token (`domain::seal`), the decision is made on that copy and written
    /// conditionally on its version with no read first (one sequential call fewer). Only a commit is
    /// trusted that way: the condition proves the copy was current. A lost race, or any decision not
    /// to write, falls back to a fresh read.
    async fn commit_event(
        &self,
        id: Uuid,
        event: &Event,
        role: Role,
        read: Read,
    ) -> Result<Decided, CoordinatorError> {
        let mut fresh = None;
        let mut checked = Checked::default();
        if let Read::Hot(keys) = read {
            let cached = self.recent.lock().expect("recent").get(&id).cloned();
            let unsealed = || keys.and_then(|keys| self.unsealed(&keys, id, event));
            if let Some(record) = cached.or_else(unsealed) {
                match self
                    .decide_and_write(record, event, &mut checked, role)
                    .await?
                {
                    Attempt::Done(decided) if matches!(*decided, Decided::Committed { .. }) => {
                        return Ok(*decided)
                    }
                    Attempt::Done(_) | Attempt::Rejected(_) => {}
                    Attempt::Lost(current) => fresh = Some(*current),
                }
            }
        }
        for _ in 0..MAX_RACES {
            let record = match fresh.take() {
                Some(record) => record,
                None => self.get(id).await?,
            };
            match self
                .decide_and_write(record, event, &mut checked, role)
                .await?
            {
                Attempt::Done(decided) => return Ok(*decided),
                Attempt::Rejected(rejection) => return Err(rejection.into()),
                Attempt::Lost(current) => fresh = Some(*current),
            }
        }
        Err(CoordinatorError::Contention(MAX_RACES))
    }

    /// The record a worker's message carries sealed in its token, if the seal holds.
    fn unsealed(&self, keys: &SealKeys, id: Uuid, event: &Event) -> Option<Execution> {
        let Event::FromWorker { sender, .. } = event else {
            return None;
        };
        let sealed = seal::split_token(&sender.token).1?;
        let record = keys.unseal(sealed, id);
        if record.is_none() {
            tracing::warn!(execution_id = %id, "a reply's sealed record does not hold: read instead");
        }
        record
    }

    /// One decision on `record` and, if it writes, one conditional write.
    ///
    /// When the record a worker's reply makes is too large for the store (an output or an error
    /// beyond the item limit), the same reply is decided again once as a final `ITEM_TOO_LARGE`
    /// failure of its step: the execution fails and is dead-lettered, instead of the reply being
    /// retried until it dead-letters with the execution stuck.
    ///
    /// Payloads above the claim-check threshold (`checked`, once per event) are stored only once a
    /// decision on the event as it came would commit: a message refused, unauthenticated or stale
    /// costs no stored object. The event is then decided again with references in their place.
    async fn decide_and_write(
        &self,
        record: Execution,
        event: &Event,
        checked: &mut Checked,
        role: Role,
    ) -> Result<Attempt, CoordinatorError> {
        let definition = self
            .definition(&record.pipeline_id, &record.release_version)
            .await?;
        let mut substitute = None;
        loop {
            let ctx = self.context(role);
            let current = substitute
                .as_ref()
                .or(checked.as_ref().and_then(Option::as_ref))
                .unwrap_or(event);
            let decision = domain::decide(&record, &definition, &ctx, current);
            let (mut next, actions) = match decision {
                Decision::Commit { record, actions } => (record, actions),
                Decision::Skip(skip) => {
                    return Ok(Attempt::Done(Box::new(Decided::Unchanged { record, skip })))
                }
                Decision::Reject(rejection) => return Ok(Attempt::Rejected(rejection)),
            };
            if checked.is_none() {
                let replaced = self.claim_checked_event(record.id, event).await?;
                let changed = replaced.is_some();
                *checked = Some(replaced);
                if changed {
                    continue;
                }
            }
            // History the record no longer holds goes to the journal first (see `domain::history`).
            if let Some((chunk, entries)) = domain::history::spill(&record, &mut next) {
                self.store.put_journal(record.id, chunk, &entries).await?;
            }
            // A lease this decision takes is fresh: its token names this write alone.
            let lease = |r: &Execution| r.lease.as_ref().map(|l| l.token);
            let fresh_lease = lease(&next).filter(|token| lease(&record) != Some(*token));
            let written = match self.commit(&next, record.version, fresh_lease).await {
                Err(CoordinatorError::Store(StoreError::TooLarge(detail)))
                    if substitute.is_none() =>
                {
                    substitute = domain::oversized_reply(event, &detail);
                    match substitute {
                        Some(_) => {
                            tracing::error!(execution_id = %record.id, detail, "the step's outcome does not fit in the record: the step fails");
                            continue;
                        }
                        None => return Err(StoreError::TooLarge(detail).into()),
                    }
                }
                written => written?,
            };
            return Ok(match written {
                Written::Committed => {
                    observe(&record, &next, &actions);
                    self.recent.lock().expect("recent").remember(&next);
                    Attempt::Done(Box::new(Decided::Committed {
                        record: *next,
                        actions,
                        definition,
                    }))
                }
                Written::Lost(current) => Attempt::Lost(current),
            });
        }
    }

    /// A conditional write of `next` over version `expected`. A failed condition is read back: a record
    /// carrying this write's id is this write, applied although its response was lost (the SDK's retry
    /// then met its own version); so is a later version still holding the lease this write took
    /// (`fresh_lease`): another writer wrote over it in between, and nobody has acted on the lease yet,
    /// so what this write decided is still to be sent. Anything else lost the race to another writer.
    async fn commit(
        &self,
        next: &Execution,
        expected: u64,
        fresh_lease: Option<Uuid>,
    ) -> Result<Written, CoordinatorError> {
        match self.store.replace(next, expected).await {
            Ok(()) => Ok(Written::Committed),
            Err(StoreError::Conflict) => {
                let current = self.get(next.id).await?;
                let under_later = fresh_lease.is_some()
                    && current.version > next.version
                    && current.generation == next.generation
                    && current.lease.as_ref().map(|l| l.token) == fresh_lease;
                let own = current.version == next.version && current.write_id == next.write_id
                    || under_later;
                if own && !crate::planted!(LostResponseDropsSend) {
                    tracing::info!(execution_id = %next.id, version = next.version, "own write recognised after a lost response");
                    Ok(Written::Committed)
                } else {
                    Ok(Written::Lost(Box::new(current)))
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The step a worker's reply answers.
fn replied(event: &Event) -> Option<u32> {
    match event {
        Event::FromWorker { event, .. } => match event.as_ref() {
            Event::Reply { step, .. } => Some(*step),
            _ => None,
        },
        _ => None,
    }
}

/// Metrics of a committed transition (Embedded Metric Format log lines, inside Lambda).
fn observe(before: &Execution, after: &Execution, actions: &[Action]) {
    use crate::metrics::{emit, Metric};
    let pipeline = after.pipeline_id.as_str();
    let at = after.updated_at;
    let completed = after.steps_succeeded_since(before).len();
    if completed > 0 {
        emit(Metric::StepsCompleted, completed as f64, pipeline, at);
        // The record's previous write launched the step (or recorded its last heartbeat).
        emit(
            Metric::StepLatency,
            after.updated_at.since(before.updated_at).as_millis() as f64,
            pipeline,
            at,
        );
    }
    if after.status == domain::Status::WaitRetry && before.status != domain::Status::WaitRetry {
        emit(Metric::Retries, 1.0, pipeline, at);
    }
    let dead = actions
        .iter()
        .filter(|a| matches!(a, Action::SendDeadLetter { .. }))
        .count();
    if dead > 0 {
        emit(Metric::DeadLetters, dead as f64, pipeline, at);
    }
    // The sweeper gave up on an outbox (its decision noted the drop in this very write).
    let dropped_now = after
        .incidents
        .last()
        .is_some_and(|i| i.code == domain::machine::EVENTS_DROPPED && i.at == after.updated_at);
    if dropped_now && !before.events.is_empty() && after.events.is_empty() {
        let dropped = before.events.len() as f64;
        emit(Metric::EventsDropped, dropped, pipeline, at);
        emit(Metric::EventsDropped, dropped, "", at);
    }
}

/// How a conditional write ended.
enum Written {
    Committed,
    /// Another writer got there first: the record as it is now.
    Lost(Box<Execution>),
}
