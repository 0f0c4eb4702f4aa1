//! The results as Markdown, from the summary alone (so BENCHMARKS.md shows what summary.json holds).

use std::fmt::Write;
use std::path::Path;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use crate::analysis::{Cost, CriticalPath, Latency, Length};
use crate::coldstart::ColdStart;
use crate::fanout::FanOut;
use crate::pricing::Prices;
use crate::recovery::Recovery;
use crate::scale::{Model, Row, PARTITION_WCU_LIMIT};
use crate::workload::Workload;

/// Everything one run measured.
pub struct Figures<'a> {
    pub mode: &'a str,
    pub work: Workload,
    pub prices: Prices,
    /// The sustained run's cost (the headline figure) and the light run's.
    pub cost: &'a Cost,
    pub cost_light: &'a Cost,
    pub cost_with_events: &'a Cost,
    /// The same pipeline, longer (`long_steps` steps).
    pub cost_long: &'a Cost,
    pub long_steps: usize,
    /// The execution item at each pipeline length measured.
    pub lengths: &'a [Length],
    pub path: &'a CriticalPath,
    pub latency: &'a Latency,
    pub latency_sustained: &'a Latency,
    pub cold: &'a ColdStart,
    pub model: &'a Model,
    pub rows: &'a [Row],
    /// The sweeper's recovery of a backlog (recovery.json's figures) and a fan-out, when run.
    pub sweeper: Option<&'a Recovery>,
    pub fan_out: Option<&'a FanOut>,
    pub elapsed_s: f64,
}

/// summary.json: the headline keys first, then every figure behind them.
pub fn summary(f: &Figures<'_>) -> Value {
    json!({
        "usd_per_million_steps": f.cost.coordinator_usd_per_million_steps,
        "usd_per_million_steps_sustained": f.cost.coordinator_usd_per_million_steps,
        "usd_per_million_steps_light": f.cost_light.coordinator_usd_per_million_steps,
        "critical_path_calls": f.path.median_calls,
        "critical_path_calls_multi": f.path.median_calls,
        "hop_latency_ratio": f.latency.ratio,
        "hop_latency_ratio_multi": f.latency.ratio,
        "hop_latency_ratio_p99_multi": f.latency.p99_ratio,
        "hop_latency_ratio_sustained": f.latency_sustained.ratio,
        "hop_latency_ratio_p99_sustained": f.latency_sustained.p99_ratio,
        "completion_instances": f.work.completions,
        "init_ms_max": f.cold.init_ms_max,
        "binary_mb_max": f.cold.binary_mb_max,
        "rss_mb_max": f.cold.rss_mb_max,
        "write_units_per_hop_max": f.lengths.iter().map(|l| l.write_units_per_hop_max).max().unwrap_or(0),
        "mode": f.mode,
        "workload": {
            "executions": f.work.executions,
            "light_executions": f.work.light,
            "submits_in_flight": crate::workload::SUBMITS_IN_FLIGHT,
            "completion_instances": f.work.completions,
            "steps": f.work.steps,
            "payload_bytes": f.work.payload_bytes,
            "sequential_executions": f.work.sequential,
            "loaded_executions": f.work.loaded,
            "loaded_rounds": f.work.loaded_rounds,
        },
        "emulator": std::env::var("AWS_ENDPOINT_URL").unwrap_or_default(),
        "prices": f.prices,
        "cost": f.cost,
        "cost_light": f.cost_light,
        "cost_with_lifecycle_events": f.cost_with_events,
        "cost_longer_pipeline": {"steps": f.long_steps, "cost": f.cost_long},
        "record_by_length": f.lengths,
        "critical_path": f.path,
        "latency": f.latency,
        "latency_sustained": f.latency_sustained,
        "cold_start": f.cold,
        "scale": {
            "model": {
                "index_writes_per_execution": f.model.index_writes_per_execution,
                "recovery_fraction": f.model.recovery_fraction,
                "claim_period_s": f.model.claim_period_s,
                "claim_limit": f.model.claim_limit,
                "claim_ms": f.model.claim_ms,
                "claim_timeout_s": f.model.claim_timeout_s,
                "simulated_seconds": f.model.seconds,
            },
            "partition_wcu_limit": PARTITION_WCU_LIMIT,
            "rows": f.rows,
        },
        "sweeper": f.sweeper,
        "sweeper_recovered_per_s": f.sweeper.map(|r| r.backlog.recovered_per_s()),
        "sweeper_all_before_deadline": f.sweeper.map(|r| r.backlog.all_before_deadline),
        "fan_out": f.fan_out,
        "fan_out_usd_per_million_children": f.fan_out.map(|r| r.per_child(r.coordinator_usd) * 1e6),
        "fan_out_parent_writes": f.fan_out.map(|r| r.parent_writes),
        "elapsed_s": f.elapsed_s,
    })
}

