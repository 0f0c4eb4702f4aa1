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
use stepline::domain::Execution;
use stepline::domain::{Status, StepError, Verdict};
use stepline::envelope::InteractionMessage;
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline::{Coordinator, SubmitRequest};
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
        /// `csv`: a generated batch of this many rows instead of the sample (every 50th declined,
        /// every 100th malformed).
        #[arg(long)]
        rows: Option<usize>,
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
        #[arg(long, env = "STEPLINE_STAGE", default_value = "local")]
        stage: String,
        /// The pipeline (default: the example's, unless `--file` names a pipeline file).
        #[arg(long)]
        pipeline: Option<String>,
        #[command(subcommand)]
        action: ReleaseAction,
    },
    /// Create a pipeline file's request queues (each with a dead-letter queue) on a stage, as its
    /// worker stack does on AWS, and print the environment its worker runs with (`eval` it).
    Attach {
        #[arg(long, env = "STEPLINE_STAGE", default_value = "local")]
        stage: String,
        /// The pipeline file.
        #[arg(long)]
        file: std::path::PathBuf,
        /// The release the worker serves.
        #[arg(long, default_value = "1")]
        release: String,
        /// The queue the worker polls (default: the first step's).
        #[arg(long)]
        queue: Option<String>,
    },
    /// Provision a stage and print it as JSON.
    Provision {
        #[arg(long, env = "STEPLINE_STAGE", default_value = "local")]
        stage: String,
    },
    /// Provision a stage and run its functions until interrupted.
    Run {
        #[arg(long, env = "STEPLINE_STAGE", default_value = "local")]
        stage: String,
        /// Template parameter overrides, `Name=Value` (as `sam deploy --parameter-overrides`).
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, String)>,
        /// Functions to run: any of claim, launch, completion, worker (default: all).
        #[arg(long, value_delimiter = ',')]
        functions: Vec<String>,
        /// Also serve the HTTP API here (a loopback address, e.g. 127.0.0.1:9000), as its function
        /// URLs would: payload format 2.0 events into the API function's handler.
        #[arg(long)]
        api: Option<std::net::SocketAddr>,
        #[command(flatten)]
        pipeline: PipelineArgs,
    },
}

/// How the example pipeline is registered and how its worker behaves.
#[derive(clap::Args, Clone)]
struct PipelineArgs {
    /// Timeout of each step of the example pipeline.
    #[arg(long, default_value_t = 60)]
    step_timeout_secs: u32,
    /// Makes the example worker take this long per step (to watch progress, or to kill it mid-run).
    #[arg(long, default_value_t = 0)]
    worker_delay_ms: u64,
    /// Makes the example worker never finish this step (to kill a runner while every execution is
    /// still mid-run, however fast the machine).
    #[arg(long)]
    worker_hold_step: Option<String>,
}

impl Default for PipelineArgs {
    fn default() -> Self {
        Self {
            step_timeout_secs: 60,
            worker_delay_ms: 0,
            worker_hold_step: None,
        }
    }
}

const PROVISIONING: &str =
    "provisioning the local stack (is the emulator running? see infra/emulator.sh)";

