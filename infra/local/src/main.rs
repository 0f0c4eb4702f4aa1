//! `stepline-local`: the local stack's command line.
//!
//! - `demo`: provision a fresh stage, register the example `orders` pipeline, submit executions, drive
//!   them with the local runner, print progress and each final status; exit 0 only if all SUCCEEDED.
//! - `provision`: provision a stage and print its resources and function wiring as JSON.
//! - `run`: provision a stage and run its handlers (and the example worker) until interrupted; several
//!   `run` processes may share a stage (e.g. parallel claim loops with `--functions claim`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use order_worker::OrderSteps;
use stepline::domain::{Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline::SubmitRequest;
use stepline_local::{fresh_stage, functions, Binding, LocalStack, RunnerOptions};
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
        #[command(flatten)]
        pipeline: PipelineArgs,
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
        /// Template parameter overrides, `Name=Value` (as `sam deploy --parameter-overrides`).
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Functions to run: any of claim, launch, completion, worker (default: all).
        #[arg(long, value_delimiter = ',')]
        functions: Vec<String>,
        #[command(flatten)]
        pipeline: PipelineArgs,
    },
}

/// How the example pipeline is registered and how its worker behaves.
#[derive(clap::Args, Clone, Copy)]
struct PipelineArgs {
    /// Timeout of each step of the example pipeline.
    #[arg(long, default_value_t = 60)]
    step_timeout_secs: u32,
    /// Makes the example worker take this long per step (to watch progress, or to kill it mid-run).
    #[arg(long, default_value_t = 0)]
    worker_delay_ms: u64,
}

impl Default for PipelineArgs {
    fn default() -> Self {
        Self {
            step_timeout_secs: 60,
            worker_delay_ms: 0,
        }
    }
}

fn parse_param(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected Name=Value, got {text:?}"))
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    stepline::telemetry::init_to_stderr();
    match Cli::parse().command {
        Command::Demo {
            executions,
            stage,
            timeout_secs,
            pipeline,
        } => {
            demo(
                executions,
                stage,
                Duration::from_secs(timeout_secs),
                pipeline,
            )
            .await
        }
        Command::Provision { stage } => {
            let local = LocalStack::up(&stage).await?;
            println!("{}", serde_json::to_string_pretty(&local.stack)?);
            Ok(())
        }
        Command::Run {
            stage,
            params,
            functions,
            pipeline,
        } => {
            let local = up_with_pipeline(&stage, &params.into_iter().collect(), pipeline).await?;
            let _runner = start(&local, &functions, pipeline)?;
            eprintln!("running stage {stage}; Ctrl-C to stop");
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            Ok(())
        }
    }
}

/// Provisions `stage` and registers and activates the example pipeline on its request queue.
async fn up_with_pipeline(
    stage: &str,
    params: &BTreeMap<String, String>,
    pipeline: PipelineArgs,
) -> Result<LocalStack> {
    let local = LocalStack::up_with(stage, params)
        .await
        .context("provisioning the local stack (is the emulator running? see infra/emulator.sh)")?;
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    let mut def = order_worker::pipeline(queue);
    for step in &mut def.steps {
        step.timeout_secs = pipeline.step_timeout_secs;
    }
    let api = local.coordinator(functions::REDRIVE)?;
    api.registry().register(&def).await?;
    api.registry()
        .activate(&def.pipeline_id, &def.release_version)
        .await?;
    Ok(local)
}

/// Starts the runner for the chosen functions (all when none is named).
fn start(
    local: &LocalStack,
    only: &[String],
    pipeline: PipelineArgs,
) -> Result<stepline_local::Runner> {
    let wanted = |name: &str| only.is_empty() || only.iter().any(|f| f == name);
    for name in only {
        if !["claim", "launch", "completion", "worker"].contains(&name.as_str()) {
            bail!("unknown function {name:?} (claim, launch, completion, worker)");
        }
    }
    let mut bindings: Vec<_> = local
        .coordinator_bindings()?
        .into_iter()
        .filter(|b| match b {
            Binding::Schedule { .. } => wanted("claim"),
            Binding::Sqs { function, .. } if function == functions::LAUNCH => wanted("launch"),
            Binding::Sqs { .. } => wanted("completion"),
        })
        .collect();
    if wanted("worker") {
        let steps = Arc::new(SlowSteps(Duration::from_millis(pipeline.worker_delay_ms)));
        bindings.push(local.worker_binding(functions::ORDER_WORKER, steps)?);
    }
    local.run(bindings, RunnerOptions::default())
}

/// The example steps, optionally slowed down.
struct SlowSteps(Duration);

#[async_trait::async_trait]
impl StepFunction for SlowSteps {
    async fn run(
        &self,
        request: &RequestHeader,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, StepError> {
        tokio::time::sleep(self.0).await;
        OrderSteps.run(request, input).await
    }
}

async fn demo(
    executions: usize,
    stage: Option<String>,
    timeout: Duration,
    pipeline: PipelineArgs,
) -> Result<()> {
    let stage = stage.unwrap_or_else(|| fresh_stage("demo"));
    let begin = Instant::now();
    println!("provisioning stage {stage} from template.yaml");
    let local = up_with_pipeline(&stage, &BTreeMap::new(), pipeline).await?;
    let _runner = start(&local, &[], pipeline)?;
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
