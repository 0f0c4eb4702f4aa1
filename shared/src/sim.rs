//! Deterministic simulation of the coordinator under faults (the fault campaign).
//!
//! The real handlers (`handlers::claim`, `launch`, `completion`) and the real worker runtime run against
//! in-memory ports that follow DynamoDB's conditional-write semantics and SQS's at-least-once delivery
//! with visibility timeouts, receive counts and redrive to DLQs. A seeded scheduler interleaves handler
//! invocations at every port call, and injects:
//! - crashes before and after any port call (the invocation dies: later calls fail, nothing is deleted,
//!   its messages reappear after the visibility timeout);
//! - duplicate deliveries and duplicate sends, random reordering, garbage messages;
//! - time jumps while invocations are stalled mid-flight, so leases expire under a still-running
//!   ("zombie") holder that later tries to commit.
//!
//! After a faulty phase it lets the system settle without faults and checks the invariants: every
//! execution reaches the terminal state its plan dictates; each step's outcome is applied exactly once;
//! no write is lost (every write is based on the version it replaces) and no fenced holder commits;
//! nothing is lost (every garbage message sits in a DLQ; every failed execution has its envelope in the
//! execution DLQ). A run is a pure function of its seed.

pub mod fan_out;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

use async_trait::async_trait;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::adapters::dynamodb::due_shard;
use crate::adapters::InMemoryReleaseRegistry;
use crate::coordinator::{Coordinator, Settings, SubmitRequest};
use crate::domain::{Execution, PipelineDef, RetryPolicy, Status, StepDef, StepError};
use crate::envelope::{DeadLetterEnvelope, Identity, RequestHeader};
use crate::ports::{
    Backoff, BusEvent, Clock, DuePage, DueQuery, EventPublisher, ExecutionStore, MessageSender,
    OutMessage, ReleaseRegistry, SendError, StoreError,
};
use crate::worker::{StepFunction, Worker};

const LAUNCH: &str = "launch";
const REPLY: &str = "reply";
const REQUEST: &str = "request";
const EXECUTION_DLQ: &str = "execution-dlq";
const GARBAGE: &str = "\u{1f5d1} garbage";
const STEP_IDS: [&str; 3] = ["validate", "price", "confirm"];

/// Knobs of one simulated schedule.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub executions: usize,
    /// Scheduler actions in the faulty phase.
    pub faulty_actions: usize,
    /// Probability that a port call crashes its invocation.
    pub crash_rate: f64,
    /// Probability that a sent message is delivered twice.
    pub duplicate_rate: f64,
    /// A store that ignores the version condition (to prove the checker catches it).
    pub broken_store: bool,
    pub max_attempts: u32,
    pub step_timeout_secs: u32,
    pub lease_secs: u32,
    pub visibility_secs: u32,
    pub max_receives: u32,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            executions: 3,
            faulty_actions: 160,
            crash_rate: 0.04,
            duplicate_rate: 0.05,
            broken_store: false,
            max_attempts: 4,
            step_timeout_secs: 20,
            lease_secs: 30,
            visibility_secs: 30,
            max_receives: 5,
        }
    }
}

/// What a schedule (or a campaign) did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    pub crashes: usize,
    pub duplicates: usize,
    pub garbage: usize,
    pub invocations: usize,
    pub fenced_writes: usize,
    pub timeouts: usize,
    pub succeeded: usize,
    pub failed: usize,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.crashes += other.crashes;
        self.duplicates += other.duplicates;
        self.garbage += other.garbage;
        self.invocations += other.invocations;
        self.fenced_writes += other.fenced_writes;
        self.timeouts += other.timeouts;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
    }
}

/// What one schedule did and found.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub seed: u64,
    pub violations: Vec<String>,
    pub counts: Counts,
}

/// Aggregate of a campaign.
#[derive(Debug, Clone, Default)]
pub struct CampaignReport {
    pub schedules: usize,
    /// (seed, violation)
    pub violations: Vec<(u64, String)>,
    pub counts: Counts,
}

impl CampaignReport {
    fn merge(&mut self, other: CampaignReport) {
        self.schedules += other.schedules;
        self.violations.extend(other.violations);
        self.counts.add(&other.counts);
    }
}

