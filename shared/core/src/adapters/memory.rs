//! In-memory stand-ins of the ports for unit and simulation tests. They follow the same conditional
//! semantics as the DynamoDB adapters: `create` fails on an existing id, `replace` on a changed version.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use crate::domain::fan_out::{block_len, block_of};
use crate::domain::history::Entry;
use crate::domain::release::{Activation, Release, WorkerRecord};
use crate::domain::seal::{SealKey, SealKeys};
use crate::domain::{ChildEnd, Execution, PipelineDef, Tally, Timestamp};
use crate::ports::{due_shard, Deferred};
use crate::ports::{
    ActivationRequest, Backoff, BlockCount, DueCursor, DuePage, DueQuery, ExecutionStore,
    FanOutLedger, HeadChange, ItemOutcome, ListCursor, ListPage, ListQuery, MessageSender,
    OutMessage, PayloadStore, Registration, ReleaseRegistry, SendError, Sent, StoreError,
};

#[derive(Default)]
pub struct InMemoryExecutionStore {
    /// Ordered by id, so that a walk over them is the same on every run.
    records: Mutex<BTreeMap<Uuid, Execution>>,
    deferrals: Mutex<Deferrals>,
    shards: u32,
    /// Reads and writes that reached the store (tests count the calls of a path).
    gets: AtomicUsize,
    writes: AtomicUsize,
    /// List-index pages read.
    lists: AtomicUsize,
    /// Answer the next write as the SDK's retry does after a lost response: applied, then `Conflict`.
    lose_next: AtomicBool,
    /// Answer the next write as when every attempt's response is lost: applied, then `Unavailable`.
    lose_all_next: AtomicBool,
    /// Write over the next replace as someone else before its lost response comes back `Conflict`.
    overwrite_next: AtomicBool,
    /// Records larger than this (JSON bytes) are refused as `TooLarge`, as DynamoDB refuses items
    /// over 400 KB (none: no limit).
    item_limit: Option<usize>,
    /// History journal chunks, by execution and chunk.
    journal: Mutex<BTreeMap<(Uuid, u32), Vec<Entry>>>,
}

/// A page of the list index over `records`, as the DynamoDB adapter's index answers it.
pub fn list_page<'a>(records: impl Iterator<Item = &'a Execution>, query: &ListQuery) -> ListPage {
    let mut keys: Vec<ListCursor> = records
        .filter(|r| r.pipeline_id == query.pipeline_id && r.created_at.days() == query.day)
        .map(|r| ListCursor {
            created_at: r.created_at,
            id: r.id,
        })
        .filter(|k| *k < query.before)
        .collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let limit = query.limit.max(1) as usize;
    let more = keys.len() > limit;
    keys.truncate(limit);
    ListPage { keys, more }
}

/// Due-index entries pushed back by `defer`, as the DynamoDB adapter moves an item's `dueAt`: a
/// write of the record replaces its entry, and with it the deferral.
#[derive(Debug, Default)]
pub struct Deferrals(BTreeMap<Uuid, (Timestamp, u32)>);

impl Deferrals {
    pub fn defer(
        &mut self,
        record: &Execution,
        now: Timestamp,
        backoff: Backoff,
    ) -> Option<Timestamp> {
        record.index_due()?;
        let entry = self.0.entry(record.id).or_insert((Timestamp::EPOCH, 0));
        entry.1 += 1;
        entry.0 = backoff.until(now, entry.1);
        Some(entry.0)
    }

    pub fn written(&mut self, id: Uuid) {
        self.0.remove(&id);
    }

    /// The record's due-index entry, deferrals applied.
    pub fn due_at(&self, record: &Execution) -> Option<Timestamp> {
        let due = record.index_due()?;
        Some(
            self.0
                .get(&record.id)
                .map_or(due, |(until, _)| due.max(*until)),
        )
    }
}

/// One page of due entries, as a Query of one shard returns it: due by `now`, earliest first, after
/// the cursor, at most `limit`.
pub fn due_page(entries: impl Iterator<Item = (Timestamp, Uuid)>, query: DueQuery) -> DuePage {
    let DueQuery {
        now, limit, after, ..
    } = query;
    let mut due: Vec<DueCursor> = entries
        .filter(|(d, _)| *d <= now)
        .map(|(due_at, id)| DueCursor { due_at, id })
        .filter(|c| after.is_none_or(|a| *c > a))
        .collect();
    due.sort();
    let limit = limit.max(1) as usize;
    let more = due.len() > limit;
    due.truncate(limit);
    DuePage {
        next: if more { due.last().copied() } else { None },
        ids: due.into_iter().map(|c| c.id).collect(),
    }
}

