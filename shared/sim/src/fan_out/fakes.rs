//! The fan-out simulation's world and its ports: a store, a ledger, queues and a clock that fail as
//! the schedule says, and the children's step code.

use super::*;

/// The world the ports share: queues, clock, randomness and the fault switch.
pub(super) struct World {
    pub(super) rng: fastrand::Rng,
    pub(super) queues: BTreeMap<&'static str, VecDeque<String>>,
    /// The current invocation crashed: its later calls fail, its messages come back.
    pub(super) dead: bool,
    pub(super) faults: bool,
    pub(super) config: FanOutConfig,
    pub(super) report: FanOutReport,
}

pub(super) type Shared = Arc<Mutex<World>>;

pub(super) fn crash() -> StoreError {
    StoreError::Unavailable("simulated crash".into())
}

/// Decides whether a write crashes its invocation, before (`Err`) or after (`Ok(true)`) applying.
pub(super) fn fate(world: &Shared) -> Result<bool, StoreError> {
    let mut w = world.lock().expect("world");
    if w.dead {
        return Err(crash());
    }
    if w.faults && w.rng.f64() < w.config.crash_rate {
        w.dead = true;
        w.report.crashes += 1;
        return if w.rng.bool() { Err(crash()) } else { Ok(true) };
    }
    Ok(false)
}

/// Lets the other messages of the batch run first, now and then: messages handled together
/// interleave at every port call, as concurrent invocations do.
pub(super) async fn interleave(world: &Shared) {
    let now = world.lock().expect("world").rng.bool();
    if now {
        tokio::task::yield_now().await;
    }
}

/// Runs a write under the fault plan.
pub(super) async fn faulty<T, F>(world: &Shared, write: F) -> Result<T, StoreError>
where
    F: std::future::Future<Output = Result<T, StoreError>>,
{
    interleave(world).await;
    let crash_after = fate(world)?;
    let out = write.await?;
    if crash_after {
        return Err(crash());
    }
    Ok(out)
}

pub(super) fn alive(world: &Shared) -> Result<(), StoreError> {
    if world.lock().expect("world").dead {
        return Err(crash());
    }
    Ok(())
}

pub(super) struct Store {
    pub(super) inner: InMemoryExecutionStore,
    pub(super) world: Shared,
    /// Writes that resolved an await unit (the parent's resumption): one, or the parent resumed twice.
    pub(super) resolutions: AtomicU64,
    /// Ignore the version condition (to prove the checker catches a double resumption).
    pub(super) broken: bool,
    /// Each written version's await unit and whether it was resolved, by execution and version.
    pub(super) units: Mutex<std::collections::HashMap<(Uuid, u64), (Uuid, bool)>>,
    /// Children started and not ended, and the most there were.
    pub(super) running: Mutex<(u64, u64)>,
    /// Children that ended at least once.
    pub(super) ended: Mutex<std::collections::BTreeSet<Uuid>>,
}

