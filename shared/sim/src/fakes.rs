//! The coordinator's and the worker's ports on the simulated world: the store, the queues, the
//! dead-letter queues, the event bus, the payload store and the clock, each failing as the scheduler
//! says (crashes, lost responses), and the step code each execution's plan dictates.

use crate::*;

/// Claim checks where a schedule has them.
pub(crate) trait WithClaims: Sized {
    fn with_claims(self, claims: Option<&ClaimCheck>) -> Self;
}

impl WithClaims for Coordinator {
    fn with_claims(self, claims: Option<&ClaimCheck>) -> Self {
        match claims {
            Some(claims) => self.with_claim_check(claims.clone()),
            None => self,
        }
    }
}

impl WithClaims for Worker {
    fn with_claims(self, claims: Option<&ClaimCheck>) -> Self {
        match claims {
            Some(claims) => self.with_claim_check(claims.clone()),
            None => self,
        }
    }
}

/// The payload store (S3): claim-checked payloads under content addresses, with crashes like every
/// port.
pub(crate) struct SimPayloads {
    pub(crate) world: Shared,
    pub(crate) inner: InMemoryPayloadStore,
}

impl SimPayloads {
    /// A crash of the current invocation at the payload store: a worker's failure to read or store
    /// the payloads of its requests (which it may answer with `PAYLOAD_UNAVAILABLE`).
    pub(crate) fn failed(&self) -> StoreError {
        let mut w = self.world.lock().expect("world");
        let requests: Vec<(Uuid, u32, u32)> = w
            .invocation()
            .filter(|i| i.role == Some(Role::Worker))
            .map(|i| {
                i.batch
                    .iter()
                    .filter_map(|b| request_header(b))
                    .map(|h| (h.execution_id, h.step_index, h.attempt))
                    .collect()
            })
            .unwrap_or_default();
        w.payload_faults.extend(requests);
        crashed()
    }
}

#[async_trait]
impl PayloadStore for SimPayloads {
    async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let fate = self.world.lock().expect("world").fate();
        match fate {
            // (A lost response is retried by the SDK: the key is a content address, the retry puts
            // the same bytes.)
            Fate::Proceed | Fate::LostResponse => {
                self.world
                    .lock()
                    .expect("world")
                    .report
                    .counts
                    .claim_checked += 1;
                self.inner.put(bucket, key, bytes).await
            }
            Fate::CrashAfter => {
                self.inner.put(bucket, key, bytes).await?;
                Err(self.failed())
            }
            _ => Err(self.failed()),
        }
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, StoreError> {
        YieldOnce(false).await;
        let fate = self.world.lock().expect("world").fate();
        match fate {
            Fate::Proceed | Fate::LostResponse => self.inner.get(bucket, key).await,
            _ => Err(self.failed()),
        }
    }
}

pub(crate) type Shared = Arc<Mutex<World>>;

