//! Deterministic simulation of the coordinator under faults (the fault campaign).
//!
//! The real handlers (`handlers::claim_within`, `launch`, `completion`), the real coordinator API
//! (submit, cancel, re-drive, bulk replay, interaction completions) and the real worker runtime run
//! against in-memory ports that follow DynamoDB's conditional-write semantics (with its item size limit
//! and a due index that is a separate, lagging view of rounded keys in shards, queried a page at a
//! time), SQS's at-least-once delivery with visibility timeouts, receive counts and redrive to DLQs,
//! and, in every other schedule, a payload store for claim-checked payloads. The pipeline is three
//! task steps around an await step answered by a simulated approver. Every role runs as two processes
//! with caches of their own (so steps run two at a time); a crashed worker process is replaced. A
//! seeded scheduler interleaves invocations at every port call, and injects:
//! - crashes before and after any port call (the invocation dies: later calls fail, nothing is deleted,
//!   its messages reappear after the visibility timeout);
//! - responses lost after a commit (the write is applied, the SDK's retry meets its own version and
//!   the invocation carries on), and sends whose response is lost;
//! - duplicate deliveries and duplicate sends, random reordering, garbage messages, replies and
//!   interaction tokens forged by an adversary who can read the request queue (right launch, wrong
//!   token), workers' heartbeats, workers that hang;
//! - time jumps while invocations are stalled mid-flight, so leases expire under a still-running
//!   ("zombie") holder, and sweeps run into their function's deadline;
//! - a change of the due index's shard count; cancels racing completions; a bulk replay of the
//!   execution DLQ racing the rest; re-drives of failed executions.
//!
//! Each execution follows a plan (transient failures, a permanent one, an output too large for the
//! record, a hung attempt, an approval, rejection, silence or forged token, a cancel, a re-drive) from
//! which the checker knows how every attempt must end and how the execution must end; any other end is
//! a violation, and so is an execution still running a bounded simulated time after the faults stop.
//! Beside the end state ([`judge_end`], which the emulator campaign uses too) it checks, as they
//! happen: every write is based on the version it replaces; launch work is carried out only under the
//! lease it names; a live invocation sends the launch of every lease it commits and still holds; a
//! sweep that ran to its end read every entry due when it started; nothing is lost (garbage and forged
//! messages sit in a DLQ, every failed execution's envelope in the execution DLQ). A schedule is a pure
//! function of its seed; a planted bug (`stepline::planted`) must make it report violations.
//!
//! One schedule in [`SimConfig::fan_out_every`] is a fan-out instead ([`fan_out`]): a parent over
//! children, with a window or a tolerance, sometimes cancelled, under the same kinds of faults.

pub mod fan_out;

// The library's modules under the names the simulation has always used.
use stepline::{
    adapters, cache, claims, coordinator, domain, envelope, handlers, planted, ports, worker,
};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

use async_trait::async_trait;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::adapters::dynamodb::{due_key, due_shard};
use crate::adapters::{InMemoryPayloadStore, InMemoryReleaseRegistry};
use crate::claims::ClaimCheck;
use crate::coordinator::{
    CancelRequest, Coordinator, RedriveRequest, ReplayFilter, ReplayRequest, Settings,
    SubmitRequest,
};
use crate::domain::Verdict;
use crate::domain::{Execution, PipelineDef, RetryPolicy, Status, StepDef, StepError};
use crate::envelope::{
    AwaitNotice, DeadLetterEnvelope, Identity, InteractionMessage, LaunchWork, ReplyEnvelope,
    ReplyOutcome, RequestHeader, INTERACTION_KIND, REQUEST_KIND,
};
use crate::planted::Bug;
use crate::ports::{
    Backoff, BusEvent, Clock, DeadLetter, DeadLetterQueue, DuePage, DueQuery, EventPublisher,
    ExecutionStore, MessageSender, OutMessage, PayloadStore, ReleaseRegistry, SendError,
    StoreError,
};
use crate::worker::{StepFunction, Worker};

const LAUNCH: &str = "launch";
const REPLY: &str = "reply";
const REQUEST: &str = "request";
const APPROVALS: &str = "approvals";
const EXECUTION_DLQ: &str = "execution-dlq";
const DLQS: [&str; 4] = ["launch-dlq", "reply-dlq", "request-dlq", "approvals-dlq"];
const WORK_QUEUES: [&str; 4] = [LAUNCH, REPLY, REQUEST, APPROVALS];
const GARBAGE: &str = "\u{1f5d1} garbage";
const FORGED: &str = "forged";
/// The codes of messages refused for not proving who sent them.
const UNAUTHENTICATED_CODES: [&str; 2] = ["UNAUTHENTICATED", "INVALID_TOKEN"];
/// The task steps, whose outputs make the result's trail.
const STEP_IDS: [&str; 3] = ["validate", "price", "confirm"];
/// The pipeline: `validate`, `price`, `approve` (an await step announced on `approvals`), `confirm`.
const STEPS: u32 = 4;
const AWAIT_STEP: u32 = 2;
const TASK_STEPS: [u32; 3] = [0, 1, 3];
/// The claim function's timeout: a sweep's deadline is this long after it starts.
const CLAIM_TIMEOUT_MS: i64 = 10_000;
/// The sweeper's schedule.
const SWEEP_EVERY_MS: i64 = 60_000;
/// Everything must have ended this long (simulated) after the faults stop.
const SETTLE_WITHIN_MS: i64 = 48 * 3_600_000;

/// Knobs of one simulated schedule.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub executions: usize,
    /// Scheduler actions in the faulty phase.
    pub faulty_actions: usize,
    /// Probability that a port call crashes its invocation.
    pub crash_rate: f64,
    /// Probability that a write's or a send's response is lost after it was applied.
    pub lost_response_rate: f64,
    /// Probability that a sent message is delivered twice.
    pub duplicate_rate: f64,
    /// A store that ignores the version condition (to prove the checker catches it).
    pub broken_store: bool,
    /// A deliberate defect in the code under test (to prove the campaign catches it).
    pub planted: Option<Bug>,
    pub max_attempts: u32,
    pub step_timeout_secs: u32,
    pub lease_secs: u32,
    pub visibility_secs: u32,
    pub max_receives: u32,
    /// The sweep's page size (the due-index Query's `Limit`).
    pub claim_limit: i32,
    /// Due-index keys are rounded up to this.
    pub due_granularity_ms: i64,
    /// The due index shows a write up to this late.
    pub index_lag_ms: i64,
    /// The store refuses records larger than this (JSON bytes).
    pub item_limit: usize,
    /// Payloads (inputs, outputs) larger than this are claim-checked to the payload store, in the
    /// schedules that claim-check (every other one).
    pub claim_threshold: usize,
    /// Every `fan_out_every`-th seed of a campaign is a fan-out schedule (0: none).
    pub fan_out_every: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            executions: 6,
            faulty_actions: 220,
            crash_rate: 0.03,
            lost_response_rate: 0.03,
            duplicate_rate: 0.05,
            broken_store: false,
            planted: None,
            max_attempts: 4,
            step_timeout_secs: 3_600,
            lease_secs: 30,
            visibility_secs: 30,
            max_receives: 5,
            claim_limit: 2,
            due_granularity_ms: 1_000,
            index_lag_ms: 2_000,
            item_limit: 24 * 1024,
            claim_threshold: 4 * 1024,
            fan_out_every: 10,
        }
    }
}

/// Counters of what schedules exercised, each with its name in the coverage line.
macro_rules! counts {
    ($($field:ident: $label:literal),* $(,)?) => {
        /// What a schedule (or a campaign) exercised.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct Counts {
            $(pub $field: usize,)*
        }

        impl Counts {
            fn add(&mut self, other: &Counts) {
                $(self.$field += other.$field;)*
            }

            /// `label count` for every counter.
            pub fn line(&self) -> String {
                [$(format!("{} {}", $label, self.$field)),*].join(", ")
            }
        }
    };
}

