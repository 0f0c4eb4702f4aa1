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

mod check;
mod fakes;
mod plan;
mod scheduler;
mod world;

use check::*;
use fakes::*;
use plan::*;
pub use plan::{judge_end, End};
use scheduler::*;
use world::*;

// The library's modules under the names the simulation has always used.
use stepline::{
    adapters, claims, config, coordinator, domain, envelope, handlers, planted, ports, worker,
};

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::adapters::dynamodb::{due_key, due_shard};
use crate::adapters::{InMemoryExecutionStore, InMemoryPayloadStore, InMemoryReleaseRegistry};
use crate::claims::ClaimCheck;
use crate::coordinator::{
    CancelRequest, Coordinator, RedriveRequest, ReplayFilter, ReplayRequest, Settings,
    SubmitRequest,
};
use crate::domain::history::Entry;
use crate::domain::{Execution, PipelineDef, RetryPolicy, Status, StepDef, StepError};
use crate::domain::{Timestamp, Verdict};
use crate::envelope::{
    AwaitNotice, DeadLetterEnvelope, Identity, InteractionMessage, LaunchWork, ReplyEnvelope,
    ReplyOutcome, RequestHeader, INTERACTION_KIND, REQUEST_KIND,
};
use crate::planted::Bug;
use crate::ports::{
    Backoff, BusEvent, Clock, DeadLetter, DeadLetterQueue, Deferred, DuePage, DueQuery,
    EventPublisher, ExecutionStore, ListPage, ListQuery, MessageSender, OutMessage, PayloadStore,
    ReleaseRegistry, SendError, Sent, StoreError,
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
        store: Arc::new(InMemoryExecutionStore::default().with_item_limit(config.item_limit)),
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
                    queues: crate::config::Queues {
                        launch: LAUNCH.into(),
                        reply: REPLY.into(),
                        awaits: REPLY.into(),
                        start: None,
                        execution_dlq: EXECUTION_DLQ.into(),
                        launch_dlq: "launch-dlq".into(),
                        reply_dlq: "reply-dlq".into(),
                        start_dlq: None,
                    },
                    lease: std::time::Duration::from_secs(u64::from(config.lease_secs)),
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
        at: Timestamp::EPOCH,
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
            .filter_map(|p| w.store.snapshot(p.id))
            .filter(|r| r.status == Status::Failed)
            .map(|r| (r.id, r.version))
            .collect()
    };
    for (id, version) in to_redrive {
        let result = block_on(processes.api.redrive(RedriveRequest {
            execution_id: id,
            expected_version: version,
            reason: "operator re-drive in the sim".into(),
            release_version: None,
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
