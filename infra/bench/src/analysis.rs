//! Turns the recorded calls into figures: the bill per million step transitions by side, service and
//! operation (P1), the sequential calls on the critical path (P2) and hop latency percentiles (P3).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::meter::{Call, Invocation};
use crate::pricing::{self, Prices};
use crate::workload::{Measured, Recorded};

/// A line of a bill, keyed by side, service and operation.
pub(crate) trait Keyed: Default {
    /// Its side, service and operation.
    fn key_mut(&mut self) -> [&mut String; 3];
}

/// The line of `lines` for `side`, `service` and `operation`: a new one when there is none.
pub(crate) fn line_of<'a, L: Keyed>(
    lines: &'a mut BTreeMap<(String, String, String), L>,
    side: &str,
    service: &str,
    operation: &str,
) -> &'a mut L {
    let key = (side.to_string(), service.to_string(), operation.to_string());
    lines.entry(key).or_insert_with(|| {
        let mut line = L::default();
        for (field, value) in line.key_mut().into_iter().zip([side, service, operation]) {
            *field = value.to_string();
        }
        line
    })
}

impl Keyed for Line {
    fn key_mut(&mut self) -> [&mut String; 3] {
        [&mut self.side, &mut self.service, &mut self.operation]
    }
}

/// One line of the bill: a side (coordinator or worker), a service and an operation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Line {
    pub side: String,
    pub service: String,
    pub operation: String,
    pub calls: u64,
    /// Billed units: write or read units, SQS requests, events, Lambda invocations.
    pub units: f64,
    pub usd_per_million_steps: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Cost {
    pub steps: u64,
    pub lines: Vec<Line>,
    /// Coordinator side: its handlers, its queues' event-source requests and its Lambda invocations.
    pub coordinator_usd_per_million_steps: f64,
    /// Worker side (the user's step code): the same for the worker functions.
    pub worker_usd_per_million_steps: f64,
    /// The coordinator side's figure split by the function that made the calls or was invoked (`api`
    /// is the submit; `polling` the event source's receives and deletes on the coordinator's queues).
    pub by_function: BTreeMap<String, f64>,
    pub step_functions_usd_per_million_steps: f64,
    pub durable_functions_usd_per_million_steps: f64,
    /// Per step transition, on the coordinator side.
    pub dynamodb_writes_per_step: f64,
    pub write_units_per_step: f64,
    pub index_writes_per_step: f64,
    pub read_units_per_step: f64,
    pub sqs_requests_per_step: f64,
    pub lambda_invocations_per_step: f64,
    pub events_per_step: f64,
    /// Messages per batch the coordinator's SQS-triggered invocations handled, on average.
    pub records_per_invocation: f64,
    /// Listing and history, per step: history journal writes and their write units, list index
    /// entries written, what the two cost, and the bytes they take in the execution item (median
    /// over its writes).
    pub journal_writes_per_step: f64,
    pub journal_units_per_step: f64,
    pub list_index_writes_per_step: f64,
    pub visibility_usd_per_million_steps: f64,
    pub visibility_bytes_median: u64,
    /// Execution item sizes written (bytes).
    pub item_bytes_median: u64,
    pub item_bytes_max: u64,
    /// Receives that found nothing (the pollers' idle cost, not charged per step).
    pub empty_receives: u64,
    /// The claim sweeper's cost per month at one run a minute (fixed, not per step).
    pub claim_usd_per_month: f64,
}

fn side_of(call: &Call, measured: &Measured) -> Option<&'static str> {
    match call.function {
        Some("claim") | Some("ping-pong") => None,
        Some("worker") => Some("worker"),
        Some(_) => Some("coordinator"),
        None => {
            let queue = call.queue.as_deref()?;
            if measured.coordinator_queues.iter().any(|q| q == queue) {
                Some("coordinator")
            } else if measured.worker_queues.iter().any(|q| q == queue) {
                Some("worker")
            } else {
                None
            }
        }
    }
}

fn template_function(short: &str) -> &'static str {
    crate::workload::FUNCTION_NAMES
        .iter()
        .find(|(_, name)| *name == short)
        .map_or("ApiFunction", |(function, _)| function)
}

/// Messages per invocation of the `functions` named, on average (0 when there was none).
pub fn batch_mean(invocations: &[Invocation], functions: &[&str]) -> f64 {
    let batches: Vec<usize> = invocations
        .iter()
        .filter(|i| functions.contains(&i.function))
        .map(|i| i.records)
        .collect();
    batches.iter().sum::<usize>() as f64 / batches.len().max(1) as f64
}

