//! A fan-out in the deterministic simulation: one parent whose fan-out step reads its items from an
//! object (JSON lines in the payload bucket) and runs each as a child execution, every part the real
//! one (the launch and completion handlers, the sweeper, the worker runtime, the fan-out ledger's
//! protocol) over in-memory ports, with seeded faults:
//! - crashes: any store or ledger write may kill its invocation before or after it is applied; the
//!   invocation's later calls fail and none of its messages is acknowledged (all come back);
//! - duplicates: any message sent may be delivered twice;
//! - reordering: each delivery takes a random message among the oldest hundred of its queue.
//!
//! When the queues are empty the clock moves to the next due time and the sweeper runs (it recovers
//! what crashes left unsent). At the end the checker asks: did the parent resume exactly once, with
//! every child counted exactly once and every child's end in its results, in item order?

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::domain::Timestamp;

use crate::adapters::{
    InMemoryExecutionStore, InMemoryFanOutLedger, InMemoryPayloadStore, InMemoryReleaseRegistry,
};
use crate::claims::ClaimCheck;
use crate::coordinator::{CancelRequest, Coordinator, RedriveRequest, Settings};
use crate::domain::history::Entry;
use crate::domain::{
    ChildEnd, Execution, PipelineDef, RetryPolicy, Status, StepDef, StepError, Tally,
};
use crate::envelope::{
    Identity, RequestHeader, StartDetail, StartEvent, START_DETAIL_TYPE, START_SOURCE,
};
use crate::planted::{self, Bug};
use crate::ports::{
    Backoff, BlockCount, Clock, Deferred, DuePage, DueQuery, ExecutionStore, FanOutLedger,
    HeadChange, ItemOutcome, ListPage, ListQuery, MessageSender, OutMessage, PayloadStore,
    SendError, Sent, StoreError,
};
use crate::worker::{Heartbeat, StepFunction, Worker};

const LAUNCH: &str = "launch";
const START: &str = "start";
const REPLY: &str = "reply";
const REQUEST: &str = "request";
const SUMMARY: &str = "summary";
const BUCKET: &str = "payloads";
const ITEMS_KEY: &str = "payloads/items.jsonl";
/// Deliveries take a random message among this many of the oldest of their queue.
const WINDOW: usize = 100;

/// Knobs of one simulated fan-out.
#[derive(Debug, Clone)]
pub struct FanOutConfig {
    pub children: u32,
    /// Every `failing_every`-th child's step fails for good (0: none).
    pub failing_every: u32,
    /// How many failed children the step tolerates.
    pub tolerated: u32,
    pub crash_rate: f64,
    pub duplicate_rate: f64,
    /// A store that ignores the version condition (to prove the checker catches what it causes).
    pub broken_store: bool,
    /// The fan-out step's `maxConcurrency`.
    pub window: Option<u32>,
    /// An operator cancels the parent after this many deliveries (racing its children).
    pub cancel_after: Option<u64>,
    /// An operator re-drives every child that failed while its parent still waits; a child's
    /// planned failure happens on its first attempt only, so a re-driven child succeeds, and its
    /// parent counts it once, with the outcome that came last.
    pub redrive_failed: bool,
}

impl Default for FanOutConfig {
    fn default() -> Self {
        Self {
            children: 1000,
            failing_every: 0,
            tolerated: 0,
            crash_rate: 0.01,
            duplicate_rate: 0.05,
            broken_store: false,
            window: None,
            cancel_after: None,
            redrive_failed: false,
        }
    }
}

/// What one simulated fan-out did, and what the checker found wrong (nothing, one hopes).
#[derive(Debug, Clone, Default)]
pub struct FanOutReport {
    pub seed: u64,
    pub invocations: u64,
    pub deliveries: u64,
    pub crashes: u64,
    pub duplicates: u64,
    pub sweeps: u64,
    /// Writes of the parent's record after it was created.
    pub parent_writes: u64,
    /// Writes that resumed the parent (resolved its fan-out): exactly one.
    pub resumptions: u64,
    /// The most children started and not yet ended at any time.
    pub most_running: u64,
    /// Worker runs of the children's step, and the rows they paid.
    pub step_runs: u64,
    pub rows_paid: u64,
    pub ledger_writes: u64,
    pub status: Option<Status>,
    pub tally: Tally,
    /// The operator cancelled the parent, and was told the cancel was committed.
    pub cancel_tried: bool,
    pub cancel_committed: bool,
    /// The parent ended cancelled.
    pub cancelled: bool,
    pub violations: Vec<String>,
}