#[async_trait]
impl ExecutionStore for Store {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        interleave(&self.world).await;
        alive(&self.world)?;
        self.inner.get(id).await
    }
    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        faulty(&self.world, async {
            self.inner.create(record).await?;
            if record.parent.is_some() {
                let mut running = self.running.lock().expect("running");
                running.0 += 1;
                running.1 = running.1.max(running.0);
            }
            Ok(())
        })
        .await
    }
    async fn replace(&self, record: &Execution, expected: u64) -> Result<(), StoreError> {
        // Whether the version the writer decided on had the unit this write resolves open.
        let resolved = |r: &Execution| r.await_unit.as_ref().map(|u| (u.id, u.resolved));
        let resolves = match resolved(record) {
            Some((unit, true)) => self
                .units
                .lock()
                .expect("units")
                .get(&(record.id, expected))
                .is_some_and(|(read, was)| *read == unit && !was),
            _ => false,
        };
        faulty(&self.world, async {
            let before = self.inner.snapshot(record.id);
            let condition = match (&before, self.broken) {
                (Some(current), true) => current.version,
                _ => expected,
            };
            self.inner.replace(record, condition).await?;
            let ended = |r: &Execution| r.parent.is_some() && r.status.is_terminal();
            // (A child re-driven by an operator runs again outside the window: its first end is
            // the one that freed its place.)
            if ended(record)
                && !before.as_ref().is_some_and(ended)
                && self.ended.lock().expect("ended").insert(record.id)
            {
                self.running.lock().expect("running").0 -= 1;
            }
            if let Some(unit) = resolved(record) {
                let key = (record.id, record.version);
                self.units.lock().expect("units").insert(key, unit);
            }
            if resolves {
                self.resolutions.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        })
        .await
    }
    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError> {
        alive(&self.world)?;
        self.inner.due(query).await.map(crate::fakes::sweep_bug)
    }
    async fn defer(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Deferred {
        alive(&self.world)?;
        self.inner.defer(id, now, backoff).await
    }
    fn shards(&self) -> u32 {
        self.inner.shards()
    }
    async fn put_journal(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Result<(), StoreError> {
        if planted::active(Bug::SkipsHistoryJournal) {
            return Ok(());
        }
        faulty(&self.world, self.inner.put_journal(id, chunk, entries)).await
    }
    async fn journal(&self, id: Uuid, chunks: u32) -> Result<Vec<Option<Vec<Entry>>>, StoreError> {
        self.inner.journal(id, chunks).await
    }
    async fn list(&self, query: ListQuery) -> Result<ListPage, StoreError> {
        self.inner.list(query).await
    }
    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError> {
        self.inner.get_many(ids).await
    }
}

pub(super) struct Ledger {
    pub(super) inner: InMemoryFanOutLedger,
    pub(super) world: Shared,
}

#[async_trait]
impl FanOutLedger for Ledger {
    async fn keep(&self, unit: Uuid, end: &ChildEnd, version: u64) -> Result<bool, StoreError> {
        // The planted bug drops every seventh child's end as if it were stale.
        if planted::active(Bug::DropsFanOutNotices) && end.item % 7 == 3 {
            return Ok(false);
        }
        faulty(&self.world, self.inner.keep(unit, end, version)).await
    }
    async fn set_outcome(
        &self,
        unit: Uuid,
        outcome: ItemOutcome,
    ) -> Result<Option<BlockCount>, StoreError> {
        faulty(&self.world, self.inner.set_outcome(unit, outcome)).await
    }
    async fn add_to_head(&self, unit: Uuid, change: HeadChange) -> Result<(u32, u32), StoreError> {
        faulty(&self.world, self.inner.add_to_head(unit, change)).await
    }
    async fn tally(&self, unit: Uuid, items: u32) -> Result<Tally, StoreError> {
        interleave(&self.world).await;
        alive(&self.world)?;
        self.inner.tally(unit, items).await
    }
    async fn ends(
        &self,
        unit: Uuid,
        items: Range<u32>,
    ) -> Result<Vec<Option<ChildEnd>>, StoreError> {
        alive(&self.world)?;
        self.inner.ends(unit, items).await
    }
}

pub(super) struct Sender(pub(super) Shared);

#[async_trait]
impl MessageSender for Sender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        let mut w = self.0.lock().expect("world");
        let mut results = Vec::new();
        for message in messages {
            if w.dead {
                results.push(Err(SendError {
                    queue: queue.to_string(),
                    reason: "simulated crash".into(),
                }));
                continue;
            }
            let name = w
                .queues
                .keys()
                .copied()
                .find(|q| *q == queue)
                .unwrap_or("unknown");
            let copies = if w.faults && w.rng.f64() < w.config.duplicate_rate {
                w.report.duplicates += 1;
                2
            } else {
                1
            };
            for _ in 0..copies {
                w.queues
                    .entry(name)
                    .or_default()
                    .push_back(message.body.clone());
            }
            results.push(Ok(()));
        }
        results
    }
}

pub(super) struct SimClock {
    pub(super) now: AtomicI64,
    pub(super) next: AtomicU64,
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.now.load(Ordering::SeqCst))
    }
    fn token(&self) -> Uuid {
        Uuid::from_u128(u128::from(self.next.fetch_add(1, Ordering::SeqCst)) | (1 << 100))
    }
    fn secret(&self) -> [u8; 16] {
        (u128::from(self.next.fetch_add(1, Ordering::SeqCst)) | (1 << 101)).to_le_bytes()
    }
    fn jitter(&self) -> f64 {
        0.5
    }
}

/// The children's step: fails for good on every `failing_every`-th item, else pays it under the
/// reference of its child execution (what the bank deduplicates on), noting each reference per item.
pub(super) struct Payments {
    pub(super) failing_every: u32,
    /// Planned failures happen on a child's first attempt only.
    pub(super) first_attempt_only: bool,
    pub(super) runs: Arc<AtomicU64>,
    pub(super) references: Arc<Mutex<BTreeMap<u32, std::collections::BTreeSet<Uuid>>>>,
}

#[async_trait]
impl StepFunction for Payments {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let n = input["n"].as_u64().unwrap_or_default() as u32;
        self.references
            .lock()
            .expect("bank")
            .entry(n)
            .or_default()
            .insert(request.execution_id);
        let planned = self.failing_every > 0 && n % self.failing_every == self.failing_every - 1;
        if planned && !(self.first_attempt_only && request.attempt > 1) {
            return Err(StepError::new("DECLINED", "planned failure", false));
        }
        Ok(json!({"paid": n}))
    }
}
