//! The emulator run behind P1-P3: a stage of the template provisioned on the emulator, the real
//! handlers behind the local runner on metered clients, a K-step pipeline whose worker answers at once,
//! and, in the same run, a bare SQS request/reply ping-pong through the same poller.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use futures_util::StreamExt;
use serde_json::{json, Value};
use serde_yaml_ng::Value as Yaml;
use stepline::adapters::SqsSender;
use stepline::contract::Contract;
use stepline::domain::{PipelineDef, StepError};
use stepline::envelope::RequestHeader;
use stepline::ports::{MessageSender, OutMessage};
use stepline::worker::StepFunction;
use stepline::{Coordinator, SubmitRequest};
use stepline_local::runner::SqsHandler;
use stepline_local::stack::SqsSource;
use stepline_local::{
    fresh_stage, functions, Binding, LocalStack, Runner, RunnerOptions, Template,
};
use uuid::Uuid;

use crate::meter::{Call, Invocation, Meter, TableInfo};

pub const PIPELINE_ID: &str = "bench";
const WORKER_QUEUE: &str = "OrderRequestQueue";

/// Shape of the workload.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Executions submitted together ([`SUBMITS_IN_FLIGHT`] at a time) for the sustained cost figures:
    /// the queues stay deep, so Lambda's pollers would return full batches.
    pub executions: usize,
    /// Executions submitted one after another for the light cost figure (0: none): batches carry
    /// what arrived since the last poll.
    pub light: usize,
    /// Steps per execution.
    pub steps: usize,
    /// Bytes of each step's output (and so of the next step's input).
    pub payload_bytes: usize,
    /// Executions run one at a time for the latency and critical-path figures.
    pub sequential: usize,
    /// Executions run together, each beside a bare chain of as many round trips, for hop latency at
    /// sustained load (0: none).
    pub loaded: usize,
    /// Times the `loaded` executions are run together, one round after another: more hops at the same
    /// load, so that a p99 is not the second-slowest of a few hundred.
    pub loaded_rounds: usize,
    /// Publish lifecycle events (the template's LifecycleEvents parameter).
    pub lifecycle_events: bool,
    /// Completion instances (each a coordinator with its own cache) the reply queue's batches are
    /// spread over; launches and submits run in instances of their own.
    pub completions: usize,
}

/// Submissions in flight at once in the sustained run.
pub const SUBMITS_IN_FLIGHT: usize = 32;

/// The bench pipeline: `steps` task steps on the example worker's queue, each with the example's
/// timeout and retry policy, passing one document on.
pub fn pipeline(queue: &str, steps: usize) -> PipelineDef {
    let example = order_worker::pipeline(queue).steps.remove(0);
    PipelineDef::new(
        PIPELINE_ID,
        format!("k{steps}"),
        (0..steps).map(|i| {
            example
                .clone()
                .renamed(format!("s{i}"))
                .types("bench.Doc/1", "bench.Doc/1")
        }),
    )
}

/// When each step ran, per execution: (step index, handler entered, handler returned), in microseconds.
type StepTimes = Arc<Mutex<HashMap<Uuid, Vec<(u32, u64, u64)>>>>;

/// A worker that answers at once with a payload of the configured size, noting when it ran.
struct EchoSteps {
    meter: Meter,
    payload_bytes: usize,
    times: StepTimes,
}

#[async_trait]
impl StepFunction for EchoSteps {
    async fn run(&self, request: &RequestHeader, _input: Value) -> Result<Value, StepError> {
        let entered = self.meter.now_us();
        let output = json!({"step": request.step_index, "doc": "x".repeat(self.payload_bytes)});
        self.times
            .lock()
            .unwrap()
            .entry(request.execution_id)
            .or_default()
            .push((request.step_index, entered, self.meter.now_us()));
        Ok(output)
    }
}

/// The calls and invocations of one run, and the step transitions it made.
pub struct Recorded {
    pub calls: Vec<Call>,
    pub invocations: Vec<Invocation>,
    pub steps: u64,
}

impl Recorded {
    fn new((calls, invocations): (Vec<Call>, Vec<Invocation>), steps: usize) -> Self {
        Self {
            calls,
            invocations,
            steps: steps as u64,
        }
    }
}