pub const START: &str = "<!-- bench:results:start -->";
pub const END: &str = "<!-- bench:results:end -->";

/// The targets, as (summary key, label, target), lower is better.
pub const TARGETS: [(&str, &str, f64); 10] = [
    (
        "usd_per_million_steps_sustained",
        "Coordinator cost at sustained load, $ per million step transitions",
        1.00,
    ),
    (
        "critical_path_calls_multi",
        "Sequential AWS calls, reply to next request (median, over the completion instances)",
        2.0,
    ),
    (
        "hop_latency_ratio_multi",
        "Hop latency / bare SQS round trip (medians, over the completion instances)",
        1.3,
    ),
    (
        "hop_latency_ratio_p99_multi",
        "Hop latency / bare SQS round trip (p99s, over the completion instances)",
        1.3,
    ),
    (
        "hop_latency_ratio_sustained",
        "Hop latency / bare SQS round trip at sustained load (medians)",
        1.3,
    ),
    (
        "hop_latency_ratio_p99_sustained",
        "Hop latency / bare SQS round trip at sustained load (p99s)",
        1.3,
    ),
    (
        "init_ms_max",
        "Init time, slowest binary (median of runs), ms",
        15.0,
    ),
    ("binary_mb_max", "Largest binary, MB (10^6 bytes)", 8.0),
    ("rss_mb_max", "Peak RSS, largest, MB (10^6 bytes)", 32.0),
    (
        "write_units_per_hop_max",
        "Write units of the largest hop write, at 5 to 1,000 steps",
        1.0,
    ),
];

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