/// Creates the request queues a pipeline file names, each with a dead-letter queue `<name>-dlq`
/// (five receives), and prints the environment of the worker of `queue` (with the coordinator's reply
/// queue, where it announces itself).
async fn attach(
    stage: &str,
    file: &std::path::Path,
    release: &str,
    queue: Option<String>,
) -> Result<()> {
    let local = LocalStack::find(stage).await.with_context(|| {
        format!("finding stage {stage} (`stepline-local run --stage {stage}` creates it)")
    })?;
    let definition = stepline_local::releases::read_pipeline_file(file, release)?;
    let sqs = aws_sdk_sqs::Client::new(&local.sdk);
    let mut urls = BTreeMap::new();
    for name in definition.steps.iter().map(|s| s.queue.as_str()) {
        if name.is_empty() || urls.contains_key(name) {
            continue;
        }
        urls.insert(
            name.to_string(),
            stepline_local::stack::worker_queue(&sqs, name).await?,
        );
    }
    let name = match queue {
        Some(name) => name,
        None => definition
            .steps
            .iter()
            .map(|s| s.queue.clone())
            .find(|q| !q.is_empty())
            .context("the pipeline names no queue")?,
    };
    let Some((url, dlq)) = urls.get(&name) else {
        bail!("the pipeline has no queue {name}");
    };
    let env = local.stack.env_of(functions::ORDER_WORKER)?;
    println!("export REQUEST_QUEUE_URL={url}");
    println!("export REQUEST_DLQ_URL={dlq}");
    println!("export RELEASE_VERSION={release}");
    println!(
        "export REPLY_QUEUE_URL={}",
        local.stack.queue("ReplyQueue")?.1
    );
    for name in ["PAYLOAD_BUCKET", "PAYLOAD_THRESHOLD_BYTES"] {
        if let Some(value) = env(name) {
            println!("export {name}={value}");
        }
    }
    Ok(())
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
            ..
        } if example == "restaurant" => {
            restaurant_demo(executions, stage, Duration::from_secs(timeout_secs)).await
        }
        Command::Demo {
            example,
            stage,
            timeout_secs,
            rows,
            ..
        } if example == "csv" => csv_demo(stage, Duration::from_secs(timeout_secs), rows).await,
        Command::Demo {
            example,
            executions,
            stage,
            timeout_secs,
            pipeline,
            ..
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
            let from_file = matches!(
                action,
                ReleaseAction::Register { file: Some(_), .. }
                    | ReleaseAction::Drift { file: Some(_), .. }
            );
            let pipeline =
                pipeline.or_else(|| (!from_file).then(|| order_worker::PIPELINE_ID.to_string()));
            stepline_local::releases::run(&local, &ExampleCode, pipeline.as_deref(), action).await
        }
        Command::Attach {
            stage,
            file,
            release,
            queue,
        } => attach(&stage, &file, &release, queue).await,
        Command::Provision { stage } => {
            let local = LocalStack::up(&stage).await?;
            println!("{}", serde_json::to_string_pretty(&local.stack)?);
            Ok(())
        }
        Command::Run {
            stage,
            params,
            functions,
            api,
            pipeline,
        } => {
            let local = LocalStack::up_with(&stage, &params.into_iter().collect())
                .await
                .context(PROVISIONING)?;
            // Workers attach from other processes (`stepline-local attach`): their request queues
            // are taken for worker stacks' as they are named.
            local.take_outside_queues_as_worker_stacks()?;
            release_order_example(&local, &pipeline).await?;
            let _runner = start(&local, &functions, &pipeline)?;
            if let Some(address) = api {
                let bound = stepline_local::endpoint::start(&local, address).await?;
                // A line a script can wait for.
                eprintln!("api http://{bound}");
            }
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

/// Registers the order example on the stage's request queue, activating it only on a stage where it
/// has no active release yet.
async fn release_order_example(local: &LocalStack, pipeline: &PipelineArgs) -> Result<()> {
    let (queue, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(
            queue,
            order_worker::RELEASE_VERSION,
            pipeline.step_timeout_secs,
        )
        .await?;
    Ok(())
}

/// Starts the runner for the chosen functions (all when none is named).
fn start(
    local: &LocalStack,
    only: &[String],
    pipeline: &PipelineArgs,
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
        let steps = Arc::new(SlowSteps {
            delay: Duration::from_millis(pipeline.worker_delay_ms),
            hold: pipeline.worker_hold_step.clone(),
        });
        bindings.push(local.worker_binding(
            functions::ORDER_WORKER,
            &order_worker::contract(),
            steps,
        )?);
    }
    local.run(bindings, RunnerOptions::default())
}

/// The example steps, optionally slowed down, and one of them optionally never finished.
struct SlowSteps {
    delay: Duration,
    hold: Option<String>,
}

#[async_trait::async_trait]
impl StepFunction for SlowSteps {
    async fn run(
        &self,
        request: &RequestHeader,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, StepError> {
        tokio::time::sleep(self.delay).await;
        if self.hold.as_deref() == Some(request.step_id.as_str()) {
            std::future::pending::<()>().await;
        }
        OrderSteps.run(request, input).await
    }
}

/// What each demo has at hand: its stage, the coordinator it submits to, and its clock.
struct Demo {
    local: LocalStack,
    api: Coordinator,
    begin: Instant,
    timeout: Duration,
}

impl Demo {
    /// Provisions `stage` (a fresh one named after `prefix` when none is given).
    async fn provision(stage: Option<String>, prefix: &str, timeout: Duration) -> Result<Self> {
        let stage = stage.unwrap_or_else(|| fresh_stage(prefix));
        let begin = Instant::now();
        println!("provisioning stage {stage} from template.yaml");
        let local = LocalStack::up(&stage).await.context(PROVISIONING)?;
        let api = local.operator()?;
        Ok(Self {
            local,
            api,
            begin,
            timeout,
        })
    }

    /// Seconds since the demo began.
    fn elapsed(&self) -> f64 {
        self.begin.elapsed().as_secs_f64()
    }

    /// A deadline the demo's timeout from now.
    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// Fails when `deadline` has passed and `what` has not happened.
    fn in_time(&self, deadline: Instant, what: &str) -> Result<()> {
        if Instant::now() > deadline {
            bail!("{what} within {} s", self.timeout.as_secs());
        }
        Ok(())
    }

    async fn submit(&self, pipeline: &str, tenant: &str, input: serde_json::Value) -> Result<Uuid> {
        let submitted = self
            .api
            .submit(SubmitRequest {
                pipeline_id: pipeline.into(),
                tenant: tenant.into(),
                input,
                ..Default::default()
            })
            .await?;
        Ok(submitted.execution)
    }

    /// Polls the executions until every one has ended, printing `progress` of them when it changes.
    async fn until_ended(
        &self,
        ids: &[Uuid],
        deadline: Instant,
        what: &str,
        progress: impl Fn(&[Execution]) -> String,
    ) -> Result<Vec<Execution>> {
        let mut last = String::new();
        loop {
            let mut records = Vec::new();
            for id in ids {
                records.push(self.api.get(*id).await?);
            }
            let line = progress(&records);
            if !line.is_empty() && line != last {
                println!("[{:>5.1}s] {line}", self.elapsed());
                last = line;
            }
            if records.iter().all(|r| r.status.is_terminal()) {
                return Ok(records);
            }
            self.in_time(deadline, what)?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A finished execution's result (`shown` of it) or its error.
fn outcome(record: &Execution, shown: impl Fn(&serde_json::Value) -> String) -> String {
    match (&record.result, &record.error) {
        (Some(result), _) => shown(result.value()),
        (None, Some(error)) => format!("{}: {}", error.code, error.message),
        _ => String::new(),
    }
}

async fn demo(
    executions: usize,
    stage: Option<String>,
    timeout: Duration,
    pipeline: PipelineArgs,
) -> Result<()> {
    let demo = Demo::provision(stage, "demo", timeout).await?;
    release_order_example(&demo.local, &pipeline).await?;
    let _runner = start(&demo.local, &[], &pipeline)?;

    let mut ids = Vec::new();
    let mut orders = Vec::new();
    for n in 0..executions {
        let input = order_worker::sample_order(n);
        let order = input["orderId"].as_str().unwrap_or_default().to_string();
        let id = demo
            .submit(order_worker::PIPELINE_ID, "demo", input)
            .await?;
        println!("submitted {order} as execution {id}");
        ids.push(id);
        orders.push(order);
    }

    let finals = demo
        .until_ended(
            &ids,
            demo.deadline(),
            "executions did not finish",
            |records| {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for record in records {
                    let label = if record.status == Status::Running {
                        format!("RUNNING step {}", record.step + 1)
                    } else {
                        record.status.to_string()
                    };
                    *counts.entry(label).or_default() += 1;
                }
                counts
                    .iter()
                    .map(|(k, v)| format!("{v} {k}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        )
        .await?;

    println!();
    for (order, record) in orders.iter().zip(&finals) {
        let detail = outcome(record, |result| result.to_string());
        println!(
            "{order:<10} {} {:<10} {detail}",
            record.id,
            record.status.to_string()
        );
    }
    let ok = finals
        .iter()
        .filter(|r| r.status == Status::Succeeded)
        .count();
    println!(
        "\n{ok}/{} executions SUCCEEDED in {:.1}s",
        finals.len(),
        demo.elapsed()
    );
    if ok != finals.len() {
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
    let demo = Demo::provision(stage, "restaurant", timeout).await?;
    let local = &demo.local;
    local.release_restaurant().await?;
    let (_, approvals_url) = local.stack.queue("RestaurantApprovalQueue")?;
    let _runner = local.run_workers(vec![(
        "RestaurantWorkerFunction",
        restaurant_approval::contract(),
        Arc::new(restaurant_approval::RestaurantSteps),
    )])?;

    let executions = executions.max(2);
    let mut ids = Vec::new();
    for n in 0..executions {
        let input = restaurant_approval::sample_order(n);
        let id = demo
            .submit(restaurant_approval::PIPELINE_ID, "trattoria", input)
            .await?;
        println!("order for table {} placed: execution {id}", n + 1);
        ids.push(id);
    }
    let rejected = *ids.last().expect("at least two orders");

    // The manager: reads approval requests and answers them.
    let sqs = aws_sdk_sqs::Client::new(&local.sdk);
    let deadline = demo.deadline();
    let mut answered = 0;
    while answered < ids.len() {
        demo.in_time(deadline, "approval requests did not all arrive")?;
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
                demo.elapsed(),
                if reject { "rejects" } else { "approves" },
                notice.input["table"]
            );
            stepline::handlers::complete_interaction(
                &demo.api,
                InteractionMessage {
                    kind: stepline::envelope::INTERACTION_KIND.into(),
                    execution_id: notice.execution_id,
                    interaction: notice.interactions[0].id.clone(),
                    token: notice.interactions[0].token.clone(),
                    verdict,
                    payload,
                    unit: None,
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

    let records = demo
        .until_ended(&ids, deadline, "the orders did not finish", |_| {
            String::new()
        })
        .await?;
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
        let detail = outcome(record, |result| result["message"].to_string());
        println!(
            "table {:<3} {:<10} {detail}",
            table,
            record.status.to_string()
        );
    }
    println!(
        "\n{} approved orders reached the kitchen, 1 rejected, in {:.1}s",
        records.len() - 1,
        demo.elapsed()
    );
    if !as_expected {
        bail!("the orders did not end as the manager decided");
    }
    Ok(())
}

/// The csv example's steps, with the bank's side kept: the payment references made per row (a row
/// paid twice would show two).
struct CountingBank {
    references:
        std::sync::Mutex<std::collections::BTreeMap<u64, std::collections::BTreeSet<String>>>,
}

#[async_trait::async_trait]
impl stepline::worker::StepFunction for CountingBank {
    async fn run(
        &self,
        request: &stepline::envelope::RequestHeader,
        input: serde_json::Value,
    ) -> Result<serde_json::Value, stepline::domain::StepError> {
        if request.step_id == "pay" {
            let line = input["line"].as_u64().unwrap_or_default();
            let reference = csv_payments::payment_reference(request);
            self.references
                .lock()
                .expect("bank")
                .entry(line)
                .or_default()
                .insert(reference);
        }
        csv_payments::CsvSteps.run(request, input).await
    }
}

/// The csv-payments example: one batch, one child execution per good row, a summary. With `rows`, a
/// generated batch of that many rows.
async fn csv_demo(stage: Option<String>, timeout: Duration, rows: Option<usize>) -> Result<()> {
    let demo = Demo::provision(stage, "csv", timeout).await?;
    let local = &demo.local;
    let (batch_queue, _) = local.stack.queue("CsvRequestQueue")?;
    let (payment_queue, _) = local.stack.queue("PaymentRequestQueue")?;
    let mut batch = csv_payments::batch_pipeline(batch_queue);
    // A large batch runs longer than the sample's step timeout.
    batch.steps[1].timeout_secs = batch.steps[1].timeout_secs.max(timeout.as_secs() as u32);
    for def in [batch, csv_payments::payment_pipeline(payment_queue)] {
        local.release(def, Vec::new()).await?;
    }
    let bank = Arc::new(CountingBank {
        references: Default::default(),
    });
    let _runner = local.run_workers(vec![
        (
            "CsvWorkerFunction",
            csv_payments::batch_contract(),
            bank.clone(),
        ),
        (
            "PaymentWorkerFunction",
            csv_payments::payment_contract(),
            bank.clone(),
        ),
    ])?;

    let (input, (paid, declined, bad)) = match rows {
        Some(rows) => csv_payments::generated_csv(rows),
        None => (csv_payments::sample_csv(), (3, 1, 2)),
    };
    let rows = input["csv"].as_str().unwrap_or_default().lines().count() - 1;
    let id = demo
        .submit(csv_payments::BATCH_PIPELINE, "finance", input)
        .await?;
    println!("batch of {rows} rows submitted: execution {id}");
    let deadline = demo.deadline();
    let mut last = String::new();
    let record = loop {
        let record = demo.api.get(id).await?;
        let line = match demo.api.unit_progress(&record).await? {
            Some(p) if record.status == Status::WaitingExternal => {
                let outcomes: Vec<String> =
                    p.answered.iter().map(|(o, n)| format!("{o} {n}")).collect();
                format!(
                    "{} step {}: {}/{} payments done ({})",
                    record.status,
                    record.step + 1,
                    p.interactions - p.open,
                    p.interactions,
                    outcomes.join(", ")
                )
            }
            _ => format!("{} step {}", record.status, record.step + 1),
        };
        if line != last {
            println!("[{:>5.1}s] {line}", demo.elapsed());
            last = line;
        }
        if record.status.is_terminal() {
            break record;
        }
        demo.in_time(deadline, "the batch did not finish")?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!();
    let summary = record
        .result
        .as_ref()
        .map(|r| r.value().clone())
        .unwrap_or_default();
    if rows <= 20 {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    }
    let count = |key: &str| summary[key].as_array().map_or(0, Vec::len);
    let references = bank.references.lock().expect("bank").clone();
    let twice: Vec<_> = references.iter().filter(|(_, r)| r.len() > 1).collect();
    println!(
        "\n{} in {:.1}s: {} paid, {} failed, {} bad rows; {} rows sent to the bank, {} of them under more than one reference",
        record.status,
        demo.elapsed(),
        summary["paid"],
        count("failed"),
        count("badRows"),
        references.len(),
        twice.len()
    );
    if record.status != Status::Succeeded
        || summary["paid"] != paid
        || count("failed") != declined
        || count("badRows") != bad
    {
        bail!(
            "the batch did not end as expected ({paid} paid, {declined} declined, {bad} bad rows)"
        );
    }
    if !twice.is_empty() {
        bail!("rows paid twice: {twice:?}");
    }
    Ok(())
}