/// Runs `seeds` on `threads` threads.
pub fn campaign(seeds: std::ops::Range<u64>, config: &SimConfig, threads: usize) -> CampaignReport {
    let seeds: Vec<u64> = seeds.collect();
    let chunk = seeds.len().div_ceil(threads.max(1)).max(1);
    let reports: Vec<CampaignReport> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut report = CampaignReport::default();
                    for seed in part {
                        let r = run(*seed, config);
                        report.merge(CampaignReport {
                            schedules: 1,
                            violations: r.violations.into_iter().map(|v| (r.seed, v)).collect(),
                            counts: r.counts,
                        });
                    }
                    report
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("sim thread"))
            .collect()
    });
    let mut total = CampaignReport::default();
    for r in reports {
        total.merge(r);
    }
    total.violations.sort();
    total
}

// ------------------------------------------------------------------------------------------- world

struct Message {
    id: u64,
    body: String,
    reason: Option<String>,
    visible_at: i64,
    receives: u32,
    receipt: u64,
}

#[derive(Default)]
struct Queue {
    messages: Vec<Message>,
    dlq: Option<&'static str>,
}

#[derive(Default)]
struct Invocation {
    killed: bool,
}

struct World {
    rng: fastrand::Rng,
    now: i64,
    faults: bool,
    config: SimConfig,
    records: BTreeMap<Uuid, Execution>,
    deferrals: crate::adapters::memory::Deferrals,
    queues: BTreeMap<&'static str, Queue>,
    next_id: u64,
    current: Option<u64>,
    invocations: BTreeMap<u64, Invocation>,
    /// Lifecycle event ids published at least once.
    published: BTreeSet<String>,
    /// Step outcomes applied: (execution, step) -> count of writes that turned it SUCCEEDED.
    applied: BTreeMap<(Uuid, u32), u32>,
    violations: Vec<String>,
    report: SimReport,
}

enum Fate {
    Proceed,
    CrashBefore,
    CrashAfter,
    Dead,
}

impl World {
    fn fate(&mut self) -> Fate {
        let Some(id) = self.current else {
            return Fate::Proceed;
        };
        let crash = self.faults && self.rng.f64() < self.config.crash_rate;
        let before = self.rng.bool();
        let invocation = self.invocations.entry(id).or_default();
        if invocation.killed {
            return Fate::Dead;
        }
        if !crash {
            return Fate::Proceed;
        }
        invocation.killed = true;
        self.report.counts.crashes += 1;
        if before {
            Fate::CrashBefore
        } else {
            Fate::CrashAfter
        }
    }

    fn push(&mut self, queue: &str, body: String, reason: Option<String>, delay_ms: i64) {
        let id = self.next_id;
        self.next_id += 1;
        let visible_at = self.now + delay_ms;
        if let Some(q) = self.queues.get_mut(queue) {
            q.messages.push(Message {
                id,
                body,
                reason,
                visible_at,
                receives: 0,
                receipt: 0,
            });
        }
    }

    /// Receives up to `max` visible messages in random order; a message received more than
    /// `max_receives` times moves to the queue's DLQ instead (SQS redrive policy).
    fn receive(&mut self, queue: &'static str, max: usize) -> Vec<(u64, u64, String)> {
        let now = self.now;
        let visibility = i64::from(self.config.visibility_secs) * 1000;
        let max_receives = self.config.max_receives;
        let mut visible: Vec<usize> = self.queues[queue]
            .messages
            .iter()
            .enumerate()
            .filter(|(_, m)| m.visible_at <= now)
            .map(|(i, _)| i)
            .collect();
        self.rng.shuffle(&mut visible);
        visible.truncate(max);
        let mut out = Vec::new();
        let mut moved = Vec::new();
        for index in visible {
            let receipt = self.next_id;
            self.next_id += 1;
            let message = &mut self.queues.get_mut(queue).expect("queue").messages[index];
            if message.receives >= max_receives {
                moved.push(message.id);
                continue;
            }
            message.receives += 1;
            message.receipt = receipt;
            message.visible_at = now + visibility;
            out.push((message.id, receipt, message.body.clone()));
        }
        for id in moved {
            let q = self.queues.get_mut(queue).expect("queue");
            let index = q.messages.iter().position(|m| m.id == id).expect("message");
            let message = q.messages.remove(index);
            if let Some(dlq) = q.dlq {
                let reason = message.reason.or(Some("MAX_RECEIVES".into()));
                self.push(dlq, message.body, reason, 0);
            }
        }
        out
    }