impl InMemoryExecutionStore {
    pub fn new(shards: u32) -> Self {
        Self {
            shards: shards.max(1),
            ..Self::default()
        }
    }

    /// Refuses records larger than `bytes` (as JSON) with `TooLarge`.
    pub fn with_item_limit(mut self, bytes: usize) -> Self {
        self.item_limit = Some(bytes);
        self
    }

    fn check_size(&self, record: &Execution) -> Result<(), StoreError> {
        let size = crate::cache::json_size(record);
        match self.item_limit {
            Some(limit) if size > limit => Err(StoreError::TooLarge(format!(
                "a record of {size} bytes exceeds the {limit} byte limit"
            ))),
            _ => Ok(()),
        }
    }

    /// Reads (`get`) that reached the store.
    pub fn gets(&self) -> usize {
        self.gets.load(Ordering::SeqCst)
    }

    /// Writes (`create`, `replace`) that reached the store, applied or not.
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// List-index pages read so far.
    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::SeqCst)
    }

    /// The next write is applied but answered with `Conflict`, as the SDK's retry of a write whose
    /// response was lost meets the version the write itself set.
    pub fn lose_next_response(&self) {
        self.lose_next.store(true, Ordering::SeqCst);
    }

    /// The next write is applied but every attempt's response is lost: the caller sees the store
    /// unavailable and cannot tell that its write was applied.
    pub fn lose_every_response_of_the_next_write(&self) {
        self.lose_all_next.store(true, Ordering::SeqCst);
    }

    /// The next replace is applied, then written over by someone else (a write that keeps the lease,
    /// as an incident note does) before its response, lost, comes back as the SDK retry's conflict.
    pub fn overwrite_after_the_next_replace(&self) {
        self.overwrite_next.store(true, Ordering::SeqCst);
    }

    /// The outcome of a write that was applied.
    fn answer(&self) -> Result<(), StoreError> {
        if self.lose_all_next.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Unavailable(
                "every attempt's response was lost".into(),
            ));
        }
        match self.lose_next.swap(false, Ordering::SeqCst) {
            true => Err(StoreError::Conflict),
            false => Ok(()),
        }
    }

    pub fn snapshot(&self, id: Uuid) -> Option<Execution> {
        self.read(id, Execution::clone)
    }

    /// `f` of the record held under `id`, read in place.
    pub fn read<T>(&self, id: Uuid, f: impl FnOnce(&Execution) -> T) -> Option<T> {
        self.records.lock().expect("store").get(&id).map(f)
    }

    /// Writes `record` on the condition DynamoDB's conditional writes check: none held under its id
    /// (`expected` none, a create), or one at version `expected` (a replace); `Conflict` otherwise.
    pub fn write(&self, record: &Execution, expected: Option<u64>) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.check_size(record)?;
        {
            let mut records = self.records.lock().expect("store");
            let held = records.get(&record.id).map(|r| r.version);
            if held != expected {
                return Err(StoreError::Conflict);
            }
            records.insert(record.id, record.clone());
            self.deferrals.lock().expect("store").written(record.id);
        }
        if expected.is_some() && self.overwrite_next.swap(false, Ordering::SeqCst) {
            let mut later = record.clone();
            later.version += 1;
            later.write_id = "someone-else".into();
            self.write(&later, Some(record.version))?;
            return Err(StoreError::Conflict);
        }
        self.answer()
    }

    /// Pushes the record's due-index entry back (see [`ExecutionStore::defer`]).
    pub fn defer_entry(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Option<Timestamp> {
        let records = self.records.lock().expect("store");
        let mut deferrals = self.deferrals.lock().expect("store");
        deferrals.defer(records.get(&id)?, now, backoff)
    }

    /// The record's due-index entry, deferrals applied.
    pub fn due_at(&self, id: Uuid) -> Option<Timestamp> {
        let records = self.records.lock().expect("store");
        self.deferrals
            .lock()
            .expect("store")
            .due_at(records.get(&id)?)
    }

    /// Stores a history journal chunk; answers the entries it replaces, if it was written before.
    pub fn put_chunk(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Option<Vec<Entry>> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let mut journal = self.journal.lock().expect("store");
        journal.insert((id, chunk), entries.to_vec())
    }

    /// A history journal chunk, if it was written.
    pub fn chunk(&self, id: Uuid, chunk: u32) -> Option<Vec<Entry>> {
        self.journal
            .lock()
            .expect("store")
            .get(&(id, chunk))
            .cloned()
    }

    /// The records `predicate` holds for.
    pub fn find(&self, predicate: impl Fn(&Execution) -> bool) -> Vec<Execution> {
        let records = self.records.lock().expect("store");
        records.values().filter(|r| predicate(r)).cloned().collect()
    }

    /// How many records held match `predicate`.
    pub fn count(&self, predicate: impl Fn(&Execution) -> bool) -> usize {
        let records = self.records.lock().expect("store");
        records.values().filter(|r| predicate(r)).count()
    }
}