pub fn markdown(s: &Value) -> String {
    let mut md = String::new();
    let w = &s["workload"];
    let _ = writeln!(
        md,
        "Mode `{}`: a {}-step pipeline ({}-byte payloads); for cost, {} executions submitted together ({} submissions in flight: sustained load) and {} submitted one after another (light load); {} run one at a time for latency, and {} together, each beside a bare chain, in {} rounds one after another, for latency at sustained load. The reply queue's batches are spread over {} completion instances (coordinators with their own caches); launches and submissions run in instances of their own. On `{}`.\n",
        s["mode"].as_str().unwrap_or("?"),
        w["steps"], w["payload_bytes"], w["executions"], w["submits_in_flight"], w["light_executions"],
        w["sequential_executions"], w["loaded_executions"], w["loaded_rounds"], w["completion_instances"],
        s["emulator"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        md,
        "| Figure | Measured | Target | Met |\n|---|---:|---:|:---:|"
    );
    for (key, label, target) in TARGETS {
        let value = num(&s[key]);
        let _ = writeln!(
            md,
            "| {label} (`{key}`) | {value:.3} | ≤ {target} | {} |",
            if value <= target { "yes" } else { "**no**" }
        );
    }

    let c = &s["cost"];
    let e = &s["cost_with_lifecycle_events"];
    let _ = writeln!(md, "\n### P1 cost per million step transitions\n");
    let _ = writeln!(md, "| | $ / million steps |\n|---|---:|");
    let light = format!(
        "Stepline coordinator at light load (batches of {:.1} messages on average)",
        num(&s["cost_light"]["records_per_invocation"])
    );
    let longer = format!(
        "Stepline coordinator, the same pipeline with {} steps",
        s["cost_longer_pipeline"]["steps"]
    );
    for (label, value) in [
        (
            "Stepline coordinator at sustained load (lifecycle events off, the default)",
            num(&c["coordinator_usd_per_million_steps"]),
        ),
        (
            light.as_str(),
            num(&s["cost_light"]["coordinator_usd_per_million_steps"]),
        ),
        (
            "Stepline coordinator with lifecycle events on",
            num(&e["coordinator_usd_per_million_steps"]),
        ),
        (
            "Stepline worker side (your step code's queues and Lambda)",
            num(&c["worker_usd_per_million_steps"]),
        ),
        (
            longer.as_str(),
            num(&s["cost_longer_pipeline"]["cost"]["coordinator_usd_per_million_steps"]),
        ),
        (
            "Step Functions Standard (one transition per task state)",
            num(&c["step_functions_usd_per_million_steps"]),
        ),
        (
            "Lambda durable functions (one operation per step, before invocations)",
            num(&c["durable_functions_usd_per_million_steps"]),
        ),
    ] {
        let _ = writeln!(md, "| {label} | {value:.3} |");
    }
    let _ = writeln!(
        md,
        "\nPer step on the coordinator side at sustained load: {:.2} DynamoDB writes ({:.2} write units, of which {:.2} index entries: the due index's and the list index's), {:.2} read units, {:.2} SQS requests, {:.3} Lambda invocations (batches of {:.1} messages on average), {:.2} events. Execution item: median {} B, max {} B. The claim sweeper adds about ${:.4} a month (one run a minute); idle event-source polling is not per step ({} empty receives in this run).\n",
        num(&c["dynamodb_writes_per_step"]), num(&c["write_units_per_step"]), num(&c["index_writes_per_step"]),
        num(&c["read_units_per_step"]), num(&c["sqs_requests_per_step"]), num(&c["lambda_invocations_per_step"]),
        num(&c["records_per_invocation"]),
        num(&c["events_per_step"]), c["item_bytes_median"], c["item_bytes_max"], num(&c["claim_usd_per_month"]),
        c["empty_receives"],
    );
    let by_function: Vec<String> = c["by_function"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(function, usd)| format!("{function} ${:.3}", num(usd)))
        .collect();
    let _ = writeln!(
        md,
        "By function, at sustained load (each with its Lambda requests and duration; `polling` is the event sources' receives and deletes on the coordinator's queues): {}.\n",
        by_function.join(", "),
    );
    let _ = writeln!(
        md,
        "Listing and history, included above: {:.3} list-index entries written per step ({:.2} per {}-step execution: one, at its creation), {:.3} history journal writes per step ({:.3} write units), together ${:.3} per million steps; the list keys and the history entries the record holds take a median {} B of the execution item.\n",
        num(&c["list_index_writes_per_step"]),
        num(&c["list_index_writes_per_step"]) * num(&w["steps"]),
        w["steps"],
        num(&c["journal_writes_per_step"]),
        num(&c["journal_units_per_step"]),
        num(&c["visibility_usd_per_million_steps"]),
        c["visibility_bytes_median"],
    );
    let _ = writeln!(
        md,
        "The execution item by pipeline length ({}-byte payloads): the record keeps only the current step, so every hop writes the same item however long the pipeline.\n\n| Steps | Executions | Item median B | Item max B | Write units, largest write | Table write units per write | Writes per step | Write units per step |\n|---:|---:|---:|---:|---:|---:|---:|---:|",
        w["payload_bytes"],
    );
    for l in s["record_by_length"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            l["steps"],
            l["executions"],
            l["item_bytes_median"],
            l["item_bytes_max"],
            l["write_units_per_hop_max"],
            num(&l["write_units_per_write"]),
            num(&l["dynamodb_writes_per_step"]),
            num(&l["write_units_per_step"]),
        );
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "| Side | Service | Operation | Calls | Billed units | $ / million steps |\n|---|---|---|---:|---:|---:|");
    for line in c["lines"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:.4} |",
            line["side"].as_str().unwrap_or(""),
            line["service"].as_str().unwrap_or(""),
            line["operation"].as_str().unwrap_or(""),
            line["calls"],
            num(&line["units"]),
            num(&line["usd_per_million_steps"]),
        );
    }

    let p = &s["critical_path"];
    let _ = writeln!(
        md,
        "\n### P2 critical path\n\nMedian {} sequential calls from a reply's arrival to the next request's send (max {}); hops by number of calls: `{}`; typical: `{}`.",
        p["median_calls"], p["max_calls"], p["histogram"], p["typical"].as_str().unwrap_or(""),
    );

    let _ = writeln!(
        md,
        "\n### P3 hop latency\n\n| | hops | median ms | p99 ms |\n|---|---:|---:|---:|"
    );
    for (load, l) in [
        ("one at a time", &s["latency"]),
        ("at sustained load", &s["latency_sustained"]),
    ] {
        if !l.is_object() {
            continue;
        }
        let _ = writeln!(
            md,
            "| Through the coordinator, {load} | {} | {:.2} | {:.2} |\n| Bare SQS request/reply, {load} | {} | {:.2} | {:.2} |\n| Ratio, {load} | | {:.2} | {:.2} |",
            l["hops"], num(&l["hop_median_ms"]), num(&l["hop_p99_ms"]),
            l["ping_pongs"], num(&l["ping_pong_median_ms"]), num(&l["ping_pong_p99_ms"]),
            num(&l["ratio"]), num(&l["p99_ratio"]),
        );
    }
    if s["latency_sustained"].is_object() {
        let _ = writeln!(
            md,
            "\nMessages per completion invocation: {:.1} one at a time, {:.1} at sustained load.",
            num(&s["latency"]["completion_batch_mean"]),
            num(&s["latency_sustained"]["completion_batch_mean"]),
        );
    }

    let cold = &s["cold_start"];
    let _ = writeln!(
        md,
        "\n### P4 cold start\n\nBinaries from `{}`.\n\n| Binary | Size MB | Init ms (median) | Init ms (runs) | Peak RSS MB | After an event |\n|---|---:|---:|---|---:|:---:|",
        cold["profile_dir"].as_str().unwrap_or("")
    );
    for b in cold["binaries"].as_array().into_iter().flatten() {
        let runs: Vec<String> = b["init_ms"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| format!("{:.1}", num(v)))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {:.2} | {:.1} | {} | {:.1} | {} |",
            b["binary"].as_str().unwrap_or(""),
            num(&b["bytes"]) / 1e6,
            num(&b["init_ms_median"]),
            runs.join(", "),
            num(&b["peak_rss_kib"]) * 1024.0 / 1e6,
            if b["handled_event"].as_bool() == Some(true) {
                "yes"
            } else {
                "init only"
            },
        );
    }

    let sc = &s["scale"];
    let m = &sc["model"];
    let _ = writeln!(
        md,
        "\n### P5 scale (simulation)\n\n{:.2} due-index writes per execution (measured in P1), {}% of executions needing the sweeper, a claim run every {} s taking up to {} per shard at {} ms each.\n\n| Executions/s | Shards | Hottest partition WCU/s | ≤ 1,000 | Due/s | Claims/s | Sweeper keeps up |\n|---:|---:|---:|:---:|---:|---:|:---:|",
        num(&m["index_writes_per_execution"]), num(&m["recovery_fraction"]) * 100.0,
        m["claim_period_s"], m["claim_limit"], m["claim_ms"],
    );
    for r in sc["rows"].as_array().into_iter().flatten() {
        let yes = |v: &Value| {
            if v.as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.1} | {:.1} | {} |",
            r["executions_per_s"],
            r["shards"],
            num(&r["hottest_partition_wcu_per_s"]),
            yes(&r["within_partition_limit"]),
            num(&r["due_per_s"]),
            num(&r["claims_per_s"]),
            yes(&r["claim_keeps_up"]),
        );
    }
    if s["sweeper"].is_object() {
        let _ = writeln!(
            md,
            "\n### Sweeper under a backlog\n\nIn the same run, on the same emulator (the section \"Recovery under a backlog\" below gives the method).\n\n{}",
            recovery_markdown(&s["sweeper"]).trim_end()
        );
    }
    if let Ok(fan_out) = serde_json::from_value::<FanOut>(s["fan_out"].clone()) {
        let _ = writeln!(
            md,
            "\n### Fan-out\n\nIn the same run, on the same emulator (the section \"Fan-out at scale\" below gives the method).\n\n{}",
            fan_out_markdown(&fan_out).trim_end()
        );
    }
    md
}