/// What the run measured.
pub struct Measured {
    /// The sustained run (P1).
    pub cost: Recorded,
    /// The light run.
    pub light: Recorded,
    /// Calls and invocations of the sequential run (P2), and its step hops (P3), in microseconds.
    pub sequential_calls: Vec<Call>,
    pub hops_us: Vec<u64>,
    /// Bare SQS request/reply round trips, in microseconds.
    pub ping_pong_us: Vec<u64>,
    /// Messages per completion invocation in the sequential run.
    pub sequential_batch_mean: f64,
    /// P3 at sustained load: the step hops of executions submitted together, the round trips of as
    /// many bare chains run beside them, and the messages per completion invocation meanwhile.
    pub sustained_hops_us: Vec<u64>,
    pub sustained_ping_pong_us: Vec<u64>,
    pub sustained_batch_mean: f64,
    /// Queue URLs consumed by coordinator functions and by workers.
    pub coordinator_queues: Vec<String>,
    pub worker_queues: Vec<String>,
    /// Memory size of each function, from the template.
    pub memory_mb: BTreeMap<String, u32>,
}

/// Template function names and the names the meter attributes their work to (`api` is the submit).
pub const FUNCTION_NAMES: [(&str, &str); 7] = [
    (functions::CLAIM, "claim"),
    (functions::LAUNCH, "launch"),
    (functions::COMPLETION, "completion"),
    ("ApiFunction", "api"),
    (functions::ORDER_WORKER, "worker"),
    ("CsvWorkerFunction", "worker"),
    ("PaymentWorkerFunction", "worker"),
];

fn short_name(function: &str) -> &'static str {
    FUNCTION_NAMES
        .iter()
        .find(|(f, _)| *f == function)
        .map_or("other", |(_, n)| n)
}

/// Wraps a binding so each invocation is metered as one Lambda invocation.
pub(crate) fn metered(meter: &Meter, binding: Binding) -> Binding {
    let wrap = |name: &'static str, handler: SqsHandler| -> SqsHandler {
        let meter = meter.clone();
        Arc::new(move |event: SqsEvent| {
            let meter = meter.clone();
            let handler = handler.clone();
            let records = event.records.len();
            Box::pin(async move { meter.invoke(name, records, handler(event)).await })
        })
    };
    match binding {
        Binding::Sqs { function, handler } => {
            let name = short_name(&function);
            Binding::Sqs {
                function,
                handler: wrap(name, handler),
            }
        }
        Binding::Queue { source, handler } => Binding::Queue {
            source,
            handler: wrap("ping-pong", handler),
        },
        Binding::Schedule { function, handler } => {
            let meter = meter.clone();
            let name = short_name(&function);
            Binding::Schedule {
                function,
                handler: Arc::new(move |event| {
                    let meter = meter.clone();
                    let handler = handler.clone();
                    Box::pin(async move { meter.invoke(name, 0, handler(event)).await })
                }),
            }
        }
    }
}

/// Wraps the sweeper's schedule so that its runs are skipped while `hold` is held for writing (and a
/// run under way holds off the writer until it has returned).
fn held(hold: &Arc<tokio::sync::RwLock<()>>, binding: Binding) -> Binding {
    match binding {
        Binding::Schedule { function, handler } => {
            let hold = hold.clone();
            Binding::Schedule {
                function,
                handler: Arc::new(move |event| {
                    let (hold, handler) = (hold.clone(), handler.clone());
                    Box::pin(async move {
                        if let Ok(_running) = hold.try_read() {
                            handler(event).await;
                        }
                    })
                }),
            }
        }
        other => other,
    }
}

/// A fresh stage of the template (with `params`) whose clients carry a meter, and an observer
/// coordinator on its own, unmetered clients (its polls and submissions are not the stack's work).
pub async fn metered_stage(
    prefix: &str,
    params: &BTreeMap<String, String>,
    template: &Template,
) -> Result<(LocalStack, Meter, Coordinator)> {
    let local = LocalStack::up_with(&fresh_stage(prefix), params).await?;
    let meter = Meter::new(table_infos(&local, template));
    let clients = meter.clients(&local.sdk);
    let local = local.with_clients(clients);
    let observer = stepline::aws::coordinator(
        &local.sdk,
        &stepline::config::CoordinatorConfig::from_lookup(local.stack.env_of(functions::REDRIVE)?)?,
    );
    Ok((local, meter, observer))
}