#[async_trait]
impl ExecutionStore for InMemoryExecutionStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Ok(self.snapshot(id))
    }

    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        self.write(record, None)
    }

    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError> {
        self.write(record, Some(expected_version))
    }

    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError> {
        let records = self.records.lock().expect("store");
        let deferrals = self.deferrals.lock().expect("store");
        let entries = records
            .values()
            .filter(|r| due_shard(r.id, self.shards) == query.shard)
            .filter_map(|r| deferrals.due_at(r).map(|d| (d, r.id)));
        Ok(due_page(entries, query))
    }

    async fn defer(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Deferred {
        Ok(self.defer_entry(id, now, backoff))
    }

    fn shards(&self) -> u32 {
        self.shards
    }

    async fn put_journal(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Result<(), StoreError> {
        self.put_chunk(id, chunk, entries);
        Ok(())
    }

    async fn journal(&self, id: Uuid, chunks: u32) -> Result<Vec<Option<Vec<Entry>>>, StoreError> {
        Ok((0..chunks).map(|k| self.chunk(id, k)).collect())
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage, StoreError> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        let records = self.records.lock().expect("store");
        Ok(list_page(records.values(), &query))
    }

    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError> {
        let records = self.records.lock().expect("store");
        Ok(ids
            .iter()
            .filter_map(|id| records.get(id).cloned())
            .collect())
    }
}

/// The fan-out ledger as the DynamoDB adapter keeps it: an end per child, two sets per block, two
/// per unit head; every write counted (tests compare the calls a fan-out costs).
#[derive(Default)]
pub struct InMemoryFanOutLedger {
    units: Mutex<HashMap<Uuid, LedgerUnit>>,
    writes: AtomicUsize,
}

#[derive(Default)]
struct LedgerUnit {
    /// Per item: its kept end and the child's version at that end.
    ends: HashMap<u32, (ChildEnd, u64)>,
    /// Per block: succeeded and failed items.
    blocks: HashMap<u32, (BTreeSet<u32>, BTreeSet<u32>)>,
    /// Per item: the version its outcome came from.
    outcome_versions: HashMap<u32, u64>,
    complete_blocks: BTreeSet<u32>,
    failed: BTreeSet<u32>,
}

impl InMemoryFanOutLedger {
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    fn with_unit<T>(&self, unit: Uuid, f: impl FnOnce(&mut LedgerUnit) -> T) -> T {
        self.writes.fetch_add(1, Ordering::SeqCst);
        f(self.units.lock().expect("ledger").entry(unit).or_default())
    }
}

#[async_trait]
impl FanOutLedger for InMemoryFanOutLedger {
    async fn keep(&self, unit: Uuid, end: &ChildEnd, version: u64) -> Result<bool, StoreError> {
        Ok(self.with_unit(unit, |u| {
            if u.ends
                .get(&end.item)
                .is_some_and(|(_, kept)| *kept > version)
            {
                return false;
            }
            u.ends.insert(end.item, (end.clone(), version));
            true
        }))
    }

    async fn set_outcome(
        &self,
        unit: Uuid,
        outcome: ItemOutcome,
    ) -> Result<Option<BlockCount>, StoreError> {
        let ItemOutcome {
            item,
            succeeded,
            version,
        } = outcome;
        Ok(self.with_unit(unit, |u| {
            if u.outcome_versions.get(&item).is_some_and(|v| *v > version) {
                return None;
            }
            u.outcome_versions.insert(item, version);
            let (ok, failed) = u.blocks.entry(block_of(item)).or_default();
            let was_failed = failed.contains(&item);
            let replaces = !crate::planted!(LedgerCountsTwice);
            if succeeded {
                if replaces {
                    failed.remove(&item);
                }
                ok.insert(item);
            } else {
                if replaces {
                    ok.remove(&item);
                }
                failed.insert(item);
            }
            Some(BlockCount {
                counted: (ok.len() + failed.len()) as u32,
                was_failed,
            })
        }))
    }

    async fn add_to_head(&self, unit: Uuid, change: HeadChange) -> Result<(u32, u32), StoreError> {
        Ok(self.with_unit(unit, |u| {
            u.complete_blocks.extend(change.block);
            u.failed.extend(change.failed);
            if let Some(item) = change.recovered {
                u.failed.remove(&item);
            }
            (u.complete_blocks.len() as u32, u.failed.len() as u32)
        }))
    }

    async fn tally(&self, unit: Uuid, items: u32) -> Result<Tally, StoreError> {
        let units = self.units.lock().expect("ledger");
        let mut tally = Tally::default();
        if let Some(u) = units.get(&unit) {
            for (block, (ok, failed)) in &u.blocks {
                if block_len(*block, items) > 0 {
                    tally.succeeded += ok.len() as u32;
                    tally.failed += failed.len() as u32;
                }
            }
        }
        Ok(tally)
    }

    async fn ends(
        &self,
        unit: Uuid,
        items: Range<u32>,
    ) -> Result<Vec<Option<ChildEnd>>, StoreError> {
        let units = self.units.lock().expect("ledger");
        let u = units.get(&unit);
        Ok(items
            .map(|i| u.and_then(|u| u.ends.get(&i).map(|(end, _)| end.clone())))
            .collect())
    }
}

#[derive(Default)]
pub struct InMemoryReleaseRegistry {
    releases: Mutex<BTreeMap<(String, String), Release>>,
    activations: Mutex<Vec<Activation>>,
    workers: Mutex<BTreeMap<(String, String), WorkerRecord>>,
}

impl InMemoryReleaseRegistry {
    /// A registry with the releases of `definitions` (no artifacts) registered and active from 0.
    pub async fn activated(
        definitions: impl IntoIterator<Item = PipelineDef>,
        reason: &str,
    ) -> Self {
        let registry = Self::default();
        for definition in definitions {
            let release = Release::new(definition, Vec::new());
            registry.register(&release).await.expect("registered");
            let activation = ActivationRequest {
                pipeline_id: &release.pipeline_id,
                release_version: &release.release_version,
                at: Timestamp::EPOCH,
                reason,
            };
            registry.activate(activation).await.expect("activated");
        }
        registry
    }
}

#[async_trait]
impl ReleaseRegistry for InMemoryReleaseRegistry {
    async fn get(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Option<Release>, StoreError> {
        Ok(self
            .releases
            .lock()
            .expect("registry")
            .get(&(pipeline_id.to_string(), release_version.to_string()))
            .cloned())
    }

    async fn list(&self, pipeline_id: &str) -> Result<Vec<Release>, StoreError> {
        Ok(self
            .releases
            .lock()
            .expect("registry")
            .values()
            .filter(|r| r.pipeline_id == pipeline_id)
            .cloned()
            .collect())
    }

    async fn register(&self, release: &Release) -> Result<Registration, StoreError> {
        let mut releases = self.releases.lock().expect("registry");
        let key = (release.pipeline_id.clone(), release.release_version.clone());
        match releases.get(&key) {
            Some(existing) if existing == release => Ok(Registration::Unchanged),
            Some(_) => Err(StoreError::Conflict),
            None => {
                releases.insert(key, release.clone());
                Ok(Registration::Created)
            }
        }
    }

    async fn append_activation(
        &self,
        request: ActivationRequest<'_>,
    ) -> Result<Activation, StoreError> {
        let mut activations = self.activations.lock().expect("registry");
        let earlier = activations
            .iter()
            .filter(|a| a.pipeline_id == request.pipeline_id)
            .count() as u64;
        let activation = request.at_sequence(earlier + 1);
        activations.push(activation.clone());
        Ok(activation)
    }

    async fn history(&self, pipeline_id: &str) -> Result<Vec<Activation>, StoreError> {
        Ok(self
            .activations
            .lock()
            .expect("registry")
            .iter()
            .filter(|a| a.pipeline_id == pipeline_id)
            .cloned()
            .collect())
    }

    async fn active(&self, pipeline_id: &str) -> Result<Option<Activation>, StoreError> {
        Ok(self.history(pipeline_id).await?.pop())
    }

    async fn announce(&self, worker: &WorkerRecord) -> Result<(), StoreError> {
        let mut workers = self.workers.lock().expect("registry");
        let key = (worker.pipeline_id.clone(), worker.worker_id.clone());
        let replaces = |w: &WorkerRecord| w.seen_at <= worker.seen_at;
        if workers.get(&key).is_none_or(replaces) {
            workers.insert(key, worker.clone());
        }
        Ok(())
    }

    async fn workers(&self, pipeline_id: &str) -> Result<Vec<WorkerRecord>, StoreError> {
        Ok(self
            .workers
            .lock()
            .expect("registry")
            .values()
            .filter(|w| w.pipeline_id == pipeline_id)
            .cloned()
            .collect())
    }
}

/// Records every message sent, per queue; fails only the sends it is told to fail.
#[derive(Default)]
pub struct RecordingSender {
    sent: Mutex<Vec<(String, OutMessage)>>,
    /// Queues whose next send fails (the message is not sent).
    fail_next: Mutex<Vec<String>>,
    redeliveries: Mutex<Vec<(String, String, u32)>>,
}

impl RecordingSender {
    /// The messages made visible early so far: (queue, receipt handle, seconds).
    pub fn redeliveries(&self) -> Vec<(String, String, u32)> {
        self.redeliveries.lock().expect("sender").clone()
    }

    /// The next send to `queue` fails, as a send whose every attempt failed.
    pub fn fail_next_send_to(&self, queue: &str) {
        self.fail_next
            .lock()
            .expect("sender")
            .push(queue.to_string());
    }

    /// Takes the messages sent so far.
    pub fn drain(&self) -> Vec<(String, OutMessage)> {
        std::mem::take(&mut *self.sent.lock().expect("sender"))
    }
}

#[async_trait]
impl MessageSender for RecordingSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        let mut sent = self.sent.lock().expect("sender");
        let mut fail_next = self.fail_next.lock().expect("sender");
        messages
            .iter()
            .map(|m| {
                if let Some(at) = fail_next.iter().position(|q| q == queue) {
                    fail_next.remove(at);
                    return Err(SendError {
                        queue: queue.to_string(),
                        reason: "the send failed".into(),
                    });
                }
                sent.push((queue.to_string(), m.clone()));
                Ok(())
            })
            .collect()
    }

    async fn redeliver_in(&self, queue: &str, receipts: &[String], seconds: u32) -> Sent {
        let mut redeliveries = self.redeliveries.lock().expect("sender");
        for receipt in receipts {
            redeliveries.push((queue.to_string(), receipt.clone(), seconds));
        }
        Ok(())
    }
}

