//! Ports: the narrow interfaces the coordinator depends on. AWS adapters live in `adapters`, in-memory
//! stand-ins for unit and simulation tests in `adapters::memory`.

use async_trait::async_trait;
use uuid::Uuid;

use crate::domain::history::Entry;
use crate::domain::release::{Activation, Release, WorkerRecord};
use crate::domain::seal::SealKeys;
use crate::domain::{ChildEnd, Execution, Tally, Timestamp};
use std::collections::HashMap;
use std::ops::Range;
use std::time::Duration;

/// Store failures the handlers must tell apart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// A conditional write lost: the item changed since it was read (or already exists).
    #[error("conditional write failed: the item changed since it was read")]
    Conflict,
    /// A transient failure (throttling, network): try again.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// An item that cannot be mapped to a record.
    #[error("corrupt item: {0}")]
    Corrupt(String),
    /// Something the operation requires does not exist.
    #[error("not found: {0}")]
    Missing(String),
    /// The record would exceed the store's item size limit: the same write can never succeed.
    #[error("item too large: {0}")]
    TooLarge(String),
}

impl StoreError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::Conflict)
    }
}

/// What deferring a due entry answers: its new due time, `None` if it is gone.
pub type Deferred = Result<Option<Timestamp>, StoreError>;

/// The execution table. Every change is conditional on the version read.
#[async_trait]
pub trait ExecutionStore: Send + Sync {
    /// Strongly consistent read.
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError>;
    /// Creates a record; `Conflict` if the id exists.
    async fn create(&self, record: &Execution) -> Result<(), StoreError>;
    /// Replaces the record if its stored version is still `expected_version`; `Conflict` otherwise.
    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError>;
    /// One page of the executions due in one shard of the due-time index, earliest first (a Query,
    /// never a Scan).
    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError>;
    /// Pushes an execution's due-index entry back (never forward), after a claim that cannot succeed:
    /// it counts the execution's failed claims and moves the entry to `backoff.until(now, failures)`,
    /// so one bad item never holds the head of its shard. A later write of the record replaces the
    /// entry (and forgets the count). Returns the new due time; `None` if the entry is gone.
    async fn defer(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Deferred;
    /// Number of due-index shards entries are written to now.
    fn shards(&self) -> u32;
    /// Writes chunk `chunk` of an execution's history journal (the same chunk again replaces it with
    /// the same entries: see `domain::history`).
    async fn put_journal(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Result<(), StoreError>;
    /// Chunks `0..chunks` of an execution's journal, in order (`None` for one not found).
    async fn journal(&self, id: Uuid, chunks: u32) -> Result<Vec<Option<Vec<Entry>>>, StoreError>;
    /// One page of the list index: the executions of a pipeline created on one day, newest first.
    async fn list(&self, query: ListQuery) -> Result<ListPage, StoreError>;
    /// The records of `ids` that exist (eventually consistent; any order).
    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError>;
}

/// A day of the list index (UTC days since the epoch: [`Timestamp::days`]).
pub const DAY: Duration = Duration::from_secs(86_400);

/// A page of the list index to read: executions of `pipeline_id` created on `day` (days since the
/// epoch), before `before` (exclusive), newest first, at most `limit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    pub pipeline_id: String,
    pub day: i64,
    pub before: ListCursor,
    pub limit: i32,
}

/// A position in the list index: an execution's creation time and id (the index's sort key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListCursor {
    pub created_at: Timestamp,
    pub id: Uuid,
}