/// Key attributes of each table of the stack (and of its indexes), from the template.
pub fn table_infos(local: &LocalStack, template: &Template) -> HashMap<String, TableInfo> {
    let keys = |schema: Option<&Yaml>| -> Vec<String> {
        schema
            .and_then(Yaml::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(|k| Some(k.get("AttributeName")?.as_str()?.to_string()))
            .collect()
    };
    let mut tables = HashMap::new();
    for (logical, kind, props) in template.resources() {
        let Ok(name) = local.stack.table(&logical) else {
            continue;
        };
        if kind != "AWS::DynamoDB::Table" {
            continue;
        }
        let indexes = props
            .get("GlobalSecondaryIndexes")
            .and_then(Yaml::as_sequence)
            .into_iter()
            .flatten()
            .map(|gsi| keys(gsi.get("KeySchema")))
            .collect();
        tables.insert(
            name.to_string(),
            TableInfo {
                key: keys(props.get("KeySchema")),
                indexes,
            },
        );
    }
    tables
}

/// Memory size of every function: its own `MemorySize`, else the template's global one.
pub fn memory_sizes(template: &Template) -> BTreeMap<String, u32> {
    template
        .resources()
        .into_iter()
        .filter(|(_, kind, _)| kind == "AWS::Serverless::Function")
        .map(|(logical, _, _)| {
            let mb = template
                .function_property(&logical, "MemorySize")
                .as_ref()
                .and_then(Yaml::as_u64)
                .unwrap_or(128);
            (logical, mb as u32)
        })
        .collect()
}

/// Runs the workload on the emulator `AWS_ENDPOINT_URL` points at.
pub async fn run(work: Workload) -> Result<Measured> {
    anyhow::ensure!(
        std::env::var_os("AWS_ENDPOINT_URL").is_some(),
        "AWS_ENDPOINT_URL is not set: start the emulator (infra/emulator.sh) or use infra/bench.sh"
    );
    let template = Template::load(&Template::default_path())?;
    let params = [(
        "LifecycleEvents".to_string(),
        work.lifecycle_events.to_string(),
    )]
    .into();
    let (local, meter, observer) = metered_stage("bench", &params, &template).await?;
    let api = local.operator()?;
    let (queue, _) = local.stack.queue(WORKER_QUEUE)?;
    let mut def = pipeline(queue, work.steps);
    // The worker function serves the release its environment names.
    def.release_version =
        stepline::config::WorkerConfig::from_lookup(local.stack.env_of(functions::ORDER_WORKER)?)?
            .release_version;
    local.release(def.clone(), Vec::new()).await?;

    let times: StepTimes = Arc::default();
    let steps = Arc::new(EchoSteps {
        meter: meter.clone(),
        payload_bytes: work.payload_bytes,
        times: times.clone(),
    });
    let mut bindings = local.coordinator_bindings_with(work.completions)?;
    bindings.push(local.worker_binding(functions::ORDER_WORKER, &Contract::of(&def), steps)?);

    // Bare request/reply: a "worker" queue and a "reply" queue served by the same poller.
    let sqs = local.clients.sqs.clone();
    let ping = plain_queue(&sqs, &format!("{}-ping", local.stack.stage)).await?;
    let pong = plain_queue(&sqs, &format!("{}-pong", local.stack.stage)).await?;
    let arrivals: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let departures: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let sender = Arc::new(SqsSender::new(sqs.clone()));
    bindings.push(Binding::Queue {
        source: ping.clone(),
        handler: bouncer(
            sender.clone(),
            pong.queue_url.clone(),
            meter.clone(),
            Some((arrivals.clone(), departures.clone())),
        ),
    });
    bindings.push(Binding::Queue {
        source: pong.clone(),
        handler: bouncer(sender.clone(), ping.queue_url.clone(), meter.clone(), None),
    });
    // The claim sweeper on the template's schedule, as deployed: a sweep queries every due-index
    // shard, and on this emulator a Query over an index reads the whole table, so sweeping every
    // second (the tests' pace) would load it with work a deployment does not do. For the same reason
    // it is held off while hops are timed: one sweep stalls every other call to the emulator for
    // seconds, which DynamoDB's Queries do not do to other clients.
    let sweeps = Arc::new(tokio::sync::RwLock::new(()));
    let bindings = bindings
        .into_iter()
        .map(|b| held(&sweeps, metered(&meter, b)))
        .collect();
    let _runner = Runner::start(
        sqs.clone(),
        &local.stack,
        bindings,
        RunnerOptions {
            tick: crate::recovery::claim_period(&template)?,
            pollers: 2,
        },
    )?;

    // P1, light: executions submitted one after another; each batch carries what arrived since the
    // last poll.
    meter.take();
    let mut ids = Vec::new();
    for n in 0..work.light {
        ids.push(submit(&meter, &api, n, work.payload_bytes).await?);
    }
    // The emulator runs a few hundred steps a second: leave room for the full mode's long runs.
    let limit =
        |executions: usize| Duration::from_secs(300.max((executions * work.steps / 10) as u64));
    wait_all(&observer, &ids, limit(work.light)).await?;
    let light = Recorded::new(meter.take(), work.light * work.steps);

    // P1, sustained: executions submitted together, so every queue stays deep and batches fill.
    let sustained = together(work.executions, |n| {
        submit(&meter, &api, work.light + n, work.payload_bytes)
    })
    .await?;
    wait_all(&observer, &sustained, limit(work.executions)).await?;
    ids.extend(sustained);
    let cost = Recorded::new(meter.take(), work.executions * work.steps);

    // P3 at sustained load: executions submitted together, each beside a bare chain of as many round
    // trips, so both see the same queues, the same full batches and the same emulator. As many as
    // keep the batches full without a backlog: in a backlog a hop measures the queue's depth.
    let hops_per_execution = work.steps.saturating_sub(1).max(1) as u64;
    let timing = sweeps.write().await;
    let chain_of = |n: usize| {
        let first = SUSTAINED_CHAINS + n as u64 * 1_000;
        first..first + hops_per_execution
    };
    let (mut loaded, mut chains) = (Vec::new(), Vec::new());
    for round in 0..work.loaded_rounds {
        let first = round * work.loaded;
        let these = together(work.loaded, |n| {
            let (api, sender, ping, meter) = (&api, &sender, &ping.queue_url, &meter);
            async move {
                start_chain(sender, ping, &chain_of(first + n)).await;
                submit(meter, api, first + n, work.payload_bytes).await
            }
        })
        .await?;
        wait_all(&observer, &these, limit(work.loaded)).await?;
        let these_chains: Vec<_> = (first..first + work.loaded).map(chain_of).collect();
        wait_chains(&arrivals, &these_chains, limit(work.loaded)).await?;
        loaded.extend(these);
        chains.extend(these_chains);
    }
    let sustained_hops_us = hops_of(&times, &loaded, false);
    let sustained_ping_pong_us = round_trips(&arrivals, &departures, &chains);
    ids.extend(loaded);
    let sustained_batch_mean = completion_batch_mean(&meter.take().1);

    // P2 and P3: one execution at a time, so every completion handles exactly one reply. Each is
    // followed by as many bare round trips (P3's baseline), so both see the same conditions.
    let mut chains = Vec::new();
    for n in 0..work.sequential {
        let id = submit(&meter, &api, n, work.payload_bytes).await?;
        // Watch the worker, not the table: reading the record while it runs would load the emulator
        // during the very hops being timed.
        let last_step = work.steps.saturating_sub(1) as u32;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !times
            .lock()
            .unwrap()
            .get(&id)
            .is_some_and(|runs| runs.iter().any(|r| r.0 == last_step))
        {
            if Instant::now() > deadline {
                bail!("execution {id} did not reach its last step");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        wait_all(&observer, &[id], Duration::from_secs(30)).await?;
        let first = n as u64 * 1_000;
        let chain = first..first + hops_per_execution;
        start_chain(&sender, &ping.queue_url, &chain).await;
        wait_chains(
            &arrivals,
            std::slice::from_ref(&chain),
            Duration::from_secs(30),
        )
        .await?;
        chains.push(chain);
    }
    drop(timing);
    let (sequential_calls, sequential_invocations) = meter.take();
    let sequential_batch_mean = completion_batch_mean(&sequential_invocations);
    // Only executions of the sequential run count: the concurrent ones queued behind each other.
    let sequential_hops = hops_of(&times, &ids, true);
    let ping_pong_us = round_trips(&arrivals, &departures, &chains);

    let queues_of = |names: &[&str]| -> Vec<String> {
        names
            .iter()
            .filter_map(|f| local.stack.function(f).ok())
            .flat_map(|f| f.sqs.iter().map(|s| s.queue_url.clone()))
            .collect()
    };
    Ok(Measured {
        cost,
        light,
        sequential_calls,
        hops_us: sequential_hops,
        ping_pong_us,
        sequential_batch_mean,
        sustained_hops_us,
        sustained_ping_pong_us,
        sustained_batch_mean,
        coordinator_queues: queues_of(&[functions::LAUNCH, functions::COMPLETION]),
        worker_queues: queues_of(&[functions::ORDER_WORKER]),
        memory_mb: memory_sizes(&template),
    })
}

/// Step hops (a step's handler returning to the next step's handler being entered) of the executions
/// in `ids` (or of all others, when `exclude`).
fn hops_of(times: &StepTimes, ids: &[Uuid], exclude: bool) -> Vec<u64> {
    let times = times.lock().unwrap();
    let mut hops = Vec::new();
    for (id, runs) in times.iter() {
        if ids.contains(id) == exclude {
            continue;
        }
        let mut runs = runs.clone();
        runs.sort();
        for pair in runs.windows(2) {
            if pair[1].0 == pair[0].0 + 1 {
                hops.push(pair[1].1.saturating_sub(pair[0].2));
            }
        }
    }
    hops
}

/// Where the bare chains of the sustained latency run start numbering their messages (the sequential
/// run's chains number from 0, a thousand apart).
const SUSTAINED_CHAINS: u64 = 1 << 40;

/// Messages per completion invocation (0 when there was none).
fn completion_batch_mean(invocations: &[Invocation]) -> f64 {
    crate::analysis::batch_mean(invocations, &["completion"])
}

/// Runs `submit(n)` for every `n` below `count`, [`SUBMITS_IN_FLIGHT`] at a time, as concurrent API
/// calls; the ids in the order they were returned.
async fn together<F>(count: usize, submit: impl Fn(usize) -> F) -> Result<Vec<Uuid>>
where
    F: std::future::Future<Output = Result<Uuid>>,
{
    futures_util::stream::iter(0..count)
        .map(submit)
        .buffer_unordered(SUBMITS_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Starts a bare chain: its first message, numbered `chain.start`, passed on until `chain.end`.
async fn start_chain(sender: &SqsSender, ping: &str, chain: &std::ops::Range<u64>) {
    let start = json!({"seq": chain.start, "last": chain.end}).to_string();
    sender.send(ping, &[OutMessage::new(start)]).await;
}

/// Waits until the last round trip of every chain has arrived.
async fn wait_chains(
    arrivals: &Marks,
    chains: &[std::ops::Range<u64>],
    limit: Duration,
) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let left = {
            let arrivals = arrivals.lock().unwrap();
            chains
                .iter()
                .filter(|c| !arrivals.contains_key(&c.end))
                .count()
        };
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{left} chains of bare round trips did not finish in {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The round trips of `chains`: from each message's departure to the arrival of the next.
fn round_trips(arrivals: &Marks, departures: &Marks, chains: &[std::ops::Range<u64>]) -> Vec<u64> {
    let arrivals = arrivals.lock().unwrap();
    let departures = departures.lock().unwrap();
    chains
        .iter()
        .cloned()
        .flatten()
        .filter_map(|seq| Some(arrivals.get(&(seq + 1))? - departures.get(&seq)?))
        .collect()
}

async fn submit(meter: &Meter, api: &Coordinator, n: usize, payload_bytes: usize) -> Result<Uuid> {
    let request = SubmitRequest {
        pipeline_id: PIPELINE_ID.into(),
        tenant: "bench".into(),
        input: json!({"n": n, "doc": "x".repeat(payload_bytes)}),
        ..Default::default()
    };
    Ok(meter.invoke("api", 1, api.submit(request)).await?.execution)
}

/// Waits until every execution of `ids` has succeeded. The observer reads in submission order and
/// stops at the first one still running: reading every pending record on every round would load the
/// emulator (and so every handler's measured duration) with work no deployment does.
async fn wait_all(observer: &Coordinator, ids: &[Uuid], limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut pending = ids.iter().copied().peekable();
    while let Some(&id) = pending.peek() {
        let record = observer.get(id).await?;
        if record.status.is_terminal() {
            anyhow::ensure!(
                record.status == stepline::domain::Status::Succeeded,
                "execution {id} ended {:?}: {:?}",
                record.status,
                record.error
            );
            pending.next();
            continue;
        }
        if Instant::now() > deadline {
            bail!("{} executions did not finish in {limit:?}", pending.count());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn plain_queue(sqs: &aws_sdk_sqs::Client, name: &str) -> Result<SqsSource> {
    let (url, arn) = stepline_local::stack::create_plain_queue(sqs, name).await?;
    Ok(SqsSource {
        queue: name.into(),
        queue_url: url,
        queue_arn: arn,
        batch_size: 10,
    })
}

type Marks = Arc<Mutex<HashMap<u64, u64>>>;

/// A handler that passes each `{"seq": n}` message on to `to` (as `n + 1` when it notes marks, i.e. on
/// the "worker" side), noting when each arrived and when it was passed on; it stops after `last`.
fn bouncer(
    sender: Arc<SqsSender>,
    to: String,
    meter: Meter,
    marks: Option<(Marks, Marks)>,
) -> SqsHandler {
    Arc::new(move |event: SqsEvent| {
        let (sender, to, meter, marks) = (sender.clone(), to.clone(), meter.clone(), marks.clone());
        Box::pin(async move {
            let mut out = Vec::new();
            for record in event.records {
                let body: Value = serde_json::from_str(record.body.as_deref().unwrap_or("{}"))
                    .unwrap_or_default();
                let (seq, last) = (
                    body["seq"].as_u64().unwrap_or(0),
                    body["last"].as_u64().unwrap_or(0),
                );
                let next = match &marks {
                    Some((arrivals, departures)) => {
                        arrivals.lock().unwrap().insert(seq, meter.now_us());
                        if seq >= last {
                            continue;
                        }
                        departures.lock().unwrap().insert(seq, meter.now_us());
                        seq + 1
                    }
                    None => seq,
                };
                out.push(OutMessage::new(
                    json!({"seq": next, "last": last}).to_string(),
                ));
            }
            // One batched send per invocation, as the coordinator's handlers send.
            if !out.is_empty() {
                sender.send(&to, &out).await;
            }
            SqsBatchResponse::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_held_schedule_skips_its_runs_and_a_run_under_way_holds_off_the_timing() {
        let runs = Arc::new(AtomicUsize::new(0));
        let (started, finish) = (
            Arc::new(tokio::sync::Notify::new()),
            Arc::new(tokio::sync::Notify::new()),
        );
        let handler: stepline_local::runner::ScheduleHandler = {
            let (runs, started, finish) = (runs.clone(), started.clone(), finish.clone());
            Arc::new(move |_| {
                let (runs, started, finish) = (runs.clone(), started.clone(), finish.clone());
                Box::pin(async move {
                    started.notify_one();
                    finish.notified().await;
                    runs.fetch_add(1, Ordering::SeqCst);
                })
            })
        };
        let hold = Arc::new(tokio::sync::RwLock::new(()));
        let Binding::Schedule { handler, .. } = held(
            &hold,
            Binding::Schedule {
                function: functions::CLAIM.into(),
                handler,
            },
        ) else {
            panic!("a schedule stays a schedule");
        };
        let event = stepline_local::runner::scheduled_event;
        let within = |what: &'static str| {
            let started = started.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(10), started.notified())
                    .await
                    .unwrap_or_else(|_| panic!("{what}"))
            }
        };

        // A run under way: the timing waits for it to return.
        let run = tokio::spawn(handler(event()));
        within("a tick runs while nothing holds the schedule").await;
        let timing = tokio::spawn({
            let hold = hold.clone();
            async move { drop(hold.write().await) }
        });
        tokio::task::yield_now().await;
        assert!(!timing.is_finished(), "the run holds off the timing");
        finish.notify_one();
        run.await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), timing)
            .await
            .expect("the timing goes on once the run has returned")
            .unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        // While held, a tick returns at once without running.
        let timing = hold.write().await;
        // (A run would wait for `finish`, which nothing notifies here.)
        let skipped = tokio::time::timeout(Duration::from_secs(10), handler(event())).await;
        assert!(skipped.is_ok(), "the tick returns at once while held");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "skipped while held");
        drop(timing);
        let run = tokio::spawn(handler(event()));
        within("a tick runs again once the timing is over").await;
        finish.notify_one();
        run.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2, "runs again once released");
    }
}