/// Returns `Pending` once: every port call is a point where the scheduler may switch invocations.
pub(crate) struct YieldOnce(pub(crate) bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

pub(crate) fn crashed() -> StoreError {
    StoreError::Unavailable("simulated crash".into())
}

// ------------------------------------------------------------------------------------------- ports

pub(crate) struct SimStore(pub(crate) Shared);

impl SimStore {
    /// The world's table, for the reads that neither fail nor yield.
    fn store(&self) -> Arc<InMemoryExecutionStore> {
        self.0.lock().expect("world").store.clone()
    }

    /// A write under a fate: a lost response is the SDK's retry meeting its own version.
    pub(crate) async fn write(
        &self,
        record: &Execution,
        expected: Option<u64>,
    ) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => w.write(record, expected),
            Fate::LostResponse => {
                w.write(record, expected)?;
                Err(StoreError::Conflict)
            }
            Fate::CrashAfter => {
                let _ = w.write(record, expected);
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }
}

#[async_trait]
impl ExecutionStore for SimStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed | Fate::LostResponse => {
                if let Some(invocation) = w.invocation() {
                    invocation.reads.insert(id);
                }
                Ok(w.store.snapshot(id))
            }
            // A crash after a read: the result never reaches the caller.
            _ => Err(crashed()),
        }
    }

    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        self.write(record, None).await
    }

    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError> {
        self.write(record, Some(expected_version)).await
    }

    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed | Fate::LostResponse => {
                if query.after.is_some() {
                    w.report.counts.paged_queries += 1;
                }
                let mut entries = Vec::new();
                let mut stale = 0;
                for id in w.index.keys() {
                    let (key, lagging) = w.indexed(id);
                    stale += usize::from(lagging);
                    if let Some((key, shard)) = key {
                        if shard == query.shard {
                            entries.push((Timestamp::from_millis(key), *id));
                        }
                    }
                }
                w.report.counts.stale_index_reads += stale.min(1);
                let page = crate::adapters::memory::due_page(entries.into_iter(), query);
                Ok(sweep_bug(page))
            }
            _ => Err(crashed()),
        }
    }

    async fn defer(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Deferred {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => {
                let until = w.store.defer_entry(id, now, backoff);
                w.index(id);
                Ok(until)
            }
            _ => Err(crashed()),
        }
    }

    fn shards(&self) -> u32 {
        self.0.lock().expect("world").shards
    }

    async fn put_journal(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Result<(), StoreError> {
        if planted::active(Bug::SkipsHistoryJournal) {
            return Ok(());
        }
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        let fate = w.fate();
        if matches!(fate, Fate::CrashBefore | Fate::Dead) {
            return Err(crashed());
        }
        w.report.counts.journal_chunks += 1;
        let written = w.store.put_chunk(id, chunk, entries);
        if written.is_some_and(|was| was != entries) {
            w.violations.push(format!(
                "journal chunk {chunk} of {id} written over with other entries"
            ));
        }
        match fate {
            Fate::CrashAfter => Err(crashed()),
            _ => Ok(()),
        }
    }

    async fn journal(&self, id: Uuid, chunks: u32) -> Result<Vec<Option<Vec<Entry>>>, StoreError> {
        self.store().journal(id, chunks).await
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage, StoreError> {
        self.store().list(query).await
    }

    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError> {
        self.store().get_many(ids).await
    }
}

/// A DLQ as bulk replay reads it: received messages are hidden until deleted or released.
pub(crate) struct SimDeadLetterQueue {
    pub(crate) world: Shared,
    pub(crate) queue: &'static str,
}

#[async_trait]
impl DeadLetterQueue for SimDeadLetterQueue {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().expect("world");
        match w.fate() {
            Fate::Proceed | Fate::LostResponse => {}
            _ => return Err(crashed()),
        }
        let sent: BTreeMap<u64, i64> = w.queues[self.queue]
            .messages
            .iter()
            .map(|m| (m.id, m.sent_at))
            .collect();
        let received = w.receive(self.queue, max.min(10));
        Ok(received
            .into_iter()
            .map(|(id, receipt, body)| DeadLetter {
                handle: format!("{id}:{receipt}"),
                body,
                attributes: Default::default(),
                sent_at: sent.get(&id).copied().map(Timestamp::from_millis),
            })
            .collect())
    }

    async fn delete(&self, handle: &str) -> Result<(), StoreError> {
        let queue = self.queue;
        self.on_message(handle, true, |w, id, receipt| w.delete(queue, id, receipt))
            .await
    }

    async fn release(&self, handle: &str) -> Result<(), StoreError> {
        let queue = self.queue;
        self.on_message(handle, false, |w, id, receipt| {
            let now = w.now;
            if let Some(q) = w.queues.get_mut(queue) {
                for m in q.messages.iter_mut() {
                    if m.id == id && m.receipt == receipt {
                        m.visible_at = now;
                    }
                }
            }
        })
        .await
    }
}