/// Units and price of one call.
pub fn billed(call: &Call, prices: &Prices) -> (f64, f64) {
    match call.service.as_str() {
        "dynamodb" => {
            let write = call.write_units as f64 * prices.dynamodb_write_unit;
            let read = call.read_units * prices.dynamodb_read_unit;
            (call.write_units as f64 + call.read_units, write + read)
        }
        "sqs" => (
            call.sqs_requests as f64,
            call.sqs_requests as f64 * prices.sqs_request,
        ),
        "events" => (
            call.events as f64,
            call.events as f64 * prices.eventbridge_event,
        ),
        "s3" => (
            call.s3_requests as f64,
            call.s3_requests as f64
                * match call.operation.as_str() {
                    "PutObject" => prices.s3_put,
                    _ => prices.s3_get,
                },
        ),
        _ => (0.0, 0.0),
    }
}

/// The sustained run's cost.
pub fn cost(measured: &Measured, prices: &Prices) -> Cost {
    cost_of(measured, &measured.cost, prices)
}

/// The light run's cost.
pub fn cost_light(measured: &Measured, prices: &Prices) -> Cost {
    cost_of(measured, &measured.light, prices)
}

fn cost_of(measured: &Measured, run: &Recorded, prices: &Prices) -> Cost {
    let (calls, invocations) = (&run.calls, &run.invocations);
    let steps = run.steps.max(1);
    let per_million = |usd: f64| usd / steps as f64 * 1e6;
    let mut lines: BTreeMap<(String, String, String), Line> = BTreeMap::new();
    let mut cost = Cost {
        steps,
        ..Cost::default()
    };
    let mut item_sizes = Vec::new();
    let mut visibility_sizes = Vec::new();
    for call in calls {
        if call.operation == "ReceiveMessage" && call.messages == 0 {
            cost.empty_receives += 1;
            continue;
        }
        let Some(side) = side_of(call, measured) else {
            continue;
        };
        let (units, usd) = billed(call, prices);
        let line = line_of(&mut lines, side, &call.service, &call.operation);
        line.calls += 1;
        line.units += units;
        line.usd_per_million_steps += per_million(usd);
        if side == "coordinator" {
            *cost
                .by_function
                .entry(call.function.unwrap_or("polling").into())
                .or_default() += per_million(usd);
            match call.service.as_str() {
                "dynamodb" => {
                    if call.operation == "PutItem" {
                        cost.dynamodb_writes_per_step += 1.0;
                        if call.journal {
                            cost.journal_writes_per_step += 1.0;
                            cost.journal_units_per_step += call.write_units as f64;
                        } else if !call.ledger {
                            item_sizes.push(call.item_bytes);
                            visibility_sizes.push(call.visibility_bytes);
                        }
                    }
                    cost.list_index_writes_per_step += call.list_index_writes as f64;
                    cost.write_units_per_step += call.write_units as f64;
                    cost.index_writes_per_step += call.index_writes as f64;
                    cost.read_units_per_step += call.read_units;
                }
                "sqs" => cost.sqs_requests_per_step += call.sqs_requests as f64,
                "events" => cost.events_per_step += call.events as f64,
                _ => {}
            }
        }
    }
    cost.records_per_invocation = batch_mean(invocations, &["launch", "completion"]);
    for invocation in invocations {
        let side = match invocation.function {
            "claim" | "ping-pong" => continue,
            "worker" => "worker",
            _ => "coordinator",
        };
        let memory = measured
            .memory_mb
            .get(template_function(invocation.function))
            .copied()
            .unwrap_or(128);
        let gb_s = pricing::gb_seconds(invocation.duration_ms, memory);
        for (operation, units, usd) in [
            ("Invoke", 1.0, prices.lambda_request),
            ("GB-s", gb_s, gb_s * prices.lambda_gb_second),
        ] {
            let line = line_of(&mut lines, side, "lambda", operation);
            if operation == "Invoke" {
                line.calls += 1;
                if side == "coordinator" {
                    cost.lambda_invocations_per_step += 1.0;
                }
            }
            if side == "coordinator" {
                *cost
                    .by_function
                    .entry(invocation.function.into())
                    .or_default() += per_million(usd);
            }
            line.units += units;
            line.usd_per_million_steps += per_million(usd);
        }
    }
    cost.lines = lines.into_values().collect();
    for line in &cost.lines {
        match line.side.as_str() {
            "coordinator" => cost.coordinator_usd_per_million_steps += line.usd_per_million_steps,
            _ => cost.worker_usd_per_million_steps += line.usd_per_million_steps,
        }
    }
    for field in [
        &mut cost.dynamodb_writes_per_step,
        &mut cost.write_units_per_step,
        &mut cost.index_writes_per_step,
        &mut cost.read_units_per_step,
        &mut cost.sqs_requests_per_step,
        &mut cost.lambda_invocations_per_step,
        &mut cost.events_per_step,
        &mut cost.journal_writes_per_step,
        &mut cost.journal_units_per_step,
        &mut cost.list_index_writes_per_step,
    ] {
        *field /= steps as f64;
    }
    cost.visibility_usd_per_million_steps = (cost.journal_units_per_step
        + cost.list_index_writes_per_step)
        * prices.dynamodb_write_unit
        * 1e6;
    visibility_sizes.sort_unstable();
    cost.visibility_bytes_median = percentile(&visibility_sizes, 0.5);
    item_sizes.sort_unstable();
    cost.item_bytes_median = percentile(&item_sizes, 0.5);
    cost.item_bytes_max = item_sizes.last().copied().unwrap_or(0);
    cost.claim_usd_per_month = claim_per_month(measured, prices);
    // Step Functions Standard: one transition per task state. Durable functions: one durable operation
    // per step, plus the invocations that replay the function (at least one per execution).
    cost.step_functions_usd_per_million_steps = prices.step_functions_transition * 1e6;
    cost.durable_functions_usd_per_million_steps = prices.durable_operation * 1e6;
    cost
}