    fn delete(&mut self, queue: &str, id: u64, receipt: u64) {
        if let Some(q) = self.queues.get_mut(queue) {
            q.messages.retain(|m| !(m.id == id && m.receipt == receipt));
        }
    }

    fn write(&mut self, record: &Execution, expected: Option<u64>) -> Result<(), StoreError> {
        let previous = self.records.get(&record.id);
        match (expected, previous) {
            (None, Some(_)) => return Err(StoreError::Conflict),
            (Some(v), Some(p)) if p.version != v && !self.config.broken_store => {
                self.report.counts.fenced_writes += 1;
                return Err(StoreError::Conflict);
            }
            (Some(_), None) => return Err(StoreError::Conflict),
            _ => {}
        }
        if let Some(p) = previous {
            if record.version != p.version + 1 {
                self.violations.push(format!(
                    "lost update on {}: wrote version {} over version {}",
                    record.id, record.version, p.version
                ));
            }
            if record.generation < p.generation {
                self.violations.push(format!(
                    "fenced holder committed on {}: generation {} over {}",
                    record.id, record.generation, p.generation
                ));
            }
            for k in record.steps_succeeded_since(p) {
                *self.applied.entry((record.id, k)).or_default() += 1;
            }
            for (step, k) in record.steps.iter().zip(record.first_step..) {
                let error = step.error.as_ref().map(|e| e.code.as_str());
                let was_error = p
                    .progress(k)
                    .and_then(|s| s.error.as_ref())
                    .map(|e| e.code.as_str());
                if error == Some("STEP_TIMEOUT")
                    && (was_error != Some("STEP_TIMEOUT") || p.attempt != record.attempt)
                {
                    self.report.counts.timeouts += 1;
                }
            }
        }
        self.records.insert(record.id, record.clone());
        self.deferrals.written(record.id);
        Ok(())
    }
}

type Shared = Arc<Mutex<World>>;

/// Returns `Pending` once: every port call is a point where the scheduler may switch invocations.
struct YieldOnce(bool);

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

fn crashed() -> StoreError {
    StoreError::Unavailable("simulated crash".into())
}

// ------------------------------------------------------------------------------------------- ports

struct SimStore(Shared);

#[async_trait]
impl ExecutionStore for SimStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => Ok(w.records.get(&id).cloned()),
            // A crash after a read: the result never reaches the caller.
            _ => Err(crashed()),
        }
    }

    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => w.write(record, None),
            Fate::CrashAfter => {
                let _ = w.write(record, None);
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }

    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => w.write(record, Some(expected_version)),
            Fate::CrashAfter => {
                let _ = w.write(record, Some(expected_version));
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }

    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => {
                let entries = w
                    .records
                    .values()
                    .filter(|r| due_shard(r.id, 2) == query.shard)
                    .filter_map(|r| w.deferrals.due_at(r).map(|d| (d, r.id)));
                Ok(crate::adapters::memory::due_page(entries, query))
            }
            _ => Err(crashed()),
        }
    }

    async fn defer(&self, id: Uuid, now: i64, backoff: Backoff) -> Result<Option<i64>, StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        match w.fate() {
            Fate::Proceed => {
                let World {
                    records, deferrals, ..
                } = &mut *w;
                Ok(records
                    .get(&id)
                    .and_then(|r| deferrals.defer(r, now, backoff)))
            }
            _ => Err(crashed()),
        }
    }

    fn shards(&self) -> u32 {
        2
    }
}

struct SimSender(Shared);

#[async_trait]
impl MessageSender for SimSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Result<(), SendError>> {
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
            Fate::CrashAfter => messages.iter().map(|_| Err(fail())).collect(),
            _ => messages.iter().map(|_| Ok(())).collect(),
        }
    }
}

/// The event bus: records what was published (by event id), with crashes like every port.
struct SimPublisher(Shared);

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
            Fate::CrashAfter => events
                .iter()
                .map(|_| Err("simulated crash".into()))
                .collect(),
            _ => results,
        }
    }
}

struct SimClock(Shared);

impl Clock for SimClock {
    fn now_ms(&self) -> i64 {
        self.0.lock().expect("world").now
    }
    fn token(&self) -> Uuid {
        Uuid::from_u128(self.0.lock().expect("world").rng.u128(..))
    }
    fn jitter(&self) -> f64 {
        self.0.lock().expect("world").rng.f64()
    }
}