counts! {
    invocations: "invocations",
    crashes: "crashes",
    lost_responses: "lost responses",
    duplicates: "duplicates",
    garbage: "garbage messages",
    forged: "forged replies",
    time_jumps: "time jumps",
    lease_expiries: "zombie-making jumps",
    fenced_writes: "lost races",
    parked: "messages parked by max receives",
    stale_index_reads: "stale index reads",
    sweeps: "sweeps",
    paged_queries: "paged queries",
    sweeps_cut_short: "sweeps cut short",
    shard_changes: "shard count changes",
    retries: "retried attempts",
    approvals: "approvals",
    rejections: "rejections",
    await_timeouts: "await timeouts",
    forged_interactions: "forged interaction tokens",
    hangs: "hung workers",
    heartbeats: "heartbeats",
    timeouts: "step timeouts",
    oversized: "outputs over the item limit",
    claim_checked: "claim-checked payloads stored",
    cancels: "cancels",
    redrives: "re-drives",
    bulk_replays: "bulk replays",
    replayed: "executions re-driven by replay",
    succeeded: "executions succeeded",
    failed: "failed as planned",
    cancelled: "cancelled",
    fan_outs: "fan-outs",
    children: "fan-out children",
    fan_out_cancels: "fan-outs cancelled",
    tolerated: "tolerated child failures",
    journal_chunks: "history chunks journaled",
    sealed_requests: "requests carrying their record sealed",
    mixed_seals: "replies with another request's sealed record",
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
                        let r = schedule(*seed, config);
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

/// One schedule of a campaign: a fan-out for every `fan_out_every`-th seed, else a [`run`].
pub fn schedule(seed: u64, config: &SimConfig) -> SimReport {
    let every = config.fan_out_every;
    if every == 0 || seed % every != every - 1 {
        return run(seed, config);
    }
    let _planted = crate::planted::plant(config.planted);
    let mut rng = fastrand::Rng::with_seed(seed);
    let children = rng.u32(3..=24);
    let failing_every = [0, 0, 3, 5][rng.usize(0..4)];
    let fan_out = fan_out::FanOutConfig {
        children,
        failing_every,
        tolerated: if rng.bool() { children } else { rng.u32(0..3) },
        crash_rate: 0.05,
        duplicate_rate: 0.1,
        broken_store: config.broken_store,
        window: rng.bool().then(|| rng.u32(1..6)),
        cancel_after: (rng.u8(0..4) == 0).then(|| rng.u64(1..80)),
        redrive_failed: false,
    };
    // Half of those with failing children re-drive them while their parent waits (which then
    // tolerates every failure, so that it waits for all).
    let fan_out = if failing_every > 0 && rng.bool() {
        fan_out::FanOutConfig {
            redrive_failed: true,
            tolerated: children,
            ..fan_out
        }
    } else {
        fan_out
    };
    let report = fan_out::run(seed, &fan_out);
    let failing = children.checked_div(failing_every).unwrap_or(0) as usize;
    SimReport {
        seed,
        violations: report.violations,
        counts: Counts {
            invocations: report.invocations as usize,
            crashes: report.crashes as usize,
            duplicates: report.duplicates as usize,
            sweeps: report.sweeps as usize,
            fan_outs: 1,
            fan_out_cancels: usize::from(report.cancelled),
            children: children as usize,
            tolerated: if failing <= fan_out.tolerated as usize {
                failing
            } else {
                0
            },
            ..Counts::default()
        },
    }
}

// ------------------------------------------------------------------------------------------- world

struct Message {
    id: u64,
    /// When it was sent (SQS `SentTimestamp`).
    sent_at: i64,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Claim,
    Launch,
    Completion,
    Worker,
    Api,
    /// The user's system taking await notices and answering them.
    Approver,
}

#[derive(Default)]
struct Invocation {
    role: Option<Role>,
    killed: bool,
    /// The bodies of the batch it was given.
    batch: Vec<String>,
    /// Records it read.
    reads: BTreeSet<Uuid>,
    /// Leases it committed (execution, generation, token), and the launch work it sent.
    leases: Vec<(Uuid, u64, Uuid)>,
    launches: BTreeSet<(Uuid, u64)>,
    /// The worker process it ran on.
    worker: Option<usize>,
}

/// The due index's view of one record, from the time a write becomes visible in it.
#[derive(Debug, Clone, Copy)]
struct IndexEntry {
    visible_at: i64,
    /// Rounded due key and shard; `None`: not in the index.
    key: Option<(i64, u32)>,
}

/// Claim checks where a schedule has them.
trait WithClaims: Sized {
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
struct SimPayloads {
    world: Shared,
    inner: InMemoryPayloadStore,
}

impl SimPayloads {
    /// A crash of the current invocation at the payload store: a worker's failure to read or store
    /// the payloads of its requests (which it may answer with `PAYLOAD_UNAVAILABLE`).
    fn failed(&self) -> StoreError {
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

    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, StoreError> {
        YieldOnce(false).await;
        let fate = self.world.lock().expect("world").fate();
        match fate {
            Fate::Proceed | Fate::LostResponse => {
                self.inner.get_range(bucket, key, start, len).await
            }
            _ => Err(self.failed()),
        }
    }
}

/// What each execution is planned to do, and what the scheduler does to it.
#[derive(Debug, Clone, Default)]
struct Plan {
    id: Uuid,
    /// Attempts of each step that fail with a retryable error.
    fail: [u32; STEPS as usize],
    /// What the approver does with the await step's notices.
    approval: Approval,
    /// A step that fails for good.
    fatal: Option<u32>,
    /// A step whose output does not fit in the record.
    huge: Option<u32>,
    /// Large payloads are claim-checked (the huge output too).
    claim_checked: bool,
    /// An attempt (step, attempt) whose worker hangs every time it gets the request.
    hang: Option<(u32, u32)>,
    /// The faulty action at which an operator cancels it.
    cancel_at: Option<usize>,
    /// Re-driven once if it fails.
    redrive: bool,
}

/// What the approver (the user's system, taking the await step's notices) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Approval {
    #[default]
    Approve,
    Reject,
    /// Never answers: the await step times out.
    Ignore,
    /// Presents a forged token first (it must be refused), then approves.
    ForgeThenApprove,
}

impl Plan {
    /// How attempt `a` of step `k` ends when it is answered: `None` for success, else the error code.
    fn answer(&self, k: u32, a: u32) -> Option<&'static str> {
        if k == AWAIT_STEP {
            return match self.approval {
                Approval::Approve | Approval::ForgeThenApprove => None,
                Approval::Reject => Some("REJECTED"),
                Approval::Ignore => Some("AWAIT_TIMEOUT"),
            };
        }
        if self.fatal == Some(k) {
            Some("FATAL")
        } else if a <= self.fail[k as usize] {
            Some("FLAKY")
        } else if self.huge == Some(k) && !self.claim_checked {
            Some("ITEM_TOO_LARGE")
        } else {
            None
        }
    }
}

/// How an execution must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    Succeeded,
    /// FAILED at this step with this code.
    Failed {
        step: u32,
        code: String,
    },
}

impl End {
    /// How `record` ended (`None`: not SUCCEEDED or FAILED).
    pub fn of(record: &Execution) -> Option<End> {
        match record.status {
            Status::Succeeded => Some(End::Succeeded),
            Status::Failed => Some(End::Failed {
                step: record.step,
                code: record
                    .error
                    .as_ref()
                    .map(|e| e.code.clone())
                    .unwrap_or_default(),
            }),
            _ => None,
        }
    }
}

/// The end-state checks every campaign makes of an execution, in the simulation and on the emulator:
/// it ended as `expected` (when given), is off the due index, left no lifecycle event unpublished, and,
/// if it failed, marked its dead letter sent and has its envelope among `execution_dlq` (the bodies of
/// the execution DLQ's messages).
pub fn judge_end(
    record: &Execution,
    expected: Option<&End>,
    execution_dlq: &[&str],
) -> Vec<String> {
    let id = record.id;
    let mut violations = Vec::new();
    let ended = End::of(record);
    if let Some(expected) = expected.filter(|e| ended.as_ref() != Some(*e)) {
        violations.push(format!(
            "{id} ended {} ({ended:?}), expected {expected:?}",
            record.status
        ));
    }
    if record.due_at().is_some() {
        violations.push(format!("{id} still due at the end"));
    }
    if !record.events.is_empty() {
        violations.push(format!(
            "{id} kept {} unpublished lifecycle events",
            record.events.len()
        ));
    }
    if record.status == Status::Failed {
        match &record.dead_letter {
            Some(mark) if mark.sent => {
                let in_dlq = execution_dlq.iter().any(|body| {
                    serde_json::from_str::<DeadLetterEnvelope>(body)
                        .is_ok_and(|e| e.dead_letter_id == mark.id && e.execution_id == id)
                });
                if !in_dlq {
                    violations.push(format!(
                        "{id} FAILED but its envelope is not in the execution DLQ"
                    ));
                }
            }
            other => violations.push(format!("{id} FAILED with dead letter {other:?} not sent")),
        }
    }
    violations
}

