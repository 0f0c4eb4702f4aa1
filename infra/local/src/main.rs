//! `stepline-local`: the local stack's command line.
//!
//! - `demo`: provision a fresh stage, register the example `orders` pipeline, submit executions, drive
//!   them with the local runner, print progress and each final status; exit 0 only if all SUCCEEDED.
//! - `provision`: provision a stage and print its resources and function wiring as JSON.
//! - `run`: provision a stage and run its handlers (and the example worker) until interrupted; several
//!   `run` processes may share a stage (e.g. parallel claim loops with `--functions claim`).
//! - `releases`: the release registry of a stage that exists (creating and changing nothing else).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use order_worker::OrderSteps;
use stepline::domain::{Status, StepError, Verdict};
use stepline::envelope::InteractionMessage;
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline::SubmitRequest;
use stepline_local::releases::ReleaseAction;
use stepline_local::{
    example_contracts, fresh_stage, functions, Binding, ExampleCode, LocalStack, RunnerOptions,
};
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
        /// `orders` (three worker steps), `restaurant` (with a manager's approval) or `csv` (a batch of
        /// payments fanned out to one child execution per row).
        #[arg(long, default_value = "orders")]
        example: String,
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
    /// Generate the example's pipeline-contract.json (`--write`), or check the committed one (`--check`).
    Contract {
        #[arg(long, conflicts_with = "check")]
        write: bool,
        #[arg(long)]
        check: bool,
    },
    /// Release registry of an existing stage: list, active, history, activate, rollback, drift.
    Releases {
        #[arg(long, default_value = "local")]
        stage: String,
        #[arg(long, default_value = order_worker::PIPELINE_ID)]
        pipeline: String,
        #[command(subcommand)]
        action: ReleaseAction,
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
            example,
            executions,
            stage,
            timeout_secs,
            pipeline: _,
        } if example == "restaurant" => {
            restaurant_demo(executions, stage, Duration::from_secs(timeout_secs)).await
        }
        Command::Demo {
            example,
            stage,
            timeout_secs,
            ..
        } if example == "csv" => csv_demo(stage, Duration::from_secs(timeout_secs)).await,
        Command::Demo {
            example,
            executions,
            stage,
            timeout_secs,
            pipeline,
        } => {
            if example != "orders" {
                bail!("unknown example {example:?} (orders, restaurant, csv)");
            }
            demo(
                executions,
                stage,
                Duration::from_secs(timeout_secs),
                pipeline,
            )
            .await
        }
        Command::Contract { write, check } => contract(write, check),
        Command::Releases {
            stage,
            pipeline,
            action,
        } => {
            let local = LocalStack::find(&stage).await.with_context(|| {
                format!("finding stage {stage} (`stepline-local run --stage {stage}` creates it)")
            })?;
            stepline_local::releases::run(&local, &ExampleCode, &pipeline, action).await
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

/// Provisions `stage` and registers the example pipeline on its request queue, activating it only on
/// a stage where it has no active release yet.
async fn up_with_pipeline(
    stage: &str,
    params: &BTreeMap<String, String>,
    pipeline: PipelineArgs,
) -> Result<LocalStack> {
    let local = LocalStack::up_with(stage, params)
        .await
        .context("provisioning the local stack (is the emulator running? see infra/emulator.sh)")?;
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(
            queue,
            order_worker::RELEASE_VERSION,
            pipeline.step_timeout_secs,
        )
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
            Binding::Queue { .. } => false,
        })
        .collect();
    if wanted("worker") {
        let steps = Arc::new(SlowSteps(Duration::from_millis(pipeline.worker_delay_ms)));
        bindings.push(local.worker_binding(
            functions::ORDER_WORKER,
            &order_worker::contract(),
            steps,
        )?);
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

fn contract(write: bool, check: bool) -> Result<()> {
    for (file, contract) in example_contracts() {
        let path = stepline_local::workspace_root().join(file);
        let text = contract.to_file_text();
        if write {
            std::fs::write(&path, &text)?;
            eprintln!("wrote {}", path.display());
        } else if check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                bail!(
                    "{} drifted from the code; run `stepline-local contract --write`",
                    path.display()
                );
            }
            eprintln!("{} matches the code", path.display());
        } else {
            print!("{text}");
        }
    }
    Ok(())
}

