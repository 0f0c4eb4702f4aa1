//! Recovery under a backlog, on the emulator. The workers were down: every execution's first step timed
//! out, and the claim sweeper has to take them all back. Sweeps run one after another, each given the
//! claim function's timeout as its invocation's deadline, with a clock ten minutes ahead so every step
//! deadline has passed. Then a shard whose head is items no claim can decode, with good executions
//! behind them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Serialize;
use serde_yaml_ng::Value as Yaml;
use stepline::adapters::dynamodb::due_shard;
use stepline::config::CoordinatorConfig;
use stepline::envelope::LaunchWork;
use stepline::handlers;

use stepline::{ClaimReport, Coordinator, SubmitRequest};
use stepline_local::runner::scheduled_event;
use stepline_local::{fresh_stage, functions, LocalStack, ShiftedClock, Template};
use tokio::task::JoinSet;
use uuid::Uuid;

/// How far ahead of the wall clock the sweeps run: past every step deadline of the example pipeline.
const AHEAD: Duration = Duration::from_secs(600);
/// Submits and reads in flight at once: a busy API, without swamping the emulator.
const IN_FLIGHT: usize = 16;
const WORKER_QUEUE: &str = "OrderRequestQueue";
const LAUNCH_QUEUE: &str = "LaunchQueue";

/// One sweep: its report, how long it took, and how far from its deadline it returned.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    pub report: ClaimReport,
    pub wall_ms: f64,
    /// Deadline minus the time it returned (negative: it ran past its invocation's timeout).
    pub margin_ms: i64,
    /// Launch work found on the launch queue once it returned.
    pub launched: usize,
}

/// The claim sweeper as the template deploys it: how often it runs and how long a run may last.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Schedule {
    pub period_s: f64,
    pub timeout_ms: i64,
}

impl Schedule {
    pub fn of(template: &Template) -> Result<Self> {
        Ok(Self {
            period_s: claim_period(template)?.as_secs_f64(),
            timeout_ms: claim_timeout_ms(template)?,
        })
    }
}

/// The sweeper's figures: a backlog's recovery and a shard headed by poison items (recovery.json).
#[derive(Debug, Clone, Serialize)]
pub struct Recovery {
    pub emulator: String,
    pub backlog: Backlog,
    pub poison: Poison,
    pub elapsed_s: f64,
}

/// The backlog scenario's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Backlog {
    pub executions: usize,
    /// Each sweep's deadline after its start: the claim function's timeout.
    pub budget_ms: i64,
    /// Seconds between sweeps on the template's schedule.
    pub claim_period_s: f64,
    pub shards: u32,
    pub claim_limit: i32,
    pub submit_s: f64,
    pub sweeps: Vec<Sweep>,
    pub claimed_per_sweep_mean: f64,
    /// Time spent sweeping, back to back.
    pub sweeping_s: f64,
    /// From the first sweep's start to the last one's return, the launch queue's draining included.
    pub elapsed_s: f64,
    /// On the template's schedule: the sweeps before the last one a period apart, then the last one.
    pub scheduled_s: f64,
    pub all_before_deadline: bool,
    pub min_margin_ms: i64,
    /// Executions found with a lease taken (generation > 0) once the sweeps were done.
    pub leased: usize,
}

impl Backlog {
    /// Executions recovered per second of sweeping, the sweeps back to back.
    pub fn recovered_per_s(&self) -> f64 {
        self.executions as f64 / self.sweeping_s.max(0.001)
    }
}

/// The poison scenario's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Poison {
    pub poison: usize,
    pub shard: String,
    /// Good due executions submitted, and those of them in the poison's shard.
    pub good: usize,
    pub good_in_shard: usize,
    pub first: Sweep,
    /// Good executions of the poison's shard leased after the first sweep.
    pub good_in_shard_leased: usize,
    /// Poison items whose index entry the first sweep moved later.
    pub pushed_back: usize,
    pub second: Sweep,
}

/// The claim function's timeout in milliseconds: its own `Timeout`, else the template's global one.
pub fn claim_timeout_ms(template: &Template) -> Result<i64> {
    let seconds = template
        .function_property(functions::CLAIM, "Timeout")
        .as_ref()
        .and_then(Yaml::as_u64)
        .context("the template gives the claim function no Timeout")?;
    Ok(seconds as i64 * 1000)
}

/// The claim function's schedule, from the template: its `Schedule` event's `rate(N unit)`.
pub fn claim_period(template: &Template) -> Result<std::time::Duration> {
    let events = template
        .function_property(functions::CLAIM, "Events")
        .context("the template gives the claim function no Events")?;
    let rate = events
        .as_mapping()
        .into_iter()
        .flatten()
        .filter(|(_, event)| event.get("Type").and_then(Yaml::as_str) == Some("Schedule"))
        .find_map(|(_, event)| event.get("Properties")?.get("Schedule")?.as_str())
        .context("the claim function has no Schedule event")?;
    parse_rate(rate)
}