mod fakes;

use fakes::*;

fn pipelines(config: &FanOutConfig) -> (PipelineDef, PipelineDef) {
    let parent = PipelineDef::new(
        "batch",
        "1",
        [
            {
                let step = StepDef::fan_out("payments", "payment")
                    .timeout_secs(86_400)
                    .tolerating(Some(config.tolerated), None);
                match config.window {
                    Some(window) => step.max_concurrency(window),
                    None => step,
                }
            },
            // Its request waits on a queue nobody reads: the sim ends once it is sent.
            StepDef::task("summary", SUMMARY),
        ],
    );
    let child = PipelineDef::new(
        "payment",
        "1",
        [StepDef::task("pay", REQUEST)
            .timeout_secs(300)
            .retry(RetryPolicy::doubling(3, 1_000, 4_000))],
    );
    (parent, child)
}

/// Runs one simulated fan-out.
pub fn run(seed: u64, config: &FanOutConfig) -> FanOutReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(simulate(seed, config))
}

async fn simulate(seed: u64, config: &FanOutConfig) -> FanOutReport {
    let world: Shared = Arc::new(Mutex::new(World {
        rng: fastrand::Rng::with_seed(seed),
        queues: [LAUNCH, START, REPLY, REQUEST, SUMMARY, "dlq"]
            .into_iter()
            .map(|q| (q, VecDeque::new()))
            .collect(),
        dead: false,
        faults: false,
        config: config.clone(),
        report: FanOutReport {
            seed,
            ..Default::default()
        },
    }));
    let store = Arc::new(Store {
        inner: InMemoryExecutionStore::new(4),
        world: world.clone(),
        resolutions: AtomicU64::new(0),
        broken: config.broken_store,
        units: Mutex::default(),
        running: Mutex::default(),
        ended: Mutex::default(),
    });
    let ledger = Arc::new(Ledger {
        inner: InMemoryFanOutLedger::default(),
        world: world.clone(),
    });
    let payloads = Arc::new(InMemoryPayloadStore::default());
    let clock = Arc::new(SimClock {
        now: AtomicI64::new(1_800_000_000_000),
        next: AtomicU64::new(1),
    });
    let (parent_def, child_def) = pipelines(config);
    let definitions = [parent_def.clone(), child_def.clone()];
    let registry = Arc::new(InMemoryReleaseRegistry::activated(definitions, "sim").await);
    let claims = ClaimCheck::new(payloads.clone(), BUCKET, 32 * 1024);
    let coordinator = Arc::new(
        Coordinator::new(
            store.clone(),
            registry.clone(),
            Arc::new(Sender(world.clone())),
            clock.clone(),
            Settings {
                queues: crate::config::Queues {
                    launch: LAUNCH.into(),
                    reply: REPLY.into(),
                    awaits: REPLY.into(),
                    start: Some(START.into()),
                    execution_dlq: "dlq".into(),
                    launch_dlq: "dlq".into(),
                    reply_dlq: "dlq".into(),
                    start_dlq: Some("dlq".into()),
                },
                lease: std::time::Duration::from_secs(30),
                claim_limit: 100,
                instance: "sim".into(),
            },
        )
        .with_ledger(ledger.clone())
        .with_keys(Arc::new(crate::adapters::MemoryKeys::default()))
        .with_claim_check(claims.clone()),
    );
    let runs = Arc::new(AtomicU64::new(0));
    let references = Arc::new(Mutex::new(BTreeMap::new()));
    let identity = |def: &PipelineDef| Identity {
        pipeline_id: def.pipeline_id.clone(),
        contract_version: crate::domain::contract::Contract::of(def).contract_version,
        release_version: def.release_version.clone(),
    };
    let worker = Worker::new(
        identity(&child_def),
        Arc::new(Sender(world.clone())),
        Arc::new(Payments {
            failing_every: config.failing_every,
            first_attempt_only: config.redrive_failed,
            runs: runs.clone(),
            references: references.clone(),
        }),
    )
    .with_heartbeat(Heartbeat::Off)
    .with_dead_letter_queue("dlq");

    // The items: one JSON line per child.
    let lines: String = (0..config.children)
        .map(|n| format!("{{\"n\":{n}}}\n"))
        .collect();
    payloads
        .put(BUCKET, ITEMS_KEY, lines.into_bytes())
        .await
        .expect("items");
    // The parent is started by an event on the start queue, as the bus delivers it: its start (and
    // the children's, read from the object) runs under faults too.
    let start = StartEvent {
        id: format!("sim-{seed}"),
        detail_type: START_DETAIL_TYPE.into(),
        source: START_SOURCE.into(),
        detail: StartDetail {
            pipeline_id: parent_def.pipeline_id.clone(),
            tenant: "sim".into(),
            input: json!({"itemsFrom": {"bucket": BUCKET, "key": ITEMS_KEY, "format": "jsonl"}}),
            release_version: None,
            parent: None,
        },
    };
    let key = crate::domain::start_event_key(&start.id);
    let parent = crate::domain::idempotent_id("sim", &parent_def.pipeline_id, &key);
    {
        let mut w = world.lock().expect("world");
        let body = serde_json::to_string(&start).expect("a start event");
        w.queues
            .get_mut(START)
            .expect("start queue")
            .push_back(body);
        w.faults = true;
    }

    // Deliver until nothing is left anywhere, the sweeper running whenever the queues are empty.
    let mut idle_sweeps = 0;
    let mut redriven = std::collections::BTreeSet::new();
    loop {
        let next = {
            let mut w = world.lock().expect("world");
            let ready: Vec<&'static str> = w
                .queues
                .iter()
                .filter(|(q, m)| !matches!(**q, "dlq" | SUMMARY) && !m.is_empty())
                .map(|(q, _)| *q)
                .collect();
            if ready.is_empty() {
                None
            } else {
                let queue = ready[w.rng.usize(0..ready.len())];
                let size = w.rng.usize(1..=10);
                let mut batch = Vec::new();
                for _ in 0..size {
                    let len = w.queues[queue].len();
                    if len == 0 {
                        break;
                    }
                    let at = w.rng.usize(0..len.min(WINDOW));
                    let messages = w.queues.get_mut(queue).expect("queue");
                    messages.swap(0, at);
                    batch.extend(messages.pop_front());
                }
                Some((queue, batch))
            }
        };
        let Some((queue, batch)) = next else {
            // Nothing to deliver: done once the parent moved on; else the sweeper finds what crashes
            // left behind, at its due time.
            let moved_on = store
                .inner
                .snapshot(parent)
                .is_some_and(|r| r.status.is_terminal() || r.step > 0);
            // Children ended and their parent told (a notice lost in a crash is sent again by a
            // sweep).
            let children_ended = store.inner.count(open_child) == 0;
            if moved_on && children_ended || idle_sweeps > 50 {
                break;
            }
            // A lease later: what a crash left is due by then (a lease, a re-send check), or some
            // sweeps later (a step's deadline).
            idle_sweeps += 1;
            clock.now.fetch_add(31_000, Ordering::SeqCst);
            sweep(&coordinator, &world).await;
            continue;
        };
        idle_sweeps = 0;
        let mut event = SqsEvent::default();
        for (i, body) in batch.iter().enumerate() {
            let mut message = SqsMessage::default();
            message.message_id = Some(format!("m{i}"));
            message.body = Some(body.clone());
            message.event_source_arn = Some(format!("arn:aws:sqs:eu-west-1:0:{queue}"));
            event.records.push(message);
        }
        let cancel_now = {
            let mut w = world.lock().expect("world");
            w.report.invocations += 1;
            let before = w.report.deliveries;
            w.report.deliveries += batch.len() as u64;
            config
                .cancel_after
                .is_some_and(|at| before < at && at <= w.report.deliveries)
        };
        if cancel_now {
            let cancel = CancelRequest {
                execution_id: parent,
                reason: "operator cancel in the sim".into(),
            };
            let committed = coordinator.cancel(cancel).await.is_ok();
            let mut w = world.lock().expect("world");
            w.report.cancel_tried = true;
            w.report.cancel_committed = committed && !w.dead;
            w.dead = false;
        }
        let response = match queue {
            LAUNCH | START => crate::handlers::launch(&coordinator, event).await,
            REPLY => crate::handlers::completion(&coordinator, event).await,
            _ => worker.handle(event).await,
        };
        {
            let mut w = world.lock().expect("world");
            let failed: Vec<usize> = if w.dead {
                (0..batch.len()).collect()
            } else {
                response
                    .batch_item_failures
                    .iter()
                    .filter_map(|f| f.item_identifier.strip_prefix('m')?.parse().ok())
                    .collect()
            };
            w.dead = false;
            for i in failed {
                w.queues
                    .get_mut(queue)
                    .expect("queue")
                    .push_back(batch[i].clone());
            }
        }
        if config.redrive_failed {
            redrive_failed_children(&coordinator, &store.inner, &world, parent, &mut redriven)
                .await;
        }
    }

    let mut report = world.lock().expect("world").report.clone();
    report.resumptions = store.resolutions.load(Ordering::SeqCst);
    report.most_running = store.running.lock().expect("running").1;
    if let Some(window) = config.window {
        if report.most_running > u64::from(window) {
            report.violations.push(format!(
                "{} children ran at once, the window is {window}",
                report.most_running
            ));
        }
    }
    // Every write of the parent's item moved its version by one (created at version 1).
    report.parent_writes = store
        .inner
        .snapshot(parent)
        .map_or(0, |r| r.version.saturating_sub(1));
    report.step_runs = runs.load(Ordering::SeqCst);
    report.ledger_writes = ledger.inner.writes() as u64;
    // Each row is paid under one reference (its child's id) however often its step ran.
    {
        let references = references.lock().expect("bank");
        report.rows_paid = references.len() as u64;
        for (n, paid) in references.iter().filter(|(_, r)| r.len() > 1) {
            report
                .violations
                .push(format!("row {n} paid under {} references", paid.len()));
        }
    }
    check(
        &mut report,
        config,
        &store.inner,
        &ledger.inner,
        &claims,
        parent,
    )
    .await;
    report
}