impl SimDeadLetterQueue {
    /// Does `act` to the received message `handle` names, as the world's next fate has it: done,
    /// not done, or (`applied_before_a_crash`) done by a call that then crashed.
    async fn on_message(
        &self,
        handle: &str,
        applied_before_a_crash: bool,
        act: impl FnOnce(&mut World, u64, u64),
    ) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().expect("world");
        let fate = w.fate();
        let (id, receipt) = parse_handle(handle);
        match fate {
            Fate::Proceed | Fate::LostResponse => {
                act(&mut w, id, receipt);
                Ok(())
            }
            Fate::CrashAfter if applied_before_a_crash => {
                act(&mut w, id, receipt);
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }
}

/// `page` as the planted `SweepIgnoresLastEvaluatedKey` reads it: without the key of the next page.
pub(crate) fn sweep_bug(mut page: DuePage) -> DuePage {
    if planted::active(Bug::SweepIgnoresLastEvaluatedKey) {
        page.next = None;
    }
    page
}

pub(crate) fn parse_handle(handle: &str) -> (u64, u64) {
    let (id, receipt) = handle.split_once(':').unwrap_or_default();
    (id.parse().unwrap_or(0), receipt.parse().unwrap_or(0))
}

pub(crate) struct SimSender(pub(crate) Shared);

#[async_trait]
impl MessageSender for SimSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        let fail = || SendError {
            queue: queue.to_string(),
            reason: "simulated crash".into(),
        };
        let fate = w.fate();
        if matches!(fate, Fate::CrashBefore | Fate::Dead) {
            return messages.iter().map(|_| Err(fail())).collect();
        }
        for m in messages {
            let reason = m
                .attributes
                .iter()
                .find(|(k, _)| k == crate::envelope::REASON_ATTRIBUTE)
                .map(|(_, v)| v.clone());
            let delay = i64::from(m.delay_secs) * 1000;
            w.push(queue, m.body.clone(), reason.clone(), delay);
            if w.faults && w.rng.f64() < w.config.duplicate_rate {
                w.report.counts.duplicates += 1;
                w.push(queue, m.body.clone(), reason, delay);
            }
        }
        match fate {
            Fate::CrashAfter | Fate::LostResponse => messages.iter().map(|_| Err(fail())).collect(),
            _ => messages.iter().map(|_| Ok(())).collect(),
        }
    }
}

/// The event bus: records what was published (by event id), with crashes like every port.
pub(crate) struct SimPublisher(pub(crate) Shared);

#[async_trait]
impl EventPublisher for SimPublisher {
    async fn publish(&self, events: &[BusEvent]) -> Vec<Result<(), String>> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        let fate = w.fate();
        if matches!(fate, Fate::CrashBefore | Fate::Dead) {
            return events
                .iter()
                .map(|_| Err("simulated crash".into()))
                .collect();
        }
        let mut results = Vec::with_capacity(events.len());
        for e in events {
            // A partial failure (FailedEntryCount > 0): this entry was not accepted, the call succeeded.
            if w.faults && w.rng.f64() < w.config.duplicate_rate {
                results.push(Err("simulated ThrottlingException for this entry".into()));
                continue;
            }
            let id = e.detail["eventId"].as_str().unwrap_or_default().to_string();
            w.published.insert(id);
            results.push(Ok(()));
        }
        match fate {
            Fate::CrashAfter | Fate::LostResponse => events
                .iter()
                .map(|_| Err("simulated crash".into()))
                .collect(),
            _ => results,
        }
    }
}

pub(crate) struct SimClock(pub(crate) Shared);

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.lock().expect("world").now)
    }
    fn token(&self) -> Uuid {
        Uuid::from_u128(self.0.lock().expect("world").rng.u128(..))
    }
    fn secret(&self) -> [u8; 16] {
        self.0.lock().expect("world").rng.u128(..).to_le_bytes()
    }
    fn jitter(&self) -> f64 {
        self.0.lock().expect("world").rng.f64()
    }
}

/// The worker's steps: deterministic, failing as each execution's plan says.
pub(crate) struct PlannedSteps {
    pub(crate) item_limit: usize,
}

#[async_trait]
impl StepFunction for PlannedSteps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        // After the await step, the input is the approved input with the answers beside it; one that
        // was claim-checked comes nested under `input`.
        let input = match input.get("input") {
            Some(nested) if input.get("interactions").is_some() => nested.clone(),
            _ => input,
        };
        let k = u64::from(request.step_index);
        let plan = &input["plan"];
        if plan["fatal"].as_u64() == Some(k) {
            return Err(StepError::new("FATAL", "planned permanent failure", false));
        }
        if u64::from(request.attempt) <= plan["fail"][k as usize].as_u64().unwrap_or(0) {
            return Err(StepError::new("FLAKY", "planned transient failure", true));
        }
        let mut trail = input["trail"].as_array().cloned().unwrap_or_default();
        trail.push(json!(request.step_id));
        let mut output = json!({"n": input["n"], "plan": plan, "trail": trail});
        if plan["huge"].as_u64() == Some(k) {
            output["pad"] = json!("x".repeat(self.item_limit));
        }
        Ok(output)
    }
}

// ------------------------------------------------------------------------------------------- run