/// The worker's steps: deterministic, failing as each execution's plan says.
struct PlannedSteps;

#[async_trait]
impl StepFunction for PlannedSteps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        let k = request.step_index as usize;
        let plan = &input["plan"];
        if plan["fatal"].as_u64() == Some(k as u64) {
            return Err(StepError::new("FATAL", "planned permanent failure", false));
        }
        if u64::from(request.attempt) <= plan["fail"][k].as_u64().unwrap_or(0) {
            return Err(StepError::new("FLAKY", "planned transient failure", true));
        }
        let mut trail = input["trail"].as_array().cloned().unwrap_or_default();
        trail.push(json!(request.step_id));
        Ok(json!({"n": input["n"], "plan": plan, "trail": trail}))
    }
}

// ------------------------------------------------------------------------------------------- run

type Task = Pin<Box<dyn Future<Output = Option<SqsBatchResponse>>>>;

struct Running {
    id: u64,
    task: Task,
    queue: Option<&'static str>,
    /// (message id in the event, sim message id, receipt)
    receipts: Vec<(String, u64, u64)>,
}

fn pipeline(config: &SimConfig) -> PipelineDef {
    let step = |id: &&str| {
        StepDef::task(*id, REQUEST)
            .types("sim.Input/1", "sim.Input/1")
            .timeout_secs(config.step_timeout_secs)
            .retry(RetryPolicy::doubling(config.max_attempts, 1_000, 8_000))
    };
    PipelineDef::new("sim", "1", STEP_IDS.iter().map(step))
}