/// A child not yet ended, or whose parent is not yet told.
/// An operator re-drives each child that failed while its parent still waits (once each; a re-drive
/// that crashed is tried again).
async fn redrive_failed_children(
    coordinator: &Coordinator,
    store: &InMemoryExecutionStore,
    world: &Shared,
    parent: Uuid,
    redriven: &mut std::collections::BTreeSet<Uuid>,
) {
    let waiting = store
        .snapshot(parent)
        .is_some_and(|r| r.status == Status::WaitingExternal && r.step == 0);
    if !waiting {
        return;
    }
    for child in store.find(|r| r.parent.is_some() && r.status == Status::Failed) {
        if !redriven.insert(child.id) {
            continue;
        }
        let request = RedriveRequest {
            execution_id: child.id,
            expected_version: child.version,
            reason: "operator re-drive while the parent waits".into(),
            release_version: None,
        };
        if coordinator.redrive(request).await.is_err() {
            redriven.remove(&child.id);
        }
        world.lock().expect("world").dead = false;
    }
}

fn open_child(record: &Execution) -> bool {
    record.parent.is_some() && (!record.status.is_terminal() || record.due_at().is_some())
}

async fn sweep(coordinator: &Coordinator, world: &Shared) {
    world.lock().expect("world").report.sweeps += 1;
    let _ = crate::handlers::claim(coordinator, EventBridgeEvent::default()).await;
    world.lock().expect("world").dead = false;
}