/// Seconds of an EventBridge `rate(N unit)` expression.
fn parse_rate(expression: &str) -> Result<std::time::Duration> {
    let inner = expression
        .trim()
        .strip_prefix("rate(")
        .and_then(|r| r.strip_suffix(')'))
        .with_context(|| format!("not a rate expression: {expression}"))?;
    let (count, unit) = inner
        .split_once(' ')
        .with_context(|| format!("not a rate expression: {expression}"))?;
    let count: u64 = count.trim().parse()?;
    let unit_s = match unit.trim().trim_end_matches('s') {
        "minute" => 60,
        "hour" => 3_600,
        "day" => 86_400,
        other => bail!("unknown rate unit {other} in {expression}"),
    };
    Ok(std::time::Duration::from_secs(count * unit_s))
}

/// A fresh stage with the example pipeline released, and the claim function's configuration.
async fn stage(prefix: &str) -> Result<(LocalStack, Coordinator, String, CoordinatorConfig)> {
    ensure!(
        std::env::var_os("AWS_ENDPOINT_URL").is_some(),
        "AWS_ENDPOINT_URL is not set: start the emulator (infra/emulator.sh) or use infra/bench.sh"
    );
    let local = LocalStack::up(&fresh_stage(prefix)).await?;
    let api = local.operator()?;
    let (queue, _) = local.stack.queue(WORKER_QUEUE)?;
    let release = local.release_example(queue, "1", 60).await?;
    let config = CoordinatorConfig::from_lookup(local.stack.env_of(functions::CLAIM)?)?;
    Ok((local, api, release.pipeline_id, config))
}

/// Submits `count` executions of the example pipeline, `IN_FLIGHT` at a time.
async fn submit_many(api: &Arc<Coordinator>, pipeline: &str, count: usize) -> Result<Vec<Uuid>> {
    let mut ids = Vec::with_capacity(count);
    let mut tasks = JoinSet::new();
    for n in 0..count {
        if tasks.len() >= IN_FLIGHT {
            ids.push(tasks.join_next().await.context("a submit")???);
        }
        let (api, pipeline) = (api.clone(), pipeline.to_string());
        tasks.spawn(async move {
            let request = SubmitRequest {
                pipeline_id: pipeline,
                tenant: "bench".into(),
                input: order(n),
                ..Default::default()
            };
            Ok::<_, anyhow::Error>(api.submit(request).await?.execution)
        });
    }
    while let Some(id) = tasks.join_next().await {
        ids.push(id??);
    }
    Ok(ids)
}

/// An order as the example worker's first step expects it.
fn order(n: usize) -> serde_json::Value {
    serde_json::json!({
        "orderId": format!("order-{n}"),
        "lines": [
            {"sku": "espresso", "qty": 1 + n % 3, "unitCents": 250},
            {"sku": "croissant", "qty": 1, "unitCents": 320}
        ]
    })
}

/// Executions of `ids` with a lease taken.
async fn leased(api: &Arc<Coordinator>, ids: &[Uuid]) -> Result<usize> {
    let mut count = 0;
    let mut tasks = JoinSet::new();
    for id in ids.iter().copied() {
        if tasks.len() >= IN_FLIGHT {
            count += usize::from(tasks.join_next().await.context("a read")???);
        }
        let api = api.clone();
        tasks.spawn(async move { Ok::<_, anyhow::Error>(api.get(id).await?.generation > 0) });
    }
    while let Some(taken) = tasks.join_next().await {
        count += usize::from(taken??);
    }
    Ok(count)
}

/// One sweep with a deadline `budget_ms` after its start; the launch work it sent is drained and
/// checked against what it claimed, and returned.
async fn sweep(
    claim: &Coordinator,
    local: &LocalStack,
    budget_ms: i64,
) -> Result<(Sweep, Vec<LaunchWork>)> {
    let deadline = claim.now() + Duration::from_millis(budget_ms.max(0) as u64);
    let started = Instant::now();
    let report = handlers::claim_within(claim, scheduled_event(), Some(deadline)).await?;
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    // Negative when the sweep ran past its deadline.
    let margin_ms = deadline.millis() - claim.now().millis();
    let work = local
        .take_all(LAUNCH_QUEUE)
        .await?
        .iter()
        .map(|body| serde_json::from_str::<LaunchWork>(body))
        .collect::<Result<Vec<_>, _>>()?;
    ensure!(
        work.len() == report.claimed,
        "{} claimed but {} launches sent: {report:?}",
        report.claimed,
        work.len()
    );
    let sweep = Sweep {
        report,
        wall_ms,
        margin_ms,
        launched: work.len(),
    };
    Ok((sweep, work))
}