fn retryable(code: &str) -> bool {
    matches!(code, "FLAKY" | "STEP_TIMEOUT" | "PAYLOAD_UNAVAILABLE")
}

/// The codes of attempts that faults ended (each end explained by the fault, as it was committed).
const FAULT_CODES: [&str; 3] = ["STEP_TIMEOUT", "AWAIT_TIMEOUT", "PAYLOAD_UNAVAILABLE"];

/// The end a plan leads to, given the attempts that faults ended (a parked message, a payload store
/// that failed the worker) and the re-drives committed.
fn expected_end(
    plan: &Plan,
    faulted: &BTreeMap<(u32, u32), String>,
    redrives: u32,
    max: u32,
) -> End {
    let mut redrives_left = redrives;
    for k in 0..STEPS {
        let mut limit = max;
        let mut a = 0;
        loop {
            a += 1;
            let code = match faulted.get(&(k, a)) {
                Some(code) => Some(code.as_str()),
                None => plan.answer(k, a),
            };
            let Some(code) = code else { break };
            if retryable(code) && a < limit {
                continue;
            }
            if redrives_left > 0 {
                redrives_left -= 1;
                limit = a + max;
                continue;
            }
            return End::Failed {
                step: k,
                code: code.to_string(),
            };
        }
    }
    End::Succeeded
}

struct World {
    rng: fastrand::Rng,
    now: i64,
    faults: bool,
    config: SimConfig,
    records: BTreeMap<Uuid, Execution>,
    deferrals: crate::adapters::memory::Deferrals,
    index: BTreeMap<Uuid, Vec<IndexEntry>>,
    shards: u32,
    queues: BTreeMap<&'static str, Queue>,
    next_id: u64,
    current: Option<u64>,
    invocations: BTreeMap<u64, Invocation>,
    plans: BTreeMap<Uuid, Plan>,
    /// Lifecycle event ids published at least once.
    published: BTreeSet<String>,
    /// Step outcomes applied: (execution, step) -> count of writes that turned it SUCCEEDED.
    applied: BTreeMap<(Uuid, u32), u32>,
    /// Attempts that ended in failure: execution -> (step, attempt) -> code.
    attempt_ends: BTreeMap<Uuid, BTreeMap<(u32, u32), String>>,
    /// Attempts with a request or reply parked in a DLQ: (execution, step, attempt).
    parked: BTreeSet<(Uuid, u32, u32)>,
    /// Executions with an await notice or an interaction completion parked in a DLQ.
    parked_awaits: BTreeSet<Uuid>,
    /// Attempts whose worker the payload store failed (crashed) while it handled their request.
    payload_faults: BTreeSet<(Uuid, u32, u32)>,
    /// Request headers seen on the request queue (what an adversary reading it learns).
    overheard: Vec<RequestHeader>,
    /// Cancels that reached a result: execution -> committed.
    cancels: BTreeMap<Uuid, bool>,
    redrives: BTreeMap<Uuid, u32>,
    /// History journal chunks written: (execution, chunk) -> entries.
    journal: BTreeMap<(Uuid, u32), Vec<crate::domain::history::Entry>>,
    violations: Vec<String>,
    report: SimReport,
}

enum Fate {
    Proceed,
    CrashBefore,
    CrashAfter,
    /// Applied, but the caller is told otherwise (and lives on).
    LostResponse,
    Dead,
}

impl World {
    fn fate(&mut self) -> Fate {
        let Some(id) = self.current else {
            return Fate::Proceed;
        };
        if self.invocations.entry(id).or_default().killed {
            return Fate::Dead;
        }
        if !self.faults {
            return Fate::Proceed;
        }
        let roll = self.rng.f64();
        if roll < self.config.lost_response_rate {
            self.report.counts.lost_responses += 1;
            return Fate::LostResponse;
        }
        if roll >= self.config.lost_response_rate + self.config.crash_rate {
            return Fate::Proceed;
        }
        self.invocations.entry(id).or_default().killed = true;
        self.report.counts.crashes += 1;
        if self.rng.bool() {
            Fate::CrashBefore
        } else {
            Fate::CrashAfter
        }
    }

    fn invocation(&mut self) -> Option<&mut Invocation> {
        let id = self.current?;
        self.invocations.get_mut(&id)
    }

    fn push(&mut self, queue: &str, mut body: String, reason: Option<String>, delay_ms: i64) {
        let id = self.next_id;
        self.next_id += 1;
        let visible_at = self.now + delay_ms;
        // (A forged reply parked explains nothing: it names an attempt it does not answer.)
        if DLQS.contains(&queue) && !body.contains(FORGED) {
            self.note_parked(&body);
        }
        if queue == REQUEST {
            if let Some(header) = request_header(&body).filter(|h| h.kind == REQUEST_KIND) {
                if crate::domain::seal::split_token(&header.reply_token)
                    .1
                    .is_some()
                {
                    self.report.counts.sealed_requests += 1;
                }
                self.overheard.push(header);
            }
        }
        // A worker (or a relay) that mixes up the sealed part of its reply token: the reply is genuine
        // (its launch's own token), the record it carries another request's, of this execution or not.
        if queue == REPLY && !body.contains(FORGED) && self.rng.u8(0..16) == 0 {
            if let Some(mixed) = self.mix_seal(&body) {
                self.report.counts.mixed_seals += 1;
                body = mixed;
            }
        }
        if queue == LAUNCH {
            if let (Ok(work), Some(invocation)) = (
                serde_json::from_str::<LaunchWork>(&body),
                self.current.and_then(|c| self.invocations.get_mut(&c)),
            ) {
                invocation
                    .launches
                    .insert((work.execution_id, work.generation));
            }
        }
        if let Some(q) = self.queues.get_mut(queue) {
            q.messages.push(Message {
                id,
                sent_at: self.now,
                body,
                reason,
                visible_at,
                receives: 0,
                receipt: 0,
            });
        }
    }