/// Average bill of one claim run in this workload (the light and the sustained runs: the sweeper runs
/// on its schedule, so one of them may hold none), at one run a minute for 30 days.
fn claim_per_month(measured: &Measured, prices: &Prices) -> f64 {
    let runs: Vec<&Invocation> = measured
        .light
        .invocations
        .iter()
        .chain(&measured.cost.invocations)
        .filter(|i| i.function == "claim")
        .collect();
    if runs.is_empty() {
        return 0.0;
    }
    let calls: f64 = measured
        .light
        .calls
        .iter()
        .chain(&measured.cost.calls)
        .filter(|c| c.function == Some("claim"))
        .map(|c| billed(c, prices).1)
        .sum();
    let memory = measured
        .memory_mb
        .get("ClaimFunction")
        .copied()
        .unwrap_or(128);
    let lambda: f64 = runs
        .iter()
        .map(|i| {
            prices.lambda_request
                + pricing::gb_seconds(i.duration_ms, memory) * prices.lambda_gb_second
        })
        .sum();
    (calls + lambda) / runs.len() as f64 * 60.0 * 24.0 * 30.0
}

/// The calls a completion made from the reply's arrival to the next request's send.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CriticalPath {
    /// Median over hops of the number of sequential calls, the send included.
    pub median_calls: u64,
    pub max_calls: u64,
    /// How many hops took each number of calls.
    pub histogram: BTreeMap<u64, u64>,
    /// The most common sequence, e.g. "PutItem > SendMessageBatch".
    pub typical: String,
}