/// The checker: the parent resumed once, every child counted once, every end in the results.
async fn check(
    report: &mut FanOutReport,
    config: &FanOutConfig,
    store: &InMemoryExecutionStore,
    ledger: &InMemoryFanOutLedger,
    claims: &ClaimCheck,
    parent: Uuid,
) {
    let mut violations = Vec::new();
    let Some(record) = store.snapshot(parent) else {
        report
            .violations
            .push("the parent was never started".into());
        return;
    };
    report.status = Some(record.status);
    report.cancelled = record.status == Status::Cancelled;
    if report.cancelled && !report.cancel_tried {
        violations.push("the parent is CANCELLED, never cancelled".into());
    }
    if report.cancel_committed && !report.cancelled {
        violations.push(format!(
            "the parent is {} although its cancel was committed",
            record.status
        ));
    }
    let failing = config
        .children
        .checked_div(config.failing_every)
        .unwrap_or_default();
    let unit = record
        .await_unit
        .as_ref()
        .filter(|u| u.fan_out.is_some())
        .map(|u| (u.id, u.fan_out.expect("sized")));
    let Some((unit, fan_out)) = unit else {
        if !report.cancelled {
            violations.push("the fan-out was never sized".into());
        }
        report.violations.extend(violations);
        return;
    };
    if fan_out.items != config.children {
        violations.push(format!(
            "sized {} children, not {}",
            fan_out.items, config.children
        ));
    }
    let tally = ledger.tally(unit, fan_out.items).await.unwrap_or_default();
    report.tally = tally;
    // Every child ended (a cancel reaches those still running; a failed fan-out cancels its own).
    let open = store.count(open_child);
    if open > 0 {
        violations.push(format!("{open} children left running or due"));
    }
    let expect_success = failing <= config.tolerated;
    if report.cancelled {
        if report.resumptions > 1 {
            violations.push(format!("the parent resumed {} times", report.resumptions));
        }
    } else if expect_success {
        // Resumed at the summary step: its request went out (the sim's worker does not run it).
        if record.step != 1 || record.status != Status::Running {
            violations.push(format!(
                "the parent is {} at step {} ({:?}), not running the summary",
                record.status, record.step, record.error
            ));
        }
        // (Re-driven children that failed may have been counted as succeeded since.)
        let counted_once = if config.redrive_failed {
            tally.succeeded + tally.failed == config.children && tally.failed <= failing
        } else {
            tally
                == (Tally {
                    succeeded: config.children - failing,
                    failed: failing,
                })
        };
        if !counted_once {
            violations.push(format!("tally {tally:?}: some child was not counted once"));
        }
        // Claim-checked when large, as the next step's worker receives them.
        let results = claims
            .resolve(record.input.value()["results"].clone())
            .await;
        let results = results
            .ok()
            .and_then(|r| r.as_array().cloned())
            .unwrap_or_default();
        if results.len() != config.children as usize {
            violations.push(format!(
                "{} results for {} children",
                results.len(),
                config.children
            ));
        }
        let mut succeeded = 0;
        for (n, end) in results.iter().enumerate() {
            let planned_failure = config.failing_every > 0
                && n as u32 % config.failing_every == config.failing_every - 1;
            // A re-driven child's later success may have replaced its failure.
            let recovered =
                planned_failure && config.redrive_failed && end["status"] == "SUCCEEDED";
            let status = if planned_failure && !recovered {
                "FAILED"
            } else {
                "SUCCEEDED"
            };
            if end["item"] != n || end["status"] != status {
                violations.push(format!("result {n} is {end}"));
                break;
            }
            if status == "SUCCEEDED" {
                succeeded += 1;
                if end["result"] != json!({"paid": n}) {
                    violations.push(format!("result {n} holds {}", end["result"]));
                    break;
                }
            }
        }
        // (A re-driven child's end that came after its parent settled is counted in the ledger, not
        // in the results the parent moved on with.)
        if results.len() == config.children as usize
            && succeeded != tally.succeeded
            && !config.redrive_failed
        {
            violations.push(format!(
                "{succeeded} results succeeded, the ledger counted {}",
                tally.succeeded
            ));
        }
    } else if record.status != Status::Failed
        || record.error.as_ref().map(|e| e.code.as_str()) != Some("FAN_OUT_FAILED")
    {
        violations.push(format!(
            "the parent is {} ({:?}), not FAILED with FAN_OUT_FAILED",
            record.status, record.error
        ));
    }
    if report.resumptions != 1 && !report.cancelled {
        violations.push(format!("the parent resumed {} times", report.resumptions));
    }
    // Sized, children started, settled: a constant number, and a claim and its launch work for each
    // sweep (run when crashes left work unsent), however many children.
    if report.parent_writes > 8 + 2 * report.sweeps {
        violations.push(format!(
            "the parent's item was written {} times for {} children",
            report.parent_writes, config.children
        ));
    }
    report.violations.extend(violations);
}