    /// A request or reply reaching a DLQ explains its attempt's timeout.
    fn note_parked(&mut self, body: &str) {
        let attempt = request_header(body)
            .map(|h| (h.execution_id, h.step_index, h.attempt))
            .or_else(|| {
                serde_json::from_str::<ReplyEnvelope>(body)
                    .ok()
                    // (A heartbeat answers nothing.)
                    .filter(|r| r.outcome != ReplyOutcome::Running)
                    .map(|r| (r.execution_id, r.step_index, r.attempt))
            });
        if let Some(attempt) = attempt {
            self.parked.insert(attempt);
        }
        let awaited = serde_json::from_str::<AwaitNotice>(body)
            .map(|n| n.execution_id)
            .or_else(|_| serde_json::from_str::<InteractionMessage>(body).map(|m| m.execution_id));
        if let Ok(execution) = awaited {
            self.parked_awaits.insert(execution);
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
            let q = self.queues.get_mut(queue).expect("queue");
            let has_dlq = q.dlq.is_some();
            let message = &mut q.messages[index];
            if has_dlq && message.receives >= max_receives {
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
                self.report.counts.parked += 1;
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

    /// Puts the record's current due time in the index, visible after a random lag.
    fn index(&mut self, id: Uuid) {
        let lag = if self.rng.bool() {
            0
        } else {
            self.rng.i64(0..=self.config.index_lag_ms)
        };
        let key = self
            .records
            .get(&id)
            .and_then(|r| self.deferrals.due_at(r))
            .map(|due| {
                (
                    due_key(due, self.config.due_granularity_ms),
                    due_shard(id, self.shards),
                )
            });
        let now = self.now;
        let entries = self.index.entry(id).or_default();
        // Entries hidden behind a visible later one are never read again.
        if let Some(last_visible) = entries.iter().rposition(|e| e.visible_at <= now) {
            entries.drain(..last_visible);
        }
        entries.push(IndexEntry {
            visible_at: (now + lag).max(entries.last().map_or(0, |e| e.visible_at)),
            key,
        });
    }

    /// What the index shows for `id` now (the latest entry visible), and whether it is stale.
    fn indexed(&self, id: &Uuid) -> (Option<(i64, u32)>, bool) {
        let entries = &self.index[id];
        let visible = entries.iter().rev().find(|e| e.visible_at <= self.now);
        let stale = entries.last().is_some_and(|e| e.visible_at > self.now);
        (visible.and_then(|e| e.key), stale)
    }

    /// When the sweeper can next find something due: the earliest time an entry's key is due and the
    /// entry is visible.
    fn next_claimable(&self) -> Option<i64> {
        self.index
            .values()
            .filter_map(|entries| {
                let last = entries.last()?;
                last.key.map(|(key, _)| key.max(last.visible_at))
            })
            .min()
    }

    fn write(&mut self, record: &Execution, expected: Option<u64>) -> Result<(), StoreError> {
        let size = crate::cache::json_size(record);
        if size > self.config.item_limit {
            return Err(StoreError::TooLarge(format!(
                "a record of {size} bytes exceeds the {} byte limit",
                self.config.item_limit
            )));
        }
        let previous = self.records.get(&record.id).cloned();
        match (expected, &previous) {
            (None, Some(_)) => return Err(StoreError::Conflict),
            (Some(v), Some(p)) if p.version != v && !self.config.broken_store => {
                self.report.counts.fenced_writes += 1;
                return Err(StoreError::Conflict);
            }
            (Some(_), None) => return Err(StoreError::Conflict),
            _ => {}
        }
        if let Some(p) = &previous {
            self.observe(p, record);
        }
        let new_lease = record.lease.as_ref().is_some_and(|l| {
            previous
                .as_ref()
                .and_then(|p| p.lease.as_ref())
                .is_none_or(|pl| pl.token != l.token)
        });
        if new_lease && !record.status.is_terminal() {
            let token = record.lease.as_ref().map(|l| l.token).unwrap_or_default();
            if let Some(invocation) = self.invocation() {
                invocation
                    .leases
                    .push((record.id, record.generation, token));
            }
        }
        self.records.insert(record.id, record.clone());
        self.deferrals.written(record.id);
        self.index(record.id);
        Ok(())
    }

    /// Checks a write as it happens: versions, fencing, attempt ends, outcomes applied.
    /// An execution's whole history as a version of its record and the journal tell it; `None` when
    /// a chunk the record counts on is not in the journal.
    fn history(&self, r: &Execution) -> Option<Vec<crate::domain::history::Entry>> {
        let chunks = r.history_base / crate::domain::history::JOURNAL_CHUNK as u64;
        let mut all = Vec::new();
        for k in 0..chunks as u32 {
            all.extend(self.journal.get(&(r.id, k))?.iter().cloned());
        }
        all.extend(r.history.iter().cloned());
        Some(all)
    }

    fn observe(&mut self, p: &Execution, record: &Execution) {
        let id = record.id;
        // History is only appended to (its last entry, a heartbeat, may count on), and an entry leaves
        // the record only once the journal holds it.
        match (self.history(p), self.history(record)) {
            (Some(before), Some(after)) => {
                let kept = before.len().saturating_sub(1);
                if after.len() < before.len() || after[..kept] != before[..kept] {
                    self.violations.push(format!(
                        "history of {id} rewritten: version {} over {}",
                        record.version, p.version
                    ));
                }
            }
            (_, None) => self.violations.push(format!(
                "history of {id} lost: version {} dropped entries the journal does not hold",
                record.version
            )),
            (None, Some(_)) => {}
        }
        if record.version != p.version + 1 {
            self.violations.push(format!(
                "lost update on {id}: wrote version {} over version {}",
                record.version, p.version
            ));
        }
        if record.generation < p.generation {
            self.violations.push(format!(
                "fenced holder committed on {id}: generation {} over {}",
                record.generation, p.generation
            ));
        }
        // Launch work is carried out only under the lease it names, whatever the version says.
        let launching = self
            .current
            .and_then(|c| self.invocations.get(&c))
            .filter(|i| i.role == Some(Role::Launch));
        // (A launch invocation also writes what is not launch work: its lifecycle events published.)
        let lease_token = |r: &Execution| r.lease.as_ref().map(|l| l.token);
        let work = p.status != record.status
            || p.step != record.step
            || p.attempt != record.attempt
            || p.launch_id != record.launch_id
            || p.resends != record.resends
            || lease_token(p) != lease_token(record);
        if let Some(invocation) = launching.filter(|_| work) {
            let holds = invocation.batch.iter().any(|body| {
                serde_json::from_str::<LaunchWork>(body).is_ok_and(|w| {
                    w.execution_id == id
                        && w.generation == p.generation
                        && p.lease.as_ref().is_some_and(|l| l.token == w.token)
                })
            });
            if !holds {
                self.violations.push(format!(
                    "launch work wrote {id} without its lease (generation {}, lease {:?}))",
                    p.generation,
                    p.lease.as_ref().map(|l| l.token)
                ));
            }
        }
        for k in record.steps_succeeded_since(p) {
            *self.applied.entry((id, k)).or_default() += 1;
        }
        // A re-drive (by an operator or a bulk replay of the execution DLQ): a new budget.
        if matches!(p.status, Status::Failed | Status::Dlq) && !record.status.is_terminal() {
            self.report.counts.redrives += 1;
            *self.redrives.entry(id).or_default() += 1;
        }
        // An attempt ended in failure: it must end as its plan (or a parked message) says.
        let ended = matches!(p.status, Status::Running | Status::WaitingExternal)
            && matches!(record.status, Status::WaitRetry | Status::Failed);
        if ended {
            let (k, a) = (record.step, record.attempt);
            let code = record
                .progress(k)
                .and_then(|s| s.error.as_ref())
                .or(record.error.as_ref())
                .map(|e| e.code.clone())
                .unwrap_or_default();
            let planned = self.plans.get(&id).and_then(|plan| plan.answer(k, a));
            let explained = match code.as_str() {
                "STEP_TIMEOUT" => self.parked.contains(&(id, k, a)),
                "AWAIT_TIMEOUT" => self.parked_awaits.contains(&id),
                "PAYLOAD_UNAVAILABLE" => self.payload_faults.contains(&(id, k, a)),
                _ => false,
            };
            if planned != Some(code.as_str()) && !explained {
                self.violations.push(format!(
                    "{id} step {k} attempt {a} ended {code}, its plan says {planned:?}"
                ));
            }
            match code.as_str() {
                "STEP_TIMEOUT" => self.report.counts.timeouts += 1,
                "AWAIT_TIMEOUT" => self.report.counts.await_timeouts += 1,
                "REJECTED" => self.report.counts.rejections += 1,
                "ITEM_TOO_LARGE" => self.report.counts.oversized += 1,
                _ => {}
            }
            if record.status == Status::WaitRetry {
                self.report.counts.retries += 1;
            }
            let ends = self.attempt_ends.entry(id).or_default();
            if ends.insert((k, a), code).is_some() {
                self.violations
                    .push(format!("{id} step {k} attempt {a} ended twice"));
            }
        }
    }
}

/// The header of a request message (`{"header": .., "payload": ..}`).
fn request_header(body: &str) -> Option<RequestHeader> {
    let mut message: Value = serde_json::from_str(body).ok()?;
    serde_json::from_value(message.get_mut("header")?.take()).ok()
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

impl SimStore {
    /// A write under a fate: a lost response is the SDK's retry meeting its own version.
    async fn write(&self, record: &Execution, expected: Option<u64>) -> Result<(), StoreError> {
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
                Ok(w.records.get(&id).cloned())
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
                            entries.push((key, *id));
                        }
                    }
                }
                w.report.counts.stale_index_reads += stale.min(1);
                Ok(crate::adapters::memory::due_page(
                    entries.into_iter(),
                    query,
                ))
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
                let until = records
                    .get(&id)
                    .and_then(|r| deferrals.defer(r, now, backoff));
                w.index(id);
                Ok(until)
            }
            _ => Err(crashed()),
        }
    }

    fn shards(&self) -> u32 {
        self.0.lock().expect("world").shards
    }

    async fn put_journal(
        &self,
        id: Uuid,
        chunk: u32,
        entries: &[crate::domain::history::Entry],
    ) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.0.lock().expect("world");
        let fate = w.fate();
        if matches!(fate, Fate::CrashBefore | Fate::Dead) {
            return Err(crashed());
        }
        w.report.counts.journal_chunks += 1;
        let written = w.journal.insert((id, chunk), entries.to_vec());
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

    async fn journal(
        &self,
        id: Uuid,
        chunks: u32,
    ) -> Result<Vec<Option<Vec<crate::domain::history::Entry>>>, StoreError> {
        let w = self.0.lock().expect("world");
        Ok((0..chunks)
            .map(|k| w.journal.get(&(id, k)).cloned())
            .collect())
    }

    async fn list(
        &self,
        query: crate::ports::ListQuery,
    ) -> Result<crate::ports::ListPage, StoreError> {
        let w = self.0.lock().expect("world");
        Ok(crate::adapters::memory::list_page(
            w.records.values(),
            &query,
        ))
    }

    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError> {
        let w = self.0.lock().expect("world");
        Ok(ids
            .iter()
            .filter_map(|id| w.records.get(id).cloned())
            .collect())
    }
}

