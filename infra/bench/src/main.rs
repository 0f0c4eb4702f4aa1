//! `stepline-bench`: cost per step (P1), critical path (P2), hop latency (P3), cold start (P4) and scale
//! (P5), measured on the local emulator and in simulation, then the sweeper's recovery of a backlog and
//! a fan-out, in the same report. Writes `target/bench/summary.json` and, with `--update-doc`, the
//! results section of BENCHMARKS.md. With `--recovery` (or `--fan-out N`), only how the sweeper recovers
//! a backlog (or the fan-out): `target/bench/recovery.json` (`fan-out.json`) and its own section.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;

use stepline_bench::{analysis, coldstart, fanout, pricing, recovery, report, scale, workload};
use stepline_local::Template;

/// Pipeline lengths whose execution item the benchmark measures.
const LENGTHS: [usize; 4] = [5, 20, 100, 1_000];

#[derive(Parser, Debug)]
#[command(about = "Benchmarks of the Stepline coordinator on the local emulator and in simulation")]
struct Args {
    /// The full run: ten times the executions, more sequential runs and cold starts (minutes longer).
    #[arg(long)]
    full: bool,
    /// Executions submitted together for the sustained cost figures (default 400 quick, 2000 full).
    #[arg(long)]
    executions: Option<usize>,
    /// Executions submitted one after another for the light cost figure (default 100 quick, 1000
    /// full).
    #[arg(long)]
    light: Option<usize>,
    /// Completion instances the reply queue's batches are spread over.
    #[arg(long, default_value_t = 4)]
    completions: usize,
    /// Steps per execution.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Bytes of each step's output.
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Executions run one at a time for latency and the critical path (default 60 quick, 200 full).
    #[arg(long)]
    sequential: Option<usize>,
    /// Executions run together, beside as many bare chains, for hop latency at sustained load
    /// (default 40 quick, 100 full; 0: skip).
    #[arg(long)]
    loaded: Option<usize>,
    /// Rounds of the `loaded` executions, one after another (more hops at the same load).
    #[arg(long, default_value_t = 5)]
    loaded_rounds: usize,
    /// Directory of the release binaries (default: target/release).
    #[arg(long)]
    binaries: Option<PathBuf>,
    /// Cold starts per binary (default 3 quick, 10 full).
    #[arg(long)]
    cold_runs: Option<usize>,
    /// Where summary.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Rewrites the results section of this Markdown file (between its bench markers).
    #[arg(long)]
    update_doc: Option<PathBuf>,
    /// Only the sweeper's recovery of a backlog and of a shard headed by poison items: writes
    /// recovery.json and, with `--update-doc`, the recovery section instead of the results section.
    #[arg(long)]
    recovery: bool,
    /// Executions in the backlog the sweeper recovers (default 2000 with `--recovery` and in the full
    /// run, 500 in the quick run).
    #[arg(long)]
    backlog: Option<usize>,
    /// Undecodable items at the head of one shard (with `--recovery`).
    #[arg(long, default_value_t = 100)]
    poison: usize,
    /// Only a fan-out of this many children (the csv example's batch of as many rows): writes
    /// fan-out.json and, with `--update-doc`, the fan-out section.
    #[arg(long)]
    fan_out: Option<usize>,
    /// Children of the fan-out the full report includes (default 1000 full, 200 quick).
    #[arg(long)]
    fan_out_children: Option<usize>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.recovery {
        return recover(&args).await;
    }
    if let Some(children) = args.fan_out {
        return fan_out(&args, children).await;
    }
    let started = std::time::Instant::now();
    let work = workload::Workload {
        executions: args
            .executions
            .unwrap_or(if args.full { 2000 } else { 400 }),
        light: args.light.unwrap_or(if args.full { 1000 } else { 100 }),
        completions: args.completions,
        steps: args.steps,
        payload_bytes: args.payload_bytes,
        sequential: args.sequential.unwrap_or(if args.full { 200 } else { 60 }),
        loaded: args.loaded.unwrap_or(if args.full { 100 } else { 40 }),
        loaded_rounds: args.loaded_rounds,
        lifecycle_events: false,
    };
    let prices = pricing::US_EAST_1;

    eprintln!(
        "P1-P3: {work:?} on {}",
        std::env::var("AWS_ENDPOINT_URL").unwrap_or_default()
    );
    let measured = workload::run(work).await?;
    let cost = analysis::cost(&measured, &prices);
    let cost_light = analysis::cost_light(&measured, &prices);
    let path = analysis::critical_path(&measured);
    let latency = analysis::latency(&measured);
    let latency_sustained = analysis::latency_sustained(&measured);

    eprintln!("P1 with lifecycle events on");
    let with_events = workload::run(workload::Workload {
        lifecycle_events: true,
        executions: work.light.max(1),
        sequential: 0,
        loaded: 0,
        light: 0,
        ..work
    })
    .await?;
    let cost_with_events = analysis::cost(&with_events, &prices);

    // The same pipeline at other lengths: the item (what every hop writes) must not grow with it, and
    // what is paid per execution spreads over more steps. About as many steps at each length.
    let mut lengths = vec![analysis::Length::of(work.steps, work.executions, &cost)];
    let mut cost_long = cost.clone();
    for steps in LENGTHS.into_iter().filter(|s| *s != work.steps) {
        let at = workload::Workload {
            executions: (work.executions * work.steps / steps).max(1),
            steps,
            sequential: 0,
            loaded: 0,
            light: 0,
            ..work
        };
        eprintln!("P1 with {} steps ({} executions)", at.steps, at.executions);
        let run = analysis::cost(&workload::run(at).await?, &prices);
        lengths.push(analysis::Length::of(steps, at.executions, &run));
        if steps == work.steps * 4 {
            cost_long = run;
        }
    }
    let long_steps = work.steps * 4;