/// Runs one schedule.
pub fn run(seed: u64, config: &SimConfig) -> SimReport {
    // Tokio primitives (timers in the worker runtime) need a runtime context; the sim polls by hand.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let _guard = runtime.enter();

    let mut queues = BTreeMap::new();
    for (name, dlq) in [
        (LAUNCH, Some("launch-dlq")),
        (REPLY, Some("reply-dlq")),
        (REQUEST, Some("request-dlq")),
        ("launch-dlq", None),
        ("reply-dlq", None),
        ("request-dlq", None),
        (EXECUTION_DLQ, None),
    ] {
        queues.insert(
            name,
            Queue {
                messages: Vec::new(),
                dlq,
            },
        );
    }
    let world: Shared = Arc::new(Mutex::new(World {
        rng: fastrand::Rng::with_seed(seed),
        now: 1_800_000_000_000,
        faults: false,
        config: config.clone(),
        records: BTreeMap::new(),
        deferrals: Default::default(),
        queues,
        next_id: 1,
        current: None,
        invocations: BTreeMap::new(),
        applied: BTreeMap::new(),
        published: BTreeSet::new(),
        violations: Vec::new(),
        report: SimReport {
            seed,
            ..Default::default()
        },
    }));
    let def = pipeline(config);
    let registry = Arc::new(InMemoryReleaseRegistry::default());
    let coordinator = |role: &str| {
        Arc::new(
            Coordinator::new(
                Arc::new(SimStore(world.clone())),
                registry.clone(),
                Arc::new(SimSender(world.clone())),
                Arc::new(SimClock(world.clone())),
                Settings {
                    launch_queue: LAUNCH.into(),
                    reply_queue: REPLY.into(),
                    execution_dlq: EXECUTION_DLQ.into(),
                    launch_dlq: "launch-dlq".into(),
                    reply_dlq: "reply-dlq".into(),
                    await_queue: REPLY.into(),
                    start_queue: None,
                    start_dlq: None,
                    lease_ms: i64::from(config.lease_secs) * 1000,
                    claim_limit: 25,
                    instance: role.into(),
                },
            )
            .with_publisher(Arc::new(SimPublisher(world.clone()))),
        )
    };
    let claim = coordinator("claim");
    let launch = coordinator("launch");
    let completion = coordinator("completion");
    let api = coordinator("api");
    let worker = Arc::new(
        Worker::new(
            Identity {
                pipeline_id: def.pipeline_id.clone(),
                contract_version: crate::domain::contract::Contract::of(&def).contract_version,
                release_version: def.release_version.clone(),
            },
            Arc::new(SimSender(world.clone())),
            Arc::new(PlannedSteps),
        )
        .with_concurrency(1)
        .with_heartbeat(crate::worker::Heartbeat::Off)
        .with_dead_letter_queue("request-dlq"),
    );

    block_on(registry.register(&crate::domain::release::Release::new(
        def.clone(),
        Vec::new(),
    )))
    .expect("register");
    block_on(registry.activate(crate::ports::ActivationRequest {
        pipeline_id: &def.pipeline_id,
        release_version: &def.release_version,
        at: 0,
        reason: "sim",
    }))
    .expect("activate");

    // Plans: mostly clean, some transient failures, some permanent, some exhausting the budget.
    let mut plans = Vec::new();
    for n in 0..config.executions {
        let (fail, fatal) = {
            let mut w = world.lock().expect("world");
            let mut fail = [0u64; 3];
            let mut fatal = None;
            match w.rng.u8(0..10) {
                0..=4 => {}
                5..=7 => fail[w.rng.usize(0..3)] = w.rng.u64(1..3),
                8 => fatal = Some(w.rng.u64(0..3)),
                _ => fail[w.rng.usize(0..3)] = 99,
            }
            (fail, fatal)
        };
        let input = json!({"n": n, "trail": [], "plan": {"fail": fail, "fatal": fatal}});
        let submitted = block_on(api.submit(SubmitRequest {
            pipeline_id: def.pipeline_id.clone(),
            release_version: None,
            tenant: "sim".into(),
            input,
            idempotency_key: None,
            parent: None,
        }))
        .expect("submit");
        plans.push((submitted.execution, fail, fatal));
    }

    let mut running: Vec<Running> = Vec::new();
    let mut next_invocation = 1u64;
    let waker = Waker::noop();
    let mut cx = TaskContext::from_waker(waker);

    let start_invocation = |queue: Option<&'static str>,
                            running: &mut Vec<Running>,
                            next: &mut u64| {
        let id = *next;
        *next += 1;
        let (task, receipts): (Task, Vec<(String, u64, u64)>) = match queue {
            None => {
                let claim = claim.clone();
                (
                    Box::pin(async move {
                        let _ = crate::handlers::claim(&claim, EventBridgeEvent::default()).await;
                        None
                    }),
                    Vec::new(),
                )
            }
            Some(q) => {
                let batch = {
                    let mut w = world.lock().expect("world");
                    let max = w.rng.usize(1..=10);
                    w.receive(q, max)
                };
                if batch.is_empty() {
                    return;
                }
                let mut event = SqsEvent::default();
                let mut receipts = Vec::new();
                for (i, (message_id, receipt, body)) in batch.into_iter().enumerate() {
                    let mut m = SqsMessage::default();
                    m.message_id = Some(format!("m{i}"));
                    m.receipt_handle = Some(receipt.to_string());
                    m.body = Some(body);
                    event.records.push(m);
                    receipts.push((format!("m{i}"), message_id, receipt));
                }
                let task: Task = match q {
                    LAUNCH => {
                        let c = launch.clone();
                        Box::pin(async move { Some(crate::handlers::launch(&c, event).await) })
                    }
                    REPLY => {
                        let c = completion.clone();
                        Box::pin(async move { Some(crate::handlers::completion(&c, event).await) })
                    }
                    _ => {
                        let w = worker.clone();
                        Box::pin(async move { Some(w.handle(event).await) })
                    }
                };
                (task, receipts)
            }
        };
        world.lock().expect("world").report.counts.invocations += 1;
        running.push(Running {
            id,
            task,
            queue,
            receipts,
        });
    };

    let poll_one = |running: &mut Vec<Running>, index: usize, cx: &mut TaskContext<'_>| {
        world.lock().expect("world").current = Some(running[index].id);
        let poll = running[index].task.as_mut().poll(cx);
        let mut w = world.lock().expect("world");
        w.current = None;
        if let Poll::Ready(response) = poll {
            let done = running.swap_remove(index);
            let killed = w.invocations.get(&done.id).is_some_and(|i| i.killed);
            if let (false, Some(queue), Some(response)) = (killed, done.queue, response) {
                let failed: BTreeSet<String> = response
                    .batch_item_failures
                    .into_iter()
                    .map(|f| f.item_identifier)
                    .collect();
                for (event_id, message_id, receipt) in done.receipts {
                    if !failed.contains(&event_id) {
                        w.delete(queue, message_id, receipt);
                    }
                }
            }
        }
    };

    // Faulty phase.
    world.lock().expect("world").faults = true;
    for _ in 0..config.faulty_actions {
        let choice = world.lock().expect("world").rng.u8(0..100);
        match choice {
            0..=44 if !running.is_empty() => {
                let index = world.lock().expect("world").rng.usize(0..running.len());
                poll_one(&mut running, index, &mut cx);
            }
            45..=74 => {
                let queue = [LAUNCH, REPLY, REQUEST][world.lock().expect("world").rng.usize(0..3)];
                start_invocation(Some(queue), &mut running, &mut next_invocation);
            }
            75..=81 => start_invocation(None, &mut running, &mut next_invocation),
            82..=93 => {
                let mut w = world.lock().expect("world");
                let jump = if w.rng.u8(0..5) == 0 {
                    w.rng.i64(20_000..70_000)
                } else {
                    w.rng.i64(0..5_000)
                };
                w.now += jump;
            }
            94..=97 => {
                // Duplicate delivery of a random message.
                let mut w = world.lock().expect("world");
                let queue = [LAUNCH, REPLY, REQUEST][w.rng.usize(0..3)];
                let count = w.queues[queue].messages.len();
                if count > 0 {
                    let i = w.rng.usize(0..count);
                    let body = w.queues[queue].messages[i].body.clone();
                    w.report.counts.duplicates += 1;
                    w.push(queue, body, None, 0);
                }
            }
            _ => {
                let mut w = world.lock().expect("world");
                let queue = [LAUNCH, REPLY, REQUEST][w.rng.usize(0..3)];
                let tag = format!("{GARBAGE} #{}#", w.report.counts.garbage);
                let body = match w.rng.u8(0..3) {
                    0 => tag,
                    1 => format!("{{\"{tag}\": true}}"),
                    _ => format!("{{\"kind\":\"stepline.reply.v1\",\"x\":\"{tag}\"}}"),
                };
                w.report.counts.garbage += 1;
                w.push(queue, body, None, 0);
            }
        }
    }

    // Calm phase: no new faults; run to quiescence.
    world.lock().expect("world").faults = false;
    let mut guard = 0;
    let mut last_claim = i64::MIN;
    loop {
        guard += 1;
        if guard > 20_000 {
            world
                .lock()
                .expect("world")
                .violations
                .push("did not settle within 20,000 calm actions".into());
            break;
        }
        if !running.is_empty() {
            let index = world.lock().expect("world").rng.usize(0..running.len());
            poll_one(&mut running, index, &mut cx);
            continue;
        }
        let (now, visible, next_visible) = {
            let w = world.lock().expect("world");
            let visible = [LAUNCH, REPLY, REQUEST]
                .into_iter()
                .find(|q| w.queues[q].messages.iter().any(|m| m.visible_at <= w.now));
            let next_visible = [LAUNCH, REPLY, REQUEST]
                .into_iter()
                .flat_map(|q| w.queues[q].messages.iter().map(|m| m.visible_at))
                .min();
            (w.now, visible, next_visible)
        };
        if let Some(queue) = visible {
            start_invocation(Some(queue), &mut running, &mut next_invocation);
            continue;
        }
        let next_due = {
            let w = world.lock().expect("world");
            w.records.values().filter_map(|r| r.due_at()).min()
        };
        if last_claim != now && next_due.is_some_and(|d| d <= now) {
            last_claim = now;
            start_invocation(None, &mut running, &mut next_invocation);
            continue;
        }
        match [next_visible, next_due].into_iter().flatten().min() {
            Some(t) => {
                let mut w = world.lock().expect("world");
                w.now = w.now.max(t).max(now + 1);
            }
            None => break,
        }
    }

    check(&world, &plans, config);
    let w = world.lock().expect("world");
    let mut report = w.report.clone();
    report.violations = w.violations.clone();
    report
}