/// Submits `executions` with no worker running, drains their requests, and sweeps until every one is
/// claimed and its launch work sent, each sweep bounded by the schedule's timeout.
pub async fn backlog(executions: usize, schedule: Schedule) -> Result<Backlog> {
    let budget_ms = schedule.timeout_ms;
    let (local, api, pipeline, config) = stage("bench-backlog").await?;
    let api = Arc::new(api);
    let submitted = Instant::now();
    let ids = submit_many(&api, &pipeline, executions).await?;
    let submit_s = submitted.elapsed().as_secs_f64();
    let requests = local.take_all(WORKER_QUEUE).await?.len();
    ensure!(
        requests == executions,
        "{requests} first-step requests for {executions} executions"
    );

    let claim =
        stepline::aws::coordinator_on(&local.clients, &config, Arc::new(ShiftedClock(AHEAD)));
    let wanted: HashSet<Uuid> = ids.iter().copied().collect();
    let mut launched: HashSet<Uuid> = HashSet::new();
    let mut sweeps: Vec<Sweep> = Vec::new();
    let started = Instant::now();
    while launched.len() < executions {
        let (done, work) = sweep(&claim, &local, budget_ms).await?;
        for w in work {
            ensure!(
                w.generation > 0 && wanted.contains(&w.execution_id),
                "unexpected launch work {w:?}"
            );
            ensure!(
                launched.insert(w.execution_id),
                "{} launched twice",
                w.execution_id
            );
        }
        eprintln!(
            "sweep {}: claimed {} in {} pages, stopped early {}, {:.0} ms, {} ms before its deadline",
            sweeps.len() + 1,
            done.report.claimed,
            done.report.pages,
            done.report.stopped_early,
            done.wall_ms,
            done.margin_ms
        );
        sweeps.push(done);
        if sweeps.len() >= 3 && sweeps.iter().rev().take(3).all(|s| s.report.claimed == 0) {
            bail!("three sweeps in a row claimed nothing with a backlog left: {sweeps:?}");
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    let sweeping_s = sweeps.iter().map(|s| s.wall_ms).sum::<f64>() / 1e3;
    let last_s = sweeps.last().map_or(0.0, |s| s.wall_ms / 1e3);
    Ok(Backlog {
        executions,
        budget_ms,
        claim_period_s: schedule.period_s,
        shards: config.due_shards,
        claim_limit: config.claim_limit,
        submit_s,
        claimed_per_sweep_mean: executions as f64 / sweeps.len() as f64,
        sweeping_s,
        elapsed_s,
        scheduled_s: (sweeps.len() - 1) as f64 * schedule.period_s + last_s,
        all_before_deadline: sweeps.iter().all(|s| s.margin_ms > 0),
        min_margin_ms: sweeps.iter().map(|s| s.margin_ms).min().unwrap_or(0),
        leased: leased(&api, &ids).await?,
        sweeps,
    })
}

/// `poison` undecodable items due long ago at the head of shard 0, and good due executions submitted
/// until `good_in_shard` of them share that shard; one sweep, then another.
pub async fn poison(poison: usize, good_in_shard: usize, budget_ms: i64) -> Result<Poison> {
    let (local, api, pipeline, config) = stage("bench-poison").await?;
    let api = Arc::new(api);
    let shards = config.due_shards.max(1);
    let mut good = Vec::new();
    while good
        .iter()
        .filter(|id| due_shard(**id, shards) == 0)
        .count()
        < good_in_shard
    {
        good.extend(submit_many(&api, &pipeline, 10).await?);
    }
    local.take_all(WORKER_QUEUE).await?;
    let neighbours: Vec<Uuid> = good
        .iter()
        .copied()
        .filter(|id| due_shard(*id, shards) == 0)
        .collect();

    let mut items = Vec::new();
    for _ in 0..poison {
        items.push(local.put_undecodable_due_item(0, shards).await?);
    }

    let claim =
        stepline::aws::coordinator_on(&local.clients, &config, Arc::new(ShiftedClock(AHEAD)));
    let (first, _) = sweep(&claim, &local, budget_ms).await?;
    let good_in_shard_leased = leased(&api, &neighbours).await?;
    let now = claim.now();
    let mut pushed_back = 0;
    for id in &items {
        let item = local
            .execution_item(*id)
            .await?
            .context("a poison item is gone")?;
        let due: i64 = item
            .get("dueAt")
            .and_then(|v| v.as_n().ok())
            .context("a poison item left the index")?
            .parse()?;
        pushed_back += usize::from(due > now.millis());
    }
    let (second, _) = sweep(&claim, &local, budget_ms).await?;
    Ok(Poison {
        poison,
        shard: "s0".into(),
        good: good.len(),
        good_in_shard: neighbours.len(),
        first,
        good_in_shard_leased,
        pushed_back,
        second,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_period_is_the_templates_schedule() -> Result<()> {
        let template = Template::load(&Template::default_path())?;
        let schedule = Schedule::of(&template)?;
        assert!(
            schedule.period_s >= 60.0 && schedule.timeout_ms > 0,
            "{schedule:?}"
        );
        assert!(
            (schedule.timeout_ms as f64) < schedule.period_s * 1e3,
            "a sweep ends before the next starts: {schedule:?}"
        );
        assert_eq!(parse_rate("rate(5 minutes)")?.as_secs(), 300);
        assert_eq!(parse_rate("rate(1 hour)")?.as_secs(), 3_600);
        assert!(parse_rate("cron(0 * * * ? *)").is_err());
        assert!(parse_rate("rate(1 fortnight)").is_err());
        Ok(())
    }
}