/// The restaurant example: orders wait for a manager, who (played by the demo, as `stepline approve`
/// would) approves all but the last table, which is rejected.
async fn restaurant_demo(
    executions: usize,
    stage: Option<String>,
    timeout: Duration,
) -> Result<()> {
    let stage = stage.unwrap_or_else(|| fresh_stage("restaurant"));
    let begin = Instant::now();
    println!("provisioning stage {stage} from template.yaml");
    let local = LocalStack::up(&stage)
        .await
        .context("provisioning the local stack (is the emulator running? see infra/emulator.sh)")?;
    let (requests, _) = local.stack.queue("RestaurantRequestQueue")?;
    let (approvals, approvals_url) = local.stack.queue("RestaurantApprovalQueue")?;
    local
        .release(
            restaurant_approval::pipeline(requests, approvals, 120),
            Vec::new(),
        )
        .await?;
    let api = local.coordinator(functions::REDRIVE)?;
    let mut bindings = local.coordinator_bindings()?;
    bindings.push(local.worker_binding(
        "RestaurantWorkerFunction",
        &restaurant_approval::contract(),
        Arc::new(restaurant_approval::RestaurantSteps),
    )?);
    let _runner = local.run(bindings, RunnerOptions::default())?;

    let executions = executions.max(2);
    let mut ids = Vec::new();
    for n in 0..executions {
        let submitted = api
            .submit(SubmitRequest {
                pipeline_id: restaurant_approval::PIPELINE_ID.into(),
                tenant: "trattoria".into(),
                input: restaurant_approval::sample_order(n),
                ..Default::default()
            })
            .await?;
        println!(
            "order for table {} placed: execution {}",
            n + 1,
            submitted.execution
        );
        ids.push(submitted.execution);
    }
    let rejected = *ids.last().expect("at least two orders");

    // The manager: reads approval requests and answers them.
    let sqs = aws_sdk_sqs::Client::new(&local.sdk);
    let deadline = Instant::now() + timeout;
    let mut answered = 0;
    while answered < ids.len() {
        if Instant::now() > deadline {
            bail!(
                "approval requests did not all arrive within {} s",
                timeout.as_secs()
            );
        }
        for message in stepline_local::receive(&sqs, approvals_url).await? {
            let notice: stepline::envelope::AwaitNotice =
                serde_json::from_str(message.body.as_deref().unwrap_or_default())?;
            let reject = notice.execution_id == rejected;
            let (verdict, payload) = if reject {
                (
                    Verdict::Rejected,
                    serde_json::json!({"reason": "the kitchen is closing"}),
                )
            } else {
                (Verdict::Approved, serde_json::json!({"by": "maria"}))
            };
            println!(
                "[{:>5.1}s] manager {} table {}",
                begin.elapsed().as_secs_f64(),
                if reject { "rejects" } else { "approves" },
                notice.input["table"]
            );
            stepline::handlers::complete_interaction(
                &api,
                InteractionMessage {
                    kind: stepline::envelope::INTERACTION_KIND.into(),
                    execution_id: notice.execution_id,
                    interaction: notice.interactions[0].id.clone(),
                    token: notice.interactions[0].token.clone(),
                    verdict,
                    payload,
                },
            )
            .await?;
            sqs.delete_message()
                .queue_url(approvals_url)
                .set_receipt_handle(message.receipt_handle)
                .send()
                .await?;
            answered += 1;
        }
    }

    let mut records = Vec::new();
    for id in &ids {
        loop {
            let record = api.get(*id).await?;
            if record.status.is_terminal() {
                records.push(record);
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "execution {id} did not finish within {} s",
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    println!();
    let mut as_expected = true;
    // Orders were placed for tables 1, 2, ... in submission order.
    for (table, record) in (1..).zip(&records) {
        let expected = if record.id == rejected {
            Status::Failed
        } else {
            Status::Succeeded
        };
        as_expected &= record.status == expected;
        let detail = match (&record.result, &record.error) {
            (Some(result), _) => result.value()["message"].to_string(),
            (None, Some(error)) => format!("{}: {}", error.code, error.message),
            _ => String::new(),
        };
        println!(
            "table {:<3} {:<10} {detail}",
            table,
            record.status.to_string()
        );
    }
    println!(
        "\n{} approved orders reached the kitchen, 1 rejected, in {:.1}s",
        records.len() - 1,
        begin.elapsed().as_secs_f64()
    );
    if !as_expected {
        bail!("the orders did not end as the manager decided");
    }
    Ok(())
}

/// The csv-payments example: one batch, one child execution per good row, a summary.
async fn csv_demo(stage: Option<String>, timeout: Duration) -> Result<()> {
    let stage = stage.unwrap_or_else(|| fresh_stage("csv"));
    let begin = Instant::now();
    println!("provisioning stage {stage} from template.yaml");
    let local = LocalStack::up(&stage)
        .await
        .context("provisioning the local stack (is the emulator running? see infra/emulator.sh)")?;
    let api = local.coordinator(functions::REDRIVE)?;
    let (batch_queue, _) = local.stack.queue("CsvRequestQueue")?;
    let (payment_queue, _) = local.stack.queue("PaymentRequestQueue")?;
    for def in [
        csv_payments::batch_pipeline(batch_queue),
        csv_payments::payment_pipeline(payment_queue),
    ] {
        local.release(def, Vec::new()).await?;
    }
    let mut bindings = local.coordinator_bindings()?;
    bindings.push(local.worker_binding(
        "CsvWorkerFunction",
        &csv_payments::batch_contract(),
        Arc::new(csv_payments::CsvSteps),
    )?);
    bindings.push(local.worker_binding(
        "PaymentWorkerFunction",
        &csv_payments::payment_contract(),
        Arc::new(csv_payments::CsvSteps),
    )?);
    let _runner = local.run(bindings, RunnerOptions::default())?;

    let input = csv_payments::sample_csv();
    let rows = input["csv"].as_str().unwrap_or_default().lines().count() - 1;
    let submitted = api
        .submit(SubmitRequest {
            pipeline_id: csv_payments::BATCH_PIPELINE.into(),
            tenant: "finance".into(),
            input,
            ..Default::default()
        })
        .await?;
    println!(
        "batch of {rows} rows submitted: execution {}",
        submitted.execution
    );
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    let record = loop {
        let record = api.get(submitted.execution).await?;
        let line = match (&record.await_unit, record.status) {
            (Some(unit), Status::WaitingExternal) => {
                let done = unit
                    .interactions
                    .iter()
                    .filter(|i| i.completion.is_some())
                    .count();
                format!(
                    "{} step {}: {done}/{} payments done",
                    record.status,
                    record.step + 1,
                    unit.interactions.len()
                )
            }
            _ => format!("{} step {}", record.status, record.step + 1),
        };
        if line != last {
            println!("[{:>5.1}s] {line}", begin.elapsed().as_secs_f64());
            last = line;
        }
        if record.status.is_terminal() {
            break record;
        }
        if Instant::now() > deadline {
            bail!("the batch did not finish within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!();
    let summary = record
        .result
        .as_ref()
        .map(|r| r.value().clone())
        .unwrap_or_default();
    println!("{}", serde_json::to_string_pretty(&summary)?);
    println!(
        "\n{} in {:.1}s: {} paid, {} failed, {} bad rows",
        record.status,
        begin.elapsed().as_secs_f64(),
        summary["paid"],
        summary["failed"].as_array().map_or(0, Vec::len),
        summary["badRows"].as_array().map_or(0, Vec::len)
    );
    if record.status != Status::Succeeded
        || summary["paid"] != 3
        || summary["failed"].as_array().map_or(0, Vec::len) != 1
        || summary["badRows"].as_array().map_or(0, Vec::len) != 2
    {
        bail!("the batch did not end as expected (3 paid, 1 declined, 2 bad rows)");
    }
    Ok(())
}
