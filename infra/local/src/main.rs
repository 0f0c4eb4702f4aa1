//! `stepline-local`: the local stack's command line.
//!
//! - `demo`: provision a fresh stage, register the example `orders` pipeline, submit executions, drive
//!   them with the local runner, print progress and each final status; exit 0 only if all SUCCEEDED.
//! - `provision`: provision a stage and print its resources and function wiring as JSON.
//! - `run`: provision a stage and run its handlers (and the example worker) until interrupted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use order_worker::OrderSteps;
use stepline::domain::Status;
use stepline::SubmitRequest;
use stepline_local::{fresh_stage, functions, LocalStack, RunnerOptions};
use uuid::Uuid;

#[derive(Parser)]
#[command(
    name = "stepline-local",
    about = "Local stack of the Stepline coordinator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run executions of the example pipeline end to end.
    Demo {
        #[arg(long, default_value_t = 5)]
        executions: usize,
        /// Stage to provision (default: a fresh one).
        #[arg(long)]
        stage: Option<String>,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Provision a stage and print it as JSON.
    Provision {
        #[arg(long, default_value = "local")]
        stage: String,
    },
    /// Provision a stage and run its functions until interrupted.
    Run {
        #[arg(long, default_value = "local")]
        stage: String,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    stepline::telemetry::init();
    match Cli::parse().command {
        Command::Demo {
            executions,
            stage,
            timeout_secs,
        } => demo(executions, stage, Duration::from_secs(timeout_secs)).await,
        Command::Provision { stage } => {
            let local = LocalStack::up(&stage).await?;
            println!("{}", serde_json::to_string_pretty(&local.stack)?);
            Ok(())
        }
        Command::Run { stage } => {
            let local = up_with_pipeline(&stage).await?;
            let _runner = start(&local)?;
            eprintln!("running stage {stage}; Ctrl-C to stop");
            tokio::signal::ctrl_c().await?;
            Ok(())
        }
    }
}

/// Provisions `stage` and registers and activates the example pipeline on its request queue.
async fn up_with_pipeline(stage: &str) -> Result<LocalStack> {
    let local = LocalStack::up(stage)
        .await
        .context("provisioning the local stack (is the emulator running? see infra/emulator.sh)")?;
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    let def = order_worker::pipeline(queue);
    let api = local.coordinator(functions::REDRIVE)?;
    api.registry().register(&def).await?;
    api.registry()
        .activate(&def.pipeline_id, &def.release_version)
        .await?;
    Ok(local)
}

fn start(local: &LocalStack) -> Result<stepline_local::Runner> {
    let mut bindings = local.coordinator_bindings()?;
    bindings.push(local.worker_binding(functions::ORDER_WORKER, Arc::new(OrderSteps))?);
    local.run(bindings, RunnerOptions::default())
}

async fn demo(executions: usize, stage: Option<String>, timeout: Duration) -> Result<()> {
    let stage = stage.unwrap_or_else(|| fresh_stage("demo"));
    let begin = Instant::now();
    println!("provisioning stage {stage} from template.yaml");
    let local = up_with_pipeline(&stage).await?;
    let _runner = start(&local)?;
    let api = local.coordinator(functions::REDRIVE)?;

    let mut ids: Vec<(String, Uuid)> = Vec::new();
    for n in 0..executions {
        let input = order_worker::sample_order(n);
        let order = input["orderId"].as_str().unwrap_or_default().to_string();
        let submitted = api
            .submit(SubmitRequest {
                pipeline_id: order_worker::PIPELINE_ID.into(),
                tenant: "demo".into(),
                input,
                ..Default::default()
            })
            .await?;
        println!("submitted {order} as execution {}", submitted.execution);
        ids.push((order, submitted.execution));
    }

    let deadline = Instant::now() + timeout;
    let mut last_line = String::new();
    let finals = loop {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut records = Vec::new();
        for (_, id) in &ids {
            let record = api.get(*id).await?;
            let label = if record.status == Status::Running {
                format!("RUNNING step {}", record.step + 1)
            } else {
                record.status.to_string()
            };
            *counts.entry(label).or_default() += 1;
            records.push(record);
        }
        let line = counts
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect::<Vec<_>>()
            .join(", ");
        if line != last_line {
            println!("[{:>5.1}s] {line}", begin.elapsed().as_secs_f64());
            last_line = line;
        }
        if records.iter().all(|r| r.status.is_terminal()) {
            break records;
        }
        if Instant::now() > deadline {
            bail!("executions did not finish within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    println!();
    let mut all_ok = true;
    for ((order, id), record) in ids.iter().zip(&finals) {
        let detail = match (&record.result, &record.error) {
            (Some(result), _) => result.value().to_string(),
            (None, Some(error)) => format!("{}: {}", error.code, error.message),
            _ => String::new(),
        };
        println!(
            "{order:<10} {id} {:<10} {detail}",
            record.status.to_string()
        );
        all_ok &= record.status == Status::Succeeded;
    }
    let ok = finals
        .iter()
        .filter(|r| r.status == Status::Succeeded)
        .count();
    println!(
        "\n{ok}/{} executions SUCCEEDED in {:.1}s",
        finals.len(),
        begin.elapsed().as_secs_f64()
    );
    if !all_ok {
        bail!("not every execution SUCCEEDED");
    }
    Ok(())
}