impl ListCursor {
    /// Just after every execution created before `at` (an exclusive bound at `at`).
    pub fn before(at: Timestamp) -> Self {
        Self {
            created_at: at,
            id: Uuid::nil(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    pub keys: Vec<ListCursor>,
    /// Set when the day may hold more entries after this page.
    pub more: bool,
}

/// The fan-out ledger: where a fan-out's children are counted, outside the parent's record (see
/// `domain::fan_out`, and `coordinator::count_child` for how the three writes of a count combine). A
/// unit is named by its id (the fan-out attempt's launch id). Every write is idempotent: a crash
/// between two of them is recovered by making them all again. Each child has **one outcome**: an end
/// is written with the child's version at that end, over an earlier end of the same child (a
/// re-driven child that ended again), never over a later one, conditionally.
#[async_trait]
pub trait FanOutLedger: Send + Sync {
    /// Keeps a child's end (of the child's record version `version`) under its own key, unless an
    /// end of a later version is kept there: `false` then (the end is stale).
    async fn keep(&self, unit: Uuid, end: &ChildEnd, version: u64) -> Result<bool, StoreError>;
    /// Sets `item`'s one outcome (succeeded or failed) in its block, in place of the outcome of an
    /// earlier version of the child; `None` when a later version's outcome is there.
    async fn set_outcome(
        &self,
        unit: Uuid,
        outcome: ItemOutcome,
    ) -> Result<Option<BlockCount>, StoreError>;
    /// Adds a completed block and/or a failed item to the unit's head, and takes out an item that
    /// failed before and has now succeeded (`recovered`); returns how many blocks are complete and
    /// how many children failed, after.
    async fn add_to_head(&self, unit: Uuid, change: HeadChange) -> Result<(u32, u32), StoreError>;
    /// The children of a unit of `items` counted so far (strongly consistent).
    async fn tally(&self, unit: Uuid, items: u32) -> Result<Tally, StoreError>;
    /// The kept ends of `items`, in item order (`None` for one not kept).
    async fn ends(
        &self,
        unit: Uuid,
        items: Range<u32>,
    ) -> Result<Vec<Option<ChildEnd>>, StoreError>;
}

/// An item's one outcome, to set in its block: succeeded or failed, as of the child's record
/// version `version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemOutcome {
    pub item: u32,
    pub succeeded: bool,
    pub version: u64,
}

/// What a count adds to a unit's head: a block that is complete, an item that failed, and an item
/// that failed before and has now succeeded (taken out of the failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeadChange {
    pub block: Option<u32>,
    pub failed: Option<u32>,
    pub recovered: Option<u32>,
}

/// A block of the fan-out ledger after an outcome was set in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCount {
    /// Items of the block with an outcome (each once, whatever its outcome).
    pub counted: u32,
    /// The item's outcome before was a failure.
    pub was_failed: bool,
}

/// A page of the due index to read: at most `limit` executions due at `now` in `shard`, after `after`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueQuery {
    pub shard: u32,
    pub now: Timestamp,
    pub limit: i32,
    pub after: Option<DueCursor>,
}

/// Where a page of the due index ended: the last entry's due time and execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct DueCursor {
    pub due_at: Timestamp,
    pub id: Uuid,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DuePage {
    pub ids: Vec<Uuid>,
    /// Set when the shard may hold more due entries after this page.
    pub next: Option<DueCursor>,
}

/// How far a failing claim is pushed back: doubling from `base` per failure, up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn until(&self, now: Timestamp, failures: u32) -> Timestamp {
        let doublings = failures.saturating_sub(1).min(30);
        now + self.base.saturating_mul(1 << doublings).min(self.max)
    }
}

/// Result of registering a pipeline release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    Created,
    /// The identical definition was already registered: nothing written.
    Unchanged,
}

/// An activation to append to a pipeline's history: which release, when (epoch ms), and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivationRequest<'a> {
    pub pipeline_id: &'a str,
    pub release_version: &'a str,
    pub at: Timestamp,
    pub reason: &'a str,
}

impl ActivationRequest<'_> {
    /// The activation this request appends at `sequence`.
    pub fn at_sequence(&self, sequence: u64) -> Activation {
        Activation {
            pipeline_id: self.pipeline_id.to_string(),
            release_version: self.release_version.to_string(),
            sequence,
            at: self.at,
            reason: self.reason.to_string(),
        }
    }
}

/// The release registry: immutable release descriptors and their append-only activation history.
#[async_trait]
pub trait ReleaseRegistry: Send + Sync {
    async fn get(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Option<Release>, StoreError>;
    async fn list(&self, pipeline_id: &str) -> Result<Vec<Release>, StoreError>;
    /// Registers an immutable release; a different descriptor under the same version is `Conflict`.
    async fn register(&self, release: &Release) -> Result<Registration, StoreError>;
    /// Appends an activation of a registered release (`Missing` if it is not registered).
    async fn activate(&self, request: ActivationRequest<'_>) -> Result<Activation, StoreError> {
        let (pipeline, release) = (request.pipeline_id, request.release_version);
        if self.get(pipeline, release).await?.is_none() {
            let missing = format!("release {release} of pipeline {pipeline}");
            return Err(StoreError::Missing(missing));
        }
        self.append_activation(request).await
    }
    /// Appends an activation at the pipeline's next sequence (`activate`, once the release is known).
    async fn append_activation(
        &self,
        request: ActivationRequest<'_>,
    ) -> Result<Activation, StoreError>;
    /// Activations, oldest first.
    async fn history(&self, pipeline_id: &str) -> Result<Vec<Activation>, StoreError>;
    /// The latest activation.
    async fn active(&self, pipeline_id: &str) -> Result<Option<Activation>, StoreError>;
    /// Records a worker's announcement. A worker that drains stays draining (its announcements may
    /// arrive out of order); otherwise the latest `seenAt` wins.
    async fn announce(&self, worker: &WorkerRecord) -> Result<(), StoreError>;
    /// The workers of a pipeline, as last heard of.
    async fn workers(&self, pipeline_id: &str) -> Result<Vec<WorkerRecord>, StoreError>;
}

/// Where the coordinator's sealing keys (`domain::seal`) come from: a secrets store that only the
/// coordinator's functions may read; no table holds them, and operators' tools never need them.
#[async_trait]
pub trait SealKeySource: Send + Sync {
    /// The current key and the one it replaced, if any.
    async fn keys(&self) -> Result<SealKeys, StoreError>;
}

/// One message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMessage {
    pub body: String,
    pub delay_secs: u32,
    /// String message attributes (name, value).
    pub attributes: Vec<(String, String)>,
}