/// A DLQ as bulk replay reads it: received messages are hidden until deleted or released.
struct SimDeadLetterQueue {
    world: Shared,
    queue: &'static str,
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
                sent_at: sent.get(&id).copied(),
            })
            .collect())
    }

    async fn delete(&self, handle: &str) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().expect("world");
        match w.fate() {
            Fate::Proceed | Fate::LostResponse => {
                let (id, receipt) = parse_handle(handle);
                w.delete(self.queue, id, receipt);
                Ok(())
            }
            Fate::CrashAfter => {
                let (id, receipt) = parse_handle(handle);
                w.delete(self.queue, id, receipt);
                Err(crashed())
            }
            _ => Err(crashed()),
        }
    }

    async fn release(&self, handle: &str) -> Result<(), StoreError> {
        YieldOnce(false).await;
        let mut w = self.world.lock().expect("world");
        match w.fate() {
            Fate::Proceed | Fate::LostResponse => {
                let (id, receipt) = parse_handle(handle);
                let now = w.now;
                if let Some(q) = w.queues.get_mut(self.queue) {
                    for m in q.messages.iter_mut() {
                        if m.id == id && m.receipt == receipt {
                            m.visible_at = now;
                        }
                    }
                }
                Ok(())
            }
            _ => Err(crashed()),
        }
    }
}

fn parse_handle(handle: &str) -> (u64, u64) {
    let (id, receipt) = handle.split_once(':').unwrap_or_default();
    (id.parse().unwrap_or(0), receipt.parse().unwrap_or(0))
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
            Fate::CrashAfter | Fate::LostResponse => messages.iter().map(|_| Err(fail())).collect(),
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
            Fate::CrashAfter | Fate::LostResponse => events
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
    fn secret(&self) -> [u8; 16] {
        self.0.lock().expect("world").rng.u128(..).to_le_bytes()
    }
    fn jitter(&self) -> f64 {
        self.0.lock().expect("world").rng.f64()
    }
}

/// The worker's steps: deterministic, failing as each execution's plan says.
struct PlannedSteps {
    item_limit: usize,
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
    let approve = StepDef::await_step("approve", APPROVALS)
        .types("sim.Input/1", "sim.Input/1")
        .timeout_secs(config.step_timeout_secs);
    let mut steps: Vec<StepDef> = STEP_IDS.iter().map(step).collect();
    steps.insert(AWAIT_STEP as usize, approve);
    PipelineDef::new("sim", "1", steps)
}

/// The processes of every role, each with caches of its own.
struct Processes<'a> {
    claim: [Arc<Coordinator>; 2],
    launch: [Arc<Coordinator>; 2],
    completion: [Arc<Coordinator>; 2],
    api: Arc<Coordinator>,
    /// Worker processes: one that crashed is replaced by a new one (its memory of the launches it
    /// answered is gone with it).
    workers: Mutex<[Arc<Worker>; 2]>,
    new_worker: Box<dyn Fn() -> Arc<Worker> + 'a>,
    /// How the approver sends completions to the await-completion queue.
    approver: Arc<SimSender>,
}

/// Runs one schedule.
pub fn run(seed: u64, config: &SimConfig) -> SimReport {
    let _planted = crate::planted::plant(config.planted);
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
        (APPROVALS, Some("approvals-dlq")),
        ("approvals-dlq", None),
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
        index: BTreeMap::new(),
        shards: 2,
        queues,
        next_id: 1,
        current: None,
        invocations: BTreeMap::new(),
        plans: BTreeMap::new(),
        applied: BTreeMap::new(),
        attempt_ends: BTreeMap::new(),
        parked: BTreeSet::new(),
        parked_awaits: BTreeSet::new(),
        payload_faults: BTreeSet::new(),
        overheard: Vec::new(),
        cancels: BTreeMap::new(),
        redrives: BTreeMap::new(),
        journal: BTreeMap::new(),
        published: BTreeSet::new(),
        violations: Vec::new(),
        report: SimReport {
            seed,
            ..Default::default()
        },
    }));
    let def = pipeline(config);
    let registry = Arc::new(InMemoryReleaseRegistry::default());
    // Every other schedule claim-checks large payloads (an output too large for the record then
    // succeeds); the others keep them inline.
    let claims = world.lock().expect("world").rng.bool().then(|| {
        let payloads = SimPayloads {
            world: world.clone(),
            inner: InMemoryPayloadStore::default(),
        };
        ClaimCheck::new(Arc::new(payloads), "payloads", config.claim_threshold)
    });
    // One deployment's keys, shared by every process.
    let keys = Arc::new(crate::adapters::MemoryKeys::default());
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
                    claim_limit: config.claim_limit,
                    instance: role.into(),
                },
            )
            .with_publisher(Arc::new(SimPublisher(world.clone())))
            .with_keys(keys.clone())
            .with_claims(claims.as_ref()),
        )
    };
    let worker = || {
        Arc::new(
            Worker::new(
                Identity {
                    pipeline_id: def.pipeline_id.clone(),
                    contract_version: crate::domain::contract::Contract::of(&def).contract_version,
                    release_version: def.release_version.clone(),
                },
                Arc::new(SimSender(world.clone())),
                Arc::new(PlannedSteps {
                    item_limit: config.item_limit,
                }),
            )
            .with_concurrency(1)
            .with_heartbeat(crate::worker::Heartbeat::Off)
            .with_dead_letter_queue("request-dlq")
            .with_claims(claims.as_ref()),
        )
    };
    let processes = Processes {
        claim: [coordinator("claim-1"), coordinator("claim-2")],
        launch: [coordinator("launch-1"), coordinator("launch-2")],
        completion: [coordinator("completion-1"), coordinator("completion-2")],
        api: coordinator("api"),
        workers: Mutex::new([worker(), worker()]),
        new_worker: Box::new(worker),
        approver: Arc::new(SimSender(world.clone())),
    };

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

    // Plans: mostly clean, some transient failures, some permanent, some exhausting the budget, some
    // too large; some cancelled on the way, some re-driven when they fail.
    for n in 0..config.executions {
        let mut plan = Plan {
            claim_checked: claims.is_some(),
            ..Plan::default()
        };
        {
            let mut w = world.lock().expect("world");
            let task = TASK_STEPS[w.rng.usize(0..TASK_STEPS.len())];
            match w.rng.u8(0..13) {
                0..=4 => {}
                5..=7 => plan.fail[task as usize] = w.rng.u32(1..3),
                8 => plan.fatal = Some(task),
                9 => plan.huge = Some(task),
                10 => plan.hang = Some((task, w.rng.u32(1..3))),
                _ => plan.fail[task as usize] = 99,
            }
            plan.approval = match w.rng.u8(0..20) {
                0..=13 => Approval::Approve,
                14 | 15 => Approval::Reject,
                16 => Approval::Ignore,
                _ => Approval::ForgeThenApprove,
            };
            if w.rng.u8(0..8) == 0 {
                plan.cancel_at = Some(w.rng.usize(0..config.faulty_actions.max(1)));
            }
            plan.redrive = w.rng.u8(0..3) == 0;
        }
        let input = json!({
            "n": n,
            "trail": [],
            "plan": {"fail": plan.fail, "fatal": plan.fatal, "huge": plan.huge},
        });
        let submitted = block_on(processes.api.submit(SubmitRequest {
            pipeline_id: def.pipeline_id.clone(),
            release_version: None,
            tenant: "sim".into(),
            input,
            idempotency_key: None,
            parent: None,
        }))
        .expect("submit");
        plan.id = submitted.execution;
        world
            .lock()
            .expect("world")
            .plans
            .insert(plan.id, plan.clone());
    }

    let mut scheduler = Scheduler {
        world: world.clone(),
        processes: &processes,
        running: Vec::new(),
        next_invocation: 1,
    };

    // Faulty phase.
    world.lock().expect("world").faults = true;
    let plans: Vec<Plan> = world
        .lock()
        .expect("world")
        .plans
        .values()
        .cloned()
        .collect();
    // Half the schedules replay the execution DLQ in bulk at some point (re-driving every failed
    // execution whose envelope is there), racing everything else.
    let replay_at = {
        let mut w = world.lock().expect("world");
        w.rng.bool().then(|| {
            w.rng
                .usize(config.faulty_actions / 2..config.faulty_actions.max(1))
        })
    };
    for action in 0..config.faulty_actions {
        for plan in plans.iter().filter(|p| p.cancel_at == Some(action)) {
            scheduler.start_cancel(plan.id);
        }
        if replay_at == Some(action) {
            scheduler.start_replay();
        }
        scheduler.faulty_action();
    }

    // Calm phase: no new faults; run to quiescence, re-drive what the plans say, run again.
    world.lock().expect("world").faults = false;
    scheduler.settle();
    let to_redrive: Vec<(Uuid, u64)> = {
        let w = world.lock().expect("world");
        plans
            .iter()
            .filter(|p| p.redrive)
            .filter_map(|p| w.records.get(&p.id))
            .filter(|r| r.status == Status::Failed)
            .map(|r| (r.id, r.version))
            .collect()
    };
    for (id, version) in to_redrive {
        let result = block_on(processes.api.redrive(RedriveRequest {
            execution_id: id,
            expected_version: version,
            reason: "operator re-drive in the sim".into(),
        }));
        let mut w = world.lock().expect("world");
        match result {
            Ok(_) => {}
            Err(e) => w
                .violations
                .push(format!("re-drive of failed {id} refused: {e}")),
        }
    }
    scheduler.settle();

    check(&world, config, claims.as_ref());
    let w = world.lock().expect("world");
    let mut report = w.report.clone();
    report.violations = w.violations.clone();
    report
}