/// Replaces the text between the bench markers of `doc` with `results`.
pub fn update_doc(doc: &Path, results: &str) -> Result<()> {
    update_section(doc, START, END, results)
}

/// Replaces the text between the markers `open` and `close` of `doc` with `text`.
pub fn update_section(doc: &Path, open: &str, close: &str, text: &str) -> Result<()> {
    let old = std::fs::read_to_string(doc)?;
    let (Some(start), Some(end)) = (old.find(open), old.find(close)) else {
        bail!("{} has no {open} ... {close} section", doc.display());
    };
    if end < start {
        bail!("{}: the bench markers are out of order", doc.display());
    }
    let updated = format!("{}{open}\n{text}\n{}", &old[..start], &old[end..]);
    std::fs::write(doc, updated)?;
    Ok(())
}

pub const RECOVERY_START: &str = "<!-- bench:recovery:start -->";
pub const RECOVERY_END: &str = "<!-- bench:recovery:end -->";

fn yes_no(v: &Value) -> &'static str {
    if v.as_bool() == Some(true) {
        "yes"
    } else {
        "no"
    }
}

/// The recovery figures as Markdown, from recovery.json alone.
pub fn recovery_markdown(s: &Value) -> String {
    let mut md = String::new();
    let b = &s["backlog"];
    let sweeps = b["sweeps"].as_array().map_or(&[][..], Vec::as_slice);
    let _ = writeln!(
        md,
        "{} executions whose first step timed out, on `{}`: {} due-index shards, pages of {} (`CLAIM_LIMIT`), each sweep's deadline {} ms after its start (the claim function's timeout).\n",
        b["executions"], s["emulator"].as_str().unwrap_or("?"), b["shards"], b["claim_limit"], b["budget_ms"],
    );
    let _ = writeln!(md, "| Figure | Measured |\n|---|---:|");
    for (label, value) in [
        ("Sweeps needed", sweeps.len().to_string()),
        (
            "Executions recovered per sweep (mean)",
            format!("{:.0}", num(&b["claimed_per_sweep_mean"])),
        ),
        (
            "Time to recover all, sweeps back to back, s",
            format!("{:.1}", num(&b["sweeping_s"])),
        ),
        (
            "Time to recover all on the schedule (one sweep every 60 s), s",
            format!("{:.1}", num(&b["scheduled_s"])),
        ),
        (
            "Every sweep returned before its deadline",
            yes_no(&b["all_before_deadline"]).to_string(),
        ),
        (
            "Closest return to a deadline, ms before it",
            b["min_margin_ms"].to_string(),
        ),
        (
            "Executions leased once the sweeps were done",
            format!("{} of {}", b["leased"], b["executions"]),
        ),
        (
            "Submitting the backlog (for scale), s",
            format!("{:.1}", num(&b["submit_s"])),
        ),
    ] {
        let _ = writeln!(md, "| {label} | {value} |");
    }
    let _ = writeln!(
        md,
        "\n| Sweep | Due read | Claimed | Pages | Stopped early | Wall ms | Returned ms before deadline |\n|---:|---:|---:|---:|:---:|---:|---:|"
    );
    for (i, sweep) in sweeps.iter().enumerate() {
        let r = &sweep["report"];
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {} |",
            i + 1,
            r["due"],
            r["claimed"],
            r["pages"],
            yes_no(&r["stopped_early"]),
            num(&sweep["wall_ms"]),
            sweep["margin_ms"],
        );
    }

    let p = &s["poison"];
    let _ = writeln!(
        md,
        "\nPoison: {} undecodable items due long ago at the head of shard `{}`, behind them {} good due executions of that shard ({} good ones due in all). The first sweep claimed {} executions, and {} of the {} behind the poison were leased after it; it deferred {} poison items ({} found pushed back in the index); the second sweep met {} of them again.\n",
        p["poison"], p["shard"].as_str().unwrap_or("?"), p["good_in_shard"], p["good"],
        p["first"]["report"]["claimed"], p["good_in_shard_leased"], p["good_in_shard"],
        p["first"]["report"]["deferred"], p["pushed_back"],
        num(&p["second"]["report"]["failed"]) + num(&p["second"]["report"]["deferred"]),
    );
    let _ = writeln!(
        md,
        "| Sweep | Due read | Claimed | Failed | Deferred | Pages | Wall ms | Returned ms before deadline |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (label, sweep) in [("first", &p["first"]), ("second", &p["second"])] {
        let r = &sweep["report"];
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {} | {} | {:.0} | {} |",
            r["due"],
            r["claimed"],
            r["failed"],
            r["deferred"],
            r["pages"],
            num(&sweep["wall_ms"]),
            sweep["margin_ms"],
        );
    }
    md
}