/// The invariants, checked once the system has settled.
fn check(world: &Shared, plans: &[(Uuid, [u64; 3], Option<u64>)], config: &SimConfig) {
    let mut w = world.lock().expect("world");
    let mut violations = Vec::new();
    for (id, fail, fatal) in plans {
        let Some(record) = w.records.get(id).cloned() else {
            violations.push(format!("execution {id} lost"));
            continue;
        };
        // The first step whose plan ends the execution, and how.
        let doomed = (0..3u64)
            .find(|k| *fatal == Some(*k) || fail[*k as usize] >= u64::from(config.max_attempts));
        match record.status {
            Status::Succeeded => {
                if let Some(k) = doomed {
                    violations.push(format!("{id} SUCCEEDED but its plan fails step {k}"));
                }
                let trail = record.result.as_ref().map(|r| r.value()["trail"].clone());
                if trail != Some(json!(STEP_IDS)) {
                    violations.push(format!("{id} SUCCEEDED with wrong result {trail:?}"));
                }
            }
            Status::Failed => {
                let code = record
                    .error
                    .as_ref()
                    .map(|e| e.code.clone())
                    .unwrap_or_default();
                let step = u64::from(record.step);
                let expected = match doomed {
                    Some(k) if step == k && *fatal == Some(k) => code == "FATAL",
                    Some(k) if step == k => code == "FLAKY" || code == "STEP_TIMEOUT",
                    _ => false,
                };
                // Timeouts are real failures too: legitimate when they used up the step's budget.
                let timed_out = code == "STEP_TIMEOUT"
                    && record.attempts_in_budget() >= config.max_attempts
                    && doomed.is_none_or(|k| step <= k);
                if !expected && !timed_out {
                    violations.push(format!(
                        "{id} FAILED at step {step} with {code}; plan fail={fail:?} fatal={fatal:?}"
                    ));
                }
                match &record.dead_letter {
                    Some(mark) if mark.sent => {
                        let in_dlq = w.queues[EXECUTION_DLQ].messages.iter().any(|m| {
                            serde_json::from_str::<DeadLetterEnvelope>(&m.body)
                                .is_ok_and(|e| e.dead_letter_id == mark.id && e.execution_id == *id)
                        });
                        if !in_dlq {
                            violations.push(format!(
                                "{id} FAILED but its envelope is not in the execution DLQ"
                            ));
                        }
                    }
                    other => {
                        violations.push(format!("{id} FAILED with dead letter {other:?} not sent"))
                    }
                }
            }
            other => violations.push(format!("{id} ended {other}, not terminal")),
        }
        let done_steps = match record.status {
            Status::Succeeded => 3,
            _ => record.step,
        };
        for k in 0..3u32 {
            let applied = w.applied.get(&(*id, k)).copied().unwrap_or(0);
            let expected = u32::from(k < done_steps);
            if applied != expected {
                violations.push(format!(
                    "{id} step {k} outcome applied {applied} times, expected {expected}"
                ));
            }
        }
        if record.due_at().is_some() {
            violations.push(format!("{id} still due at the end"));
        }
        // Lifecycle events: every one committed was published (at least once), none left waiting.
        if !record.events.is_empty() {
            violations.push(format!(
                "{id} kept {} unpublished lifecycle events",
                record.events.len()
            ));
        }
        for seq in 0..record.event_seq {
            if !w.published.contains(&format!("{id}/{seq}")) {
                violations.push(format!("{id} lifecycle event {seq} never published"));
            }
        }
        if record.event_seq == 0 {
            violations.push(format!("{id} recorded no lifecycle event"));
        }
    }
    for q in [LAUNCH, REPLY, REQUEST] {
        let left = w.queues[q].messages.len();
        if left > 0 {
            violations.push(format!("{left} messages left on {q}"));
        }
    }
    // Every garbage message injected sits in a DLQ (duplicated deliveries may put it there twice).
    for n in 0..w.report.counts.garbage {
        let tag = format!("{GARBAGE} #{n}#");
        let parked = ["launch-dlq", "reply-dlq", "request-dlq"]
            .into_iter()
            .any(|q| w.queues[q].messages.iter().any(|m| m.body.contains(&tag)));
        if !parked {
            violations.push(format!("garbage message #{n} lost: in no DLQ"));
        }
    }
    let count = |status| w.records.values().filter(|r| r.status == status).count();
    let (succeeded, failed) = (count(Status::Succeeded), count(Status::Failed));
    w.report.counts.succeeded += succeeded;
    w.report.counts.failed += failed;
    w.violations.extend(violations);
}

/// Polls a future that never waits on anything but `YieldOnce` to completion.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = TaskContext::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
    }
}