/// Starts, polls and ends invocations.
struct Scheduler<'a> {
    world: Shared,
    processes: &'a Processes<'a>,
    running: Vec<Running>,
    next_invocation: u64,
}

impl Scheduler<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("world")
    }

    fn begin(&mut self, role: Role, batch: Vec<String>) -> u64 {
        let id = self.next_invocation;
        self.next_invocation += 1;
        let mut w = self.lock();
        w.report.counts.invocations += 1;
        w.invocations.insert(
            id,
            Invocation {
                role: Some(role),
                batch,
                ..Invocation::default()
            },
        );
        id
    }

    /// A sweep of the due index, with its function's deadline.
    fn start_sweep(&mut self) {
        let pick = self.lock().rng.usize(0..2);
        let claim = self.processes.claim[pick].clone();
        let id = self.begin(Role::Claim, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            // Everything due when the sweep starts (as the index shows it), by version.
            let (started, due) = {
                let w = world.lock().expect("world");
                let due: Vec<(Uuid, u64)> = w
                    .index
                    .keys()
                    .filter(|id| {
                        let (key, stale) = w.indexed(id);
                        !stale && key.is_some_and(|(key, _)| key <= w.now)
                    })
                    .map(|id| (*id, w.records[id].version))
                    .collect();
                (w.now, due)
            };
            let deadline = Some(started + CLAIM_TIMEOUT_MS);
            let report =
                crate::handlers::claim_within(&claim, EventBridgeEvent::default(), deadline).await;
            let mut w = world.lock().expect("world");
            w.report.counts.sweeps += 1;
            let Ok(report) = report else { return None };
            w.report.counts.sweeps_cut_short += usize::from(report.stopped_early);
            let invocation = &w.invocations[&id];
            if invocation.killed || report.stopped_early || report.failed_queries > 0 {
                return None;
            }
            let missed: Vec<Uuid> = due
                .into_iter()
                .filter(|(e, version)| {
                    !invocation.reads.contains(e) && w.records[e].version == *version
                })
                .map(|(e, _)| e)
                .collect();
            for e in missed {
                w.violations.push(format!(
                    "a sweep that ran to its end never read {e}, due when it started"
                ));
            }
            None
        });
        self.running.push(Running {
            id,
            task,
            queue: None,
            receipts: Vec::new(),
        });
    }

    /// An operator's cancel, racing whatever runs.
    fn start_cancel(&mut self, execution: Uuid) {
        let api = self.processes.api.clone();
        let id = self.begin(Role::Api, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            let result = api
                .cancel(CancelRequest {
                    execution_id: execution,
                    reason: "operator cancel in the sim".into(),
                })
                .await;
            let mut w = world.lock().expect("world");
            w.report.counts.cancels += 1;
            if !w.invocations[&id].killed {
                w.cancels.insert(execution, result.is_ok());
            }
            None
        });
        self.running.push(Running {
            id,
            task,
            queue: None,
            receipts: Vec::new(),
        });
    }

    /// An operator's bulk replay of the execution DLQ.
    fn start_replay(&mut self) {
        let api = self.processes.api.clone();
        let id = self.begin(Role::Api, Vec::new());
        let world = self.world.clone();
        let task: Task = Box::pin(async move {
            let dlq = SimDeadLetterQueue {
                world: world.clone(),
                queue: EXECUTION_DLQ,
            };
            let request = ReplayRequest {
                filter: ReplayFilter::default(),
                dry_run: false,
                max_messages: 100,
                rate_per_second: None,
                reason: "bulk replay in the sim".into(),
            };
            let report = api.replay(&dlq, &request).await;
            let mut w = world.lock().expect("world");
            w.report.counts.bulk_replays += 1;
            if let Ok(report) = report {
                w.report.counts.replayed += report.replayed;
            }
            None
        });
        self.running.push(Running {
            id,
            task,
            queue: None,
            receipts: Vec::new(),
        });
    }

    /// An SQS-triggered invocation of a random process of the queue's consumer.
    fn start_delivery(&mut self, queue: &'static str) {
        let batch = {
            let mut w = self.lock();
            let max = w.rng.usize(1..=10);
            w.receive(queue, max)
        };
        if batch.is_empty() {
            return;
        }
        let mut event = SqsEvent::default();
        let mut receipts = Vec::new();
        let mut bodies = Vec::new();
        for (i, (message_id, receipt, body)) in batch.into_iter().enumerate() {
            let mut m = SqsMessage::default();
            m.message_id = Some(format!("m{i}"));
            m.receipt_handle = Some(receipt.to_string());
            bodies.push(body.clone());
            m.body = Some(body);
            event.records.push(m);
            receipts.push((format!("m{i}"), message_id, receipt));
        }
        let pick = self.lock().rng.usize(0..2);
        let (role, task): (Role, Task) = match queue {
            LAUNCH => {
                let c = self.processes.launch[pick].clone();
                (
                    Role::Launch,
                    Box::pin(async move { Some(crate::handlers::launch(&c, event).await) }),
                )
            }
            REPLY => {
                let c = self.processes.completion[pick].clone();
                (
                    Role::Completion,
                    Box::pin(async move { Some(crate::handlers::completion(&c, event).await) }),
                )
            }
            APPROVALS => {
                let approver = Approver {
                    world: self.world.clone(),
                    api: self.processes.api.clone(),
                    sender: self.processes.approver.clone(),
                };
                (
                    Role::Approver,
                    Box::pin(async move { Some(approver.handle(event).await) }),
                )
            }
            _ => {
                let w = self.processes.workers.lock().expect("workers")[pick].clone();
                (
                    Role::Worker,
                    Box::pin(async move { Some(w.handle(event).await) }),
                )
            }
        };
        // A worker that gets a request of a hanging attempt never answers (nor acknowledges).
        let hangs = {
            let w = self.lock();
            role == Role::Worker
                && bodies.iter().filter_map(|b| request_header(b)).any(|h| {
                    w.plans.get(&h.execution_id).and_then(|p| p.hang)
                        == Some((h.step_index, h.attempt))
                })
        };
        let id = self.begin(role, bodies);
        if role == Role::Worker {
            self.lock()
                .invocations
                .get_mut(&id)
                .expect("invocation")
                .worker = Some(pick);
        }
        if hangs {
            let mut w = self.lock();
            w.report.counts.hangs += 1;
            w.invocations.get_mut(&id).expect("invocation").killed = true;
        }
        self.running.push(Running {
            id,
            task,
            queue: Some(queue),
            receipts,
        });
    }

    /// Polls invocation `index` once; a finished one has its batch acknowledged (unless it died) and
    /// is checked: a live invocation sent the launch of every lease it committed.
    fn poll(&mut self, index: usize) {
        let mut cx = TaskContext::from_waker(Waker::noop());
        self.lock().current = Some(self.running[index].id);
        let poll = self.running[index].task.as_mut().poll(&mut cx);
        let world = self.world.clone();
        let mut w = world.lock().expect("world");
        w.current = None;
        let Poll::Ready(response) = poll else { return };
        let done = self.running.swap_remove(index);
        let invocation = w.invocations.remove(&done.id).unwrap_or_default();
        if invocation.killed {
            drop(w);
            if let Some(slot) = invocation.worker {
                let fresh = (self.processes.new_worker)();
                self.processes.workers.lock().expect("workers")[slot] = fresh;
            }
            return;
        }
        // (A lease no longer in the record was taken over or ended: its launch is moot.)
        for (execution, generation, token) in &invocation.leases {
            let held = w.records[execution].lease.as_ref().map(|l| l.token) == Some(*token);
            if held && !invocation.launches.contains(&(*execution, *generation)) {
                w.violations.push(format!(
                    "a live {:?} invocation committed lease {generation} of {execution} and never \
                     sent its launch",
                    invocation.role
                ));
            }
        }
        if let (Some(queue), Some(response)) = (done.queue, response) {
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

    fn faulty_action(&mut self) {
        let choice = self.lock().rng.u8(0..100);
        match choice {
            0..=41 if !self.running.is_empty() => {
                let index = self.lock().rng.usize(0..self.running.len());
                self.poll(index);
            }
            42..=70 => {
                let queue = WORK_QUEUES[self.lock().rng.usize(0..WORK_QUEUES.len())];
                self.start_delivery(queue);
            }
            71..=77 => self.start_sweep(),
            78..=88 => {
                let mut w = self.lock();
                let jump = if w.rng.u8(0..5) == 0 {
                    w.report.counts.lease_expiries += 1;
                    w.rng.i64(20_000..70_000)
                } else {
                    w.rng.i64(0..5_000)
                };
                w.report.counts.time_jumps += 1;
                w.now += jump;
            }
            89..=91 => {
                // Duplicate delivery of a random message.
                let mut w = self.lock();
                let queue = [LAUNCH, REPLY, REQUEST][w.rng.usize(0..3)];
                let count = w.queues[queue].messages.len();
                if count > 0 {
                    let i = w.rng.usize(0..count);
                    let body = w.queues[queue].messages[i].body.clone();
                    w.report.counts.duplicates += 1;
                    w.push(queue, body, None, 0);
                }
            }
            92..=93 => self.lock().forge_reply(),
            94 => self.lock().heartbeat(),
            95 => {
                let mut w = self.lock();
                let shards = w.rng.u32(1..=4);
                if shards != w.shards {
                    w.report.counts.shard_changes += 1;
                    w.shards = shards;
                }
            }
            _ => {
                let mut w = self.lock();
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

    /// Runs without faults until nothing is left to do; an execution still running
    /// `SETTLE_WITHIN_MS` (simulated) later is a violation. Sweeps run on their schedule.
    fn settle(&mut self) {
        let calm_from = self.lock().now;
        let mut last_sweep = i64::MIN;
        for _ in 0..50_000 {
            if !self.running.is_empty() {
                let index = self.lock().rng.usize(0..self.running.len());
                self.poll(index);
                continue;
            }
            let (now, visible, next_visible, claimable) = {
                let w = self.lock();
                let queues = WORK_QUEUES;
                let visible = queues
                    .into_iter()
                    .find(|q| w.queues[q].messages.iter().any(|m| m.visible_at <= w.now));
                let next_visible = queues
                    .into_iter()
                    .flat_map(|q| w.queues[q].messages.iter().map(|m| m.visible_at))
                    .min();
                (w.now, visible, next_visible, w.next_claimable())
            };
            if now - calm_from > SETTLE_WITHIN_MS {
                let mut w = self.lock();
                let open: Vec<String> = w
                    .records
                    .values()
                    .filter(|r| !r.status.is_terminal())
                    .map(|r| format!("{} {}", r.id, r.status))
                    .collect();
                w.violations.push(format!(
                    "not settled {} h after the faults stopped: {open:?}",
                    SETTLE_WITHIN_MS / 3_600_000
                ));
                return;
            }
            if let Some(queue) = visible {
                self.start_delivery(queue);
                continue;
            }
            let next_sweep = claimable.map(|t| round_up(t.max(now), SWEEP_EVERY_MS));
            if next_sweep == Some(now) && last_sweep != now {
                last_sweep = now;
                self.start_sweep();
                continue;
            }
            let next_sweep = claimable.map(|t| round_up(t.max(now + 1), SWEEP_EVERY_MS));
            match [next_visible, next_sweep].into_iter().flatten().min() {
                Some(t) => {
                    let mut w = self.lock();
                    w.now = w.now.max(t).max(now + 1);
                }
                None => return,
            }
        }
        self.lock()
            .violations
            .push("did not settle within 50,000 calm actions".into());
    }
}

/// The approver: answers each await notice as the execution's plan says, through the API or through
/// the await-completion queue (chosen at random), presenting a forged token first when planned.
struct Approver {
    world: Shared,
    api: Arc<Coordinator>,
    sender: Arc<SimSender>,
}

impl Approver {
    async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        for message in event.records {
            let id = message.message_id.clone().unwrap_or_default();
            let notice = message
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str::<AwaitNotice>(b).ok());
            let Some(notice) = notice else { continue };
            if !self.answer(&notice).await {
                let mut failure = aws_lambda_events::event::sqs::BatchItemFailure::default();
                failure.item_identifier = id;
                response.batch_item_failures.push(failure);
            }
        }
        response
    }

    /// Answers one notice; `false` if it must be delivered again.
    async fn answer(&self, notice: &AwaitNotice) -> bool {
        let (approval, by_queue, tag) = {
            let mut w = self.world.lock().expect("world");
            let approval = w
                .plans
                .get(&notice.execution_id)
                .map_or(Approval::Approve, |p| p.approval);
            let by_queue = w.rng.bool();
            let tag = format!("{FORGED} #{}#", w.report.counts.forged);
            (approval, by_queue, tag)
        };
        let Some(interaction) = notice.interactions.first() else {
            return true;
        };
        let message = |verdict, token: &str, payload: Value| InteractionMessage {
            kind: INTERACTION_KIND.to_string(),
            execution_id: notice.execution_id,
            interaction: interaction.id.clone(),
            token: token.to_string(),
            verdict,
            payload,
            unit: Some(notice.await_unit_id),
        };
        if approval == Approval::ForgeThenApprove {
            let forged = message(
                Verdict::Approved,
                &"0".repeat(interaction.token.len().max(16)),
                json!({"forged": tag}),
            );
            // (Sent by an adversary, beside the approver: not subject to the approver's faults.)
            let refused = if by_queue {
                let mut w = self.world.lock().expect("world");
                w.report.counts.forged += 1;
                let body = serde_json::to_string(&forged).expect("interaction");
                w.push(REPLY, body, None, 0);
                true
            } else {
                let result = self.api.complete_interaction(forged).await;
                if result.is_ok() {
                    self.world.lock().expect("world").violations.push(format!(
                        "a forged interaction token was accepted for {}",
                        notice.execution_id
                    ));
                }
                true
            };
            self.world
                .lock()
                .expect("world")
                .report
                .counts
                .forged_interactions += 1;
            if !refused {
                return false;
            }
        }
        let verdict = match approval {
            Approval::Ignore => return true,
            Approval::Reject => Verdict::Rejected,
            Approval::Approve | Approval::ForgeThenApprove => Verdict::Approved,
        };
        let answer = message(verdict, &interaction.token, json!({"by": "sim"}));
        let done = if by_queue {
            self.send(&answer).await
        } else {
            self.api
                .complete_interaction(answer)
                .await
                .map_or_else(|e| !e.is_retryable(), |_| true)
        };
        if done && verdict == Verdict::Approved {
            self.world.lock().expect("world").report.counts.approvals += 1;
        }
        done
    }

    async fn send(&self, message: &InteractionMessage) -> bool {
        let body = serde_json::to_string(message).expect("interaction");
        let results = self.sender.send(REPLY, &[OutMessage::new(body)]).await;
        results.iter().all(Result::is_ok)
    }
}

fn round_up(t: i64, step: i64) -> i64 {
    t.div_euclid(step) * step + if t.rem_euclid(step) == 0 { 0 } else { step }
}

impl World {
    /// A worker's heartbeat for a request it holds (what the worker runtime sends while a step runs):
    /// it extends the attempt's deadline if the attempt is current, and is ignored otherwise.
    fn heartbeat(&mut self) {
        if self.overheard.is_empty() {
            return;
        }
        let header = self.overheard[self.rng.usize(0..self.overheard.len())].clone();
        let beat = ReplyEnvelope::for_request(&header, ReplyOutcome::Running);
        self.report.counts.heartbeats += 1;
        let body = serde_json::to_string(&beat).expect("heartbeat");
        self.push(REPLY, body, None, 0);
    }

    /// `body` (a reply) with the sealed record in its token swapped for an overheard request's.
    fn mix_seal(&mut self, body: &str) -> Option<String> {
        let mut reply: Value = serde_json::from_str(body).ok()?;
        let token = reply.get("replyToken")?.as_str()?.to_string();
        let (own, _) = crate::domain::seal::split_token(&token);
        let other = self
            .overheard
            .get(self.rng.usize(0..self.overheard.len().max(1)))?;
        let (_, sealed) = crate::domain::seal::split_token(&other.reply_token);
        reply["replyToken"] = json!(crate::domain::seal::sealed_token(own, sealed?));
        serde_json::to_string(&reply).ok()
    }

    /// An adversary who read a request replies to it with a wrong token: a forged success or a forged
    /// permanent failure. It must be refused and parked, never applied.
    fn forge_reply(&mut self) {
        if self.overheard.is_empty() {
            return;
        }
        let header = self.overheard[self.rng.usize(0..self.overheard.len())].clone();
        let tag = format!("{FORGED} #{}#", self.report.counts.forged);
        let outcome = if self.rng.bool() {
            ReplyOutcome::Succeeded {
                output: json!({"trail": [tag], "plan": {}}),
            }
        } else {
            ReplyOutcome::Failed {
                error: StepError::new("FORGED", tag, false),
            }
        };
        let mut reply = ReplyEnvelope::for_request(&header, outcome);
        reply.reply_token = match self.rng.u8(0..3) {
            0 => String::new(),
            _ => "0".repeat(header.reply_token.len().max(32)),
        };
        // The adversary sees what a worker sees, the sealed part of the token included. Reading the
        // record there is a violation by itself; with it, the adversary seals a record of its own
        // making (its own secret) and signs the reply with that secret.
        if let Some(mut record) = read_seal(&header.reply_token) {
            self.violations.push(format!(
                "a worker read the record of {} sealed in its request",
                header.execution_id
            ));
            record.secret = "feed".repeat(8);
            let own = crate::domain::reply_token(&record.secret, header.launch_id);
            let mut sealed = vec![0; crate::domain::crypto::NONCE_BYTES];
            sealed.extend(serde_json::to_vec(&record).expect("a record serializes"));
            reply.reply_token =
                crate::domain::seal::sealed_token(&own, &URL_SAFE_NO_PAD.encode(sealed));
        }
        self.report.counts.forged += 1;
        let body = serde_json::to_string(&reply).expect("reply");
        self.push(REPLY, body, None, 0);
    }
}

/// The record sealed in a reply token, if whoever holds the token can read it (a seal that is not
/// encrypted: never, unless the sealing is broken).
fn read_seal(token: &str) -> Option<Execution> {
    let sealed = crate::domain::seal::split_token(token).1?;
    let bytes = URL_SAFE_NO_PAD.decode(sealed).ok()?;
    serde_json::from_slice(bytes.get(crate::domain::crypto::NONCE_BYTES..)?).ok()
}

/// The invariants, checked once the system has settled.
fn check(world: &Shared, config: &SimConfig, claims: Option<&ClaimCheck>) {
    // Results, claim-checked ones read back as the API's caller would (before the world is locked:
    // the payload store takes its lock).
    let results: BTreeMap<Uuid, Value> = {
        let records: Vec<Execution> = world
            .lock()
            .expect("world")
            .records
            .values()
            .cloned()
            .collect();
        records
            .into_iter()
            .filter_map(|r| {
                let value = r.result.as_ref()?.value().clone();
                let value = match claims {
                    Some(claims) => block_on(claims.resolve(value)).ok()?,
                    None => value,
                };
                Some((r.id, value))
            })
            .collect()
    };
    let mut w = world.lock().expect("world");
    let mut violations = Vec::new();
    let plans: Vec<Plan> = w.plans.values().cloned().collect();
    for plan in &plans {
        let id = plan.id;
        let Some(record) = w.records.get(&id).cloned() else {
            violations.push(format!("execution {id} lost"));
            continue;
        };
        let faulted: BTreeMap<(u32, u32), String> = w
            .attempt_ends
            .get(&id)
            .into_iter()
            .flatten()
            .filter(|(_, code)| FAULT_CODES.contains(&code.as_str()))
            .map(|(attempt, code)| (*attempt, code.clone()))
            .collect();
        let redrives = w.redrives.get(&id).copied().unwrap_or(0);
        let expected = expected_end(plan, &faulted, redrives, config.max_attempts);
        let cancel = w.cancels.get(&id).copied();
        let expect_end = match (record.status, cancel) {
            (Status::Cancelled, _) if plan.cancel_at.is_some() => None,
            (Status::Cancelled, _) => {
                violations.push(format!("{id} CANCELLED, never cancelled"));
                None
            }
            (_, Some(true)) => {
                violations.push(format!(
                    "{id} ended {} although its cancel was committed",
                    record.status
                ));
                None
            }
            _ => Some(&expected),
        };
        let dlq: Vec<&str> = w.queues[EXECUTION_DLQ]
            .messages
            .iter()
            .map(|m| m.body.as_str())
            .collect();
        for violation in judge_end(&record, expect_end, &dlq) {
            violations.push(format!("{violation}; plan {plan:?}"));
        }
        if record.status == Status::Succeeded {
            let trail = results.get(&id).map(|r| r["trail"].clone());
            if trail != Some(json!(STEP_IDS)) {
                violations.push(format!("{id} SUCCEEDED with wrong result {trail:?}"));
            }
        }
        let done_steps = match record.status {
            Status::Succeeded => STEPS,
            _ => record.step,
        };
        for k in 0..STEPS {
            let applied = w.applied.get(&(id, k)).copied().unwrap_or(0);
            let expected = u32::from(k < done_steps);
            if applied != expected {
                violations.push(format!(
                    "{id} step {k} outcome applied {applied} times, expected {expected}"
                ));
            }
        }
        // Every lifecycle event committed was published (at least once).
        for seq in 0..record.event_seq {
            if !w.published.contains(&format!("{id}/{seq}")) {
                violations.push(format!("{id} lifecycle event {seq} never published"));
            }
        }
        if record.event_seq == 0 {
            violations.push(format!("{id} recorded no lifecycle event"));
        }
        // A message that did not prove it may act on an execution writes nothing to it.
        for incident in &record.incidents {
            if UNAUTHENTICATED_CODES.contains(&incident.code.as_str()) {
                violations.push(format!(
                    "{id} noted {}: a message that did not authenticate wrote to it",
                    incident.code
                ));
            }
        }
        match record.status {
            Status::Succeeded => w.report.counts.succeeded += 1,
            Status::Failed => w.report.counts.failed += 1,
            Status::Cancelled => w.report.counts.cancelled += 1,
            _ => {}
        }
    }
    for q in WORK_QUEUES {
        let left = w.queues[q].messages.len();
        if left > 0 {
            violations.push(format!("{left} messages left on {q}"));
        }
    }
    // Every garbage and forged message sits in a DLQ (duplicated deliveries may put it there twice).
    let in_a_dlq = |tag: &str| {
        DLQS.into_iter()
            .any(|q| w.queues[q].messages.iter().any(|m| m.body.contains(tag)))
    };
    for n in 0..w.report.counts.garbage {
        if !in_a_dlq(&format!("{GARBAGE} #{n}#")) {
            violations.push(format!("garbage message #{n} lost: in no DLQ"));
        }
    }
    for n in 0..w.report.counts.forged {
        if !in_a_dlq(&format!("{FORGED} #{n}#")) {
            violations.push(format!("forged reply #{n} lost: in no DLQ"));
        }
    }
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