impl OutMessage {
    pub fn new(body: String) -> Self {
        Self {
            body,
            delay_secs: 0,
            attributes: Vec::new(),
        }
    }

    pub fn delayed(body: String, delay_secs: u32) -> Self {
        Self {
            delay_secs,
            ..Self::new(body)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("send to {queue} failed: {reason}")]
pub struct SendError {
    pub queue: String,
    pub reason: String,
}

impl SendError {
    pub fn new(queue: &str, reason: impl Into<String>) -> Self {
        Self {
            queue: queue.to_string(),
            reason: reason.into(),
        }
    }
}

/// How sending one message went (or one request about messages of a queue).
pub type Sent = Result<(), SendError>;

/// Sends messages to a queue, named by URL or by queue name (resolved through the queue service).
#[async_trait]
pub trait MessageSender: Send + Sync {
    /// Sends in batches; returns one result per message, in order.
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent>;

    /// Makes received messages of `queue` (by receipt handle) visible again in `seconds`, instead of
    /// at the end of the queue's visibility timeout: a message left unacknowledged comes back soon.
    /// A sender that cannot (one with no queue behind it) leaves them to the visibility timeout.
    async fn redeliver_in(&self, _queue: &str, _receipts: &[String], _seconds: u32) -> Sent {
        Ok(())
    }
}

/// A message received from a dead-letter queue, held invisible until deleted or released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub handle: String,
    pub body: String,
    pub attributes: HashMap<String, String>,
    /// Epoch milliseconds the message was first sent (SQS `SentTimestamp`).
    pub sent_at: Option<Timestamp>,
}

/// A dead-letter queue, as bulk replay and moving messages back read it.
#[async_trait]
pub trait DeadLetterQueue: Send + Sync {
    /// Receives up to `max` (at most 10) messages and hides them while the replay runs.
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, StoreError>;
    async fn delete(&self, handle: &str) -> Result<(), StoreError>;
    /// Makes a held message visible again.
    async fn release(&self, handle: &str) -> Result<(), StoreError>;
}

/// A lifecycle event as published to the event bus.
#[derive(Debug, Clone, PartialEq)]
pub struct BusEvent {
    pub detail_type: String,
    pub detail: serde_json::Value,
}

/// Publishes lifecycle events (EventBridge `PutEvents`).
#[async_trait]
pub trait EventPublisher: Send + Sync {
    /// Publishes in batches; returns one result per event, in order.
    async fn publish(&self, events: &[BusEvent]) -> Vec<Result<(), String>>;
}

/// Time and randomness, injected so the state machine's inputs can be controlled in tests.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
    /// A fresh random token.
    fn token(&self) -> Uuid;
    /// A fresh reply secret, drawn on its own (from the operating system unless a simulation's clock
    /// draws it from its seed).
    fn secret(&self) -> [u8; 16] {
        crate::domain::crypto::random()
    }
    /// Uniform in `[0, 1)`.
    fn jitter(&self) -> f64;
}

/// Wall clock and thread-local randomness.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }

    fn token(&self) -> Uuid {
        Uuid::new_v4()
    }

    fn jitter(&self) -> f64 {
        fastrand::f64()
    }
}

/// Where claim-checked payloads are kept (an S3 bucket): immutable objects, written before the
/// reference to them is committed or sent.
#[async_trait]
pub trait PayloadStore: Send + Sync {
    /// Creates object `key` holding `bytes`, never over an object that exists (`Conflict` then):
    /// payload objects are immutable, so that whoever has seen a reference cannot change what it
    /// names. (Keys are content addresses, or named by what they hold: writing one again is a no-op.)
    async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), StoreError>;
    /// The bytes under `key` (`Missing` if there are none).
    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError>;
    /// The bytes under `key` in `bytes` (none past its end): one page of a large object. An
    /// adapter that can read a range reads only that; by default the whole object is read and cut.
    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        bytes: Range<u64>,
    ) -> Result<Vec<u8>, StoreError> {
        let object = self.get(bucket, key).await?;
        let end = (bytes.end as usize).min(object.len());
        Ok(object[(bytes.start as usize).min(end)..end].to_vec())
    }
}

/// The shard of the due index an execution belongs to.
pub fn due_shard(id: Uuid, shards: u32) -> u32 {
    (id.as_u128() % u128::from(shards.max(1))) as u32
}