pub const FAN_OUT_START: &str = "<!-- bench:fan-out:start -->";
pub const FAN_OUT_END: &str = "<!-- bench:fan-out:end -->";

/// The fan-out section: the run's figures, then its bill by side, service and operation.
pub fn fan_out_markdown(run: &FanOut) -> String {
    let n = run.children;
    let mut out = format!(
        "A batch of {n} rows of the csv example, each row paid by a child execution (parse, fan-out, \
         summary), on the emulator through the local runner.\n\n\
         | figure | value |\n|---|---|\n\
         | children | {n} ({} paid, the batch {}) |\n\
         | wall time | {:.1} s ({:.1} children/s) |\n\
         | writes of the parent's item, its creation included | {} |\n\
         | fan-out ledger writes / reads | {} / {} ({:.2} writes per child) |\n\
         | AWS requests (Lambda invocations aside) | {} ({:.1} per child) |\n\
         | Lambda invocations | {} ({:.2} per child) |\n\
         | coordinator side | ${:.2} per million children |\n\
         | worker side (the example's steps) | ${:.2} per million children |\n\n\
         | side | service | operation | calls | per child | units | $ per million children |\n\
         |---|---|---|---|---|---|---|\n",
        run.paid,
        run.status,
        run.wall_s,
        n as f64 / run.wall_s.max(0.001),
        run.parent_writes,
        run.ledger_writes,
        run.ledger_reads,
        run.per_child(run.ledger_writes as f64),
        run.calls,
        run.per_child(run.calls as f64),
        run.lambda_invocations,
        run.per_child(run.lambda_invocations as f64),
        run.per_child(run.coordinator_usd) * 1e6,
        run.per_child(run.worker_usd) * 1e6,
    );
    for line in &run.lines {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {:.2} | {:.1} | {:.2} |\n",
            line.side,
            line.service,
            line.operation,
            line.calls,
            run.per_child(line.calls as f64),
            line.units,
            run.per_child(line.usd) * 1e6
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fanout::FanOutLine;

    #[test]
    fn the_results_carry_the_sweeper_and_the_fan_out_of_the_same_run() {
        let fan_out = FanOut {
            children: 4,
            wall_s: 2.0,
            status: stepline::domain::Status::Succeeded,
            paid: 4,
            parent_writes: 6,
            ledger_writes: 8,
            ledger_reads: 1,
            lines: vec![FanOutLine {
                side: "coordinator".into(),
                service: "dynamodb".into(),
                operation: "PutItem".into(),
                calls: 20,
                units: 20.0,
                usd: 0.000012,
            }],
            calls: 20,
            lambda_invocations: 3,
            coordinator_usd: 0.000012,
            worker_usd: 0.0,
        };
        let sweeper = json!({
            "backlog": {"executions": 30, "sweeping_s": 3.0, "all_before_deadline": true, "sweeps": []},
            "poison": {"poison": 2, "first": {}, "second": {}},
        });
        let s = json!({
            "sweeper": sweeper,
            "fan_out": serde_json::to_value(&fan_out).unwrap(),
        });
        let md = markdown(&s);
        assert!(md.contains("### Sweeper under a backlog"), "{md}");
        assert!(md.contains("### Fan-out"), "{md}");
        assert!(
            md.contains("| coordinator side | $3.00 per million children |"),
            "{md}"
        );
        // Without them (a run that skipped them), neither section.
        let md = markdown(&json!({}));
        assert!(!md.contains("### Sweeper") && !md.contains("### Fan-out"));
    }
}