    let dir = args.binaries.clone().unwrap_or_else(coldstart::release_dir);
    eprintln!("P4: binaries in {}", dir.display());
    let cold = coldstart::measure(
        &dir,
        args.cold_runs.unwrap_or(if args.full { 10 } else { 3 }),
    )
    .await?;

    eprintln!("P5: simulation");
    let model = scale::Model::deployed(
        recovery::Schedule::of(&Template::load(&Template::default_path())?)?,
        cost.index_writes_per_step * work.steps as f64,
        if args.full { 10 } else { 2 },
    );
    let rows = scale::table(&model, &scale::RATES, &scale::SHARDS);

    // The sweeper's and the fan-out's figures, in the same report.
    let backlog = args.backlog.unwrap_or(if args.full { 2000 } else { 500 });
    let sweeper = sweeper(backlog, args.poison).await?;
    let children = args
        .fan_out_children
        .unwrap_or(if args.full { 1000 } else { 200 });
    let fan = fan_out_run(children).await?;

    let summary = report::summary(&report::Figures {
        mode: if args.full { "full" } else { "quick" },
        work,
        prices,
        cost: &cost,
        cost_light: &cost_light,
        cost_with_events: &cost_with_events,
        cost_long: &cost_long,
        long_steps,
        lengths: &lengths,
        path: &path,
        latency: &latency,
        latency_sustained: &latency_sustained,
        cold: &cold,
        model: &model,
        rows: &rows,
        sweeper: Some(&sweeper),
        fan_out: Some(&fan),
        elapsed_s: started.elapsed().as_secs_f64(),
    });
    let markdown = report::markdown(&summary);
    publish(
        &args,
        "summary.json",
        &summary,
        &markdown,
        started,
        report::update_doc,
    )
}

/// Writes `summary` as `file` in the output directory, prints its `markdown`, and puts that in the
/// document to update (if any) with `update`.
fn publish(
    args: &Args,
    file: &str,
    summary: &impl serde::Serialize,
    markdown: &str,
    started: std::time::Instant,
    update: impl FnOnce(&std::path::Path, &str) -> Result<()>,
) -> Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let file = args.out.join(file);
    std::fs::write(&file, serde_json::to_string_pretty(summary)?)?;
    println!("{markdown}");
    eprintln!(
        "wrote {} in {:.0} s",
        file.display(),
        started.elapsed().as_secs_f64()
    );
    if let Some(doc) = &args.update_doc {
        update(doc, markdown)?;
        eprintln!("updated {}", doc.display());
    }
    Ok(())
}

/// The sweeper's recovery of a backlog of `executions` and of a shard headed by `poison` items.
async fn sweeper(executions: usize, poison: usize) -> Result<recovery::Recovery> {
    let started = std::time::Instant::now();
    let schedule = recovery::Schedule::of(&Template::load(&Template::default_path())?)?;
    let emulator = std::env::var("AWS_ENDPOINT_URL").unwrap_or_default();
    eprintln!(
        "recovery: a backlog of {executions} executions, sweeps of {} ms, on {emulator}",
        schedule.timeout_ms
    );
    let backlog = recovery::backlog(executions, schedule).await?;
    anyhow::ensure!(
        backlog.leased == backlog.executions,
        "{} of {} executions leased after the sweeps",
        backlog.leased,
        backlog.executions
    );
    eprintln!("recovery: {poison} poison items in one shard");
    let poison = recovery::poison(poison, 20, schedule.timeout_ms).await?;
    Ok(recovery::Recovery {
        emulator,
        backlog,
        poison,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// A fan-out of `children`, which must all succeed.
async fn fan_out_run(children: usize) -> Result<fanout::FanOut> {
    eprintln!(
        "fan-out: {children} children on {}",
        std::env::var("AWS_ENDPOINT_URL").unwrap_or_default()
    );
    let run = fanout::run(children, &pricing::US_EAST_1).await?;
    anyhow::ensure!(
        run.status == stepline::domain::Status::Succeeded && run.paid == children as u64,
        "the batch ended {} with {} of {children} rows paid",
        run.status,
        run.paid
    );
    Ok(run)
}

async fn recover(args: &Args) -> Result<()> {
    let started = std::time::Instant::now();
    let run = sweeper(args.backlog.unwrap_or(2000), args.poison).await?;
    let summary = serde_json::to_value(&run)?;
    let markdown = report::recovery_markdown(&summary);
    publish(
        args,
        "recovery.json",
        &summary,
        &markdown,
        started,
        |doc, markdown| {
            report::update_section(doc, report::RECOVERY_START, report::RECOVERY_END, markdown)
        },
    )
}

async fn fan_out(args: &Args, children: usize) -> Result<()> {
    let started = std::time::Instant::now();
    let run = fan_out_run(children).await?;
    let markdown = report::fan_out_markdown(&run);
    publish(
        args,
        "fan-out.json",
        &run,
        &markdown,
        started,
        |doc, markdown| {
            report::update_section(doc, report::FAN_OUT_START, report::FAN_OUT_END, markdown)
        },
    )
}