pub fn critical_path(measured: &Measured) -> CriticalPath {
    let mut by_invocation: BTreeMap<u64, Vec<&Call>> = BTreeMap::new();
    for call in &measured.sequential_calls {
        if call.function == Some("completion") {
            if let Some(id) = call.invocation {
                by_invocation.entry(id).or_default().push(call);
            }
        }
    }
    let mut counts = Vec::new();
    let mut sequences: BTreeMap<String, u64> = BTreeMap::new();
    let mut histogram = BTreeMap::new();
    for calls in by_invocation.values_mut() {
        calls.sort_by_key(|c| c.start_us);
        let Some(send) = calls.iter().position(|c| {
            c.operation.starts_with("SendMessage")
                && c.queue
                    .as_ref()
                    .is_some_and(|q| measured.worker_queues.contains(q))
        }) else {
            continue;
        };
        let n = send as u64 + 1;
        counts.push(n);
        *histogram.entry(n).or_insert(0) += 1;
        let sequence = calls[..=send]
            .iter()
            .map(|c| c.operation.as_str())
            .collect::<Vec<_>>()
            .join(" > ");
        *sequences.entry(sequence).or_insert(0) += 1;
    }
    counts.sort_unstable();
    CriticalPath {
        median_calls: percentile(&counts, 0.5),
        max_calls: counts.last().copied().unwrap_or(0),
        histogram,
        typical: sequences
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(s, _)| s)
            .unwrap_or_default(),
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub hops: usize,
    pub hop_median_ms: f64,
    pub hop_p99_ms: f64,
    pub ping_pongs: usize,
    pub ping_pong_median_ms: f64,
    pub ping_pong_p99_ms: f64,
    /// Median hop through the coordinator over the median bare round trip.
    pub ratio: f64,
    pub p99_ratio: f64,
    /// Messages per completion invocation meanwhile.
    pub completion_batch_mean: f64,
    /// Median duration of each kind of call in the same run (service.operation -> ms): what the
    /// emulator charges in time for the calls on the path.
    pub call_median_ms: BTreeMap<String, f64>,
}

/// P3 in the sequential run: hops and bare round trips one at a time, with the calls' durations.
pub fn latency(measured: &Measured) -> Latency {
    latency_of(
        &measured.hops_us,
        &measured.ping_pong_us,
        &measured.sequential_calls,
        measured.sequential_batch_mean,
    )
}

/// P3 at sustained load: the hops of executions submitted together against as many bare chains
/// run beside them.
pub fn latency_sustained(measured: &Measured) -> Latency {
    latency_of(
        &measured.sustained_hops_us,
        &measured.sustained_ping_pong_us,
        &[],
        measured.sustained_batch_mean,
    )
}

fn latency_of(hops: &[u64], pings: &[u64], calls: &[Call], batch_mean: f64) -> Latency {
    let mut hops = hops.to_vec();
    let mut pings = pings.to_vec();
    hops.sort_unstable();
    pings.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    let hop_median = ms(percentile(&hops, 0.5));
    let ping_median = ms(percentile(&pings, 0.5));
    let hop_p99 = ms(percentile(&hops, 0.99));
    let ping_p99 = ms(percentile(&pings, 0.99));
    let mut durations: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for call in calls {
        durations
            .entry(format!("{}.{}", call.service, call.operation))
            .or_default()
            .push(call.end_us.saturating_sub(call.start_us));
    }
    let call_median_ms = durations
        .into_iter()
        .map(|(op, mut d)| {
            d.sort_unstable();
            (op, ms(percentile(&d, 0.5)))
        })
        .collect();
    Latency {
        call_median_ms,
        completion_batch_mean: batch_mean,
        hops: hops.len(),
        hop_median_ms: hop_median,
        hop_p99_ms: hop_p99,
        ping_pongs: pings.len(),
        ping_pong_median_ms: ping_median,
        ping_pong_p99_ms: ping_p99,
        ratio: if ping_median > 0.0 {
            hop_median / ping_median
        } else {
            0.0
        },
        p99_ratio: if ping_p99 > 0.0 {
            hop_p99 / ping_p99
        } else {
            0.0
        },
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}

/// The execution item at one pipeline length: what every hop writes.
#[derive(Debug, Clone, Serialize)]
pub struct Length {
    pub steps: usize,
    pub executions: usize,
    pub item_bytes_median: u64,
    pub item_bytes_max: u64,
    /// Write units of the largest coordinator write (1 KB units of the larger of the old and new item).
    pub write_units_per_hop_max: u64,
    /// Table write units per coordinator write, on average (due-index entries apart).
    pub write_units_per_write: f64,
    pub dynamodb_writes_per_step: f64,
    pub write_units_per_step: f64,
}

impl Length {
    pub fn of(steps: usize, executions: usize, cost: &Cost) -> Self {
        let table_units = cost.write_units_per_step - cost.index_writes_per_step;
        Self {
            steps,
            executions,
            item_bytes_median: cost.item_bytes_median,
            item_bytes_max: cost.item_bytes_max,
            write_units_per_hop_max: cost.item_bytes_max.div_ceil(1024).max(1),
            write_units_per_write: table_units
                / cost.dynamodb_writes_per_step.max(f64::MIN_POSITIVE),
            dynamodb_writes_per_step: cost.dynamodb_writes_per_step,
            write_units_per_step: cost.write_units_per_step,
        }
    }
}