/// Payload objects in memory, by bucket and key.
#[derive(Default)]
pub struct InMemoryPayloadStore {
    objects: Mutex<HashMap<(String, String), Vec<u8>>>,
}

impl InMemoryPayloadStore {
    /// Replaces an object's bytes (tests tamper with stored payloads).
    pub fn overwrite(&self, bucket: &str, key: &str, bytes: Vec<u8>) {
        self.objects
            .lock()
            .expect("objects")
            .insert((bucket.to_string(), key.to_string()), bytes);
    }

    pub fn len(&self) -> usize {
        self.objects.lock().expect("objects").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl PayloadStore for InMemoryPayloadStore {
    async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        let mut objects = self.objects.lock().expect("objects");
        match objects.entry((bucket.to_string(), key.to_string())) {
            std::collections::hash_map::Entry::Occupied(_) => Err(StoreError::Conflict),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(bytes);
                Ok(())
            }
        }
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
        self.objects
            .lock()
            .expect("objects")
            .get(&(bucket.to_string(), key.to_string()))
            .cloned()
            .ok_or_else(|| StoreError::Missing(format!("{bucket}/{key}")))
    }
}

/// Sealing keys held in memory (tests, simulations): a fresh random key at first, and `rotate`
/// makes a new current key, keeping the one it replaces as the previous.
#[derive(Debug)]
pub struct MemoryKeys(Mutex<SealKeys>);

impl Default for MemoryKeys {
    fn default() -> Self {
        Self(Mutex::new(SealKeys::generate()))
    }
}

impl MemoryKeys {
    pub fn rotate(&self) {
        let mut keys = self.0.lock().expect("keys");
        *keys = SealKeys::new(SealKey::generate(), vec![keys.current().clone()]);
    }
}

#[async_trait]
impl crate::ports::SealKeySource for MemoryKeys {
    async fn keys(&self) -> Result<SealKeys, StoreError> {
        Ok(self.0.lock().expect("keys").clone())
    }
}
