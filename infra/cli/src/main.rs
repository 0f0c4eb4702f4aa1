//! `stepline`: the operator CLI. Works against any deployed stage of template.yaml, on AWS (standard
//! AWS configuration and credentials) or on an emulator (`AWS_ENDPOINT_URL`). Human-readable output by
//! default, `--json` for scripts.

mod console;
mod init;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use stepline::adapters::SqsDeadLetterQueue;
use stepline::domain::history::{describe, utc};
use stepline::domain::{Execution, Status, StepStatus, UnitProgress, Verdict};
use stepline::envelope::{InteractionMessage, INTERACTION_KIND};
use stepline::handlers::{
    self, CancelRequest, DeadLetterQueues, MoveRequest, MoveSource, OperatorRequest, RedriveRequest,
};
use stepline::handlers::{ReplayFilter, ReplayRequest};
use stepline::ports::DeadLetterQueue;
use stepline::{Coordinator, SubmitRequest};
use stepline_stage::releases::{FilesOnly, ReleaseAction};
use stepline_stage::Stage;
use uuid::Uuid;

/// Operate Stepline executions, dead letters and releases
#[derive(Parser)]
#[command(name = "stepline")]
struct Cli {
    /// The deployed stage (the template's Stage parameter).
    #[arg(long, env = "STEPLINE_STAGE", default_value = "dev", global = true)]
    stage: String,
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start an execution.
    Submit {
        #[arg(long)]
        pipeline: String,
        #[arg(long)]
        tenant: String,
        /// Input JSON.
        #[arg(long, default_value = "{}")]
        input: String,
        #[arg(long)]
        idempotency_key: Option<String>,
        #[arg(long)]
        release: Option<String>,
    },
    /// Status of an execution.
    Status { execution: Uuid },
    /// List a pipeline's executions, newest first.
    List {
        #[arg(long)]
        pipeline: String,
        /// Only these statuses (repeat, or separate with commas).
        #[arg(long, value_delimiter = ',')]
        status: Vec<String>,
        #[arg(long)]
        tenant: Option<String>,
        /// Created at or after (epoch milliseconds; default: a week before `--to`).
        #[arg(long)]
        from: Option<i64>,
        /// Created before (epoch milliseconds; default: now).
        #[arg(long)]
        to: Option<i64>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Go on from a page's `next`.
        #[arg(long)]
        after: Option<String>,
    },
    /// Everything that happened to an execution: attempts, heartbeats, answers, re-drives, incidents.
    History { execution: Uuid },
    /// Serve the web console on 127.0.0.1 (executions, their graphs and histories, approvals,
    /// cancel, re-drive, dead letters), with your own AWS credentials.
    Console {
        #[arg(long, default_value_t = 8470)]
        port: u16,
    },
    /// Follow an execution's steps until it ends (exit 0 only if it SUCCEEDED).
    Watch {
        execution: Uuid,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// Result of a finished execution.
    Result { execution: Uuid },
    /// Approve a pending interaction of an execution's await unit.
    Approve {
        execution: Uuid,
        /// Interaction id (default: the only pending one).
        #[arg(long)]
        interaction: Option<String>,
        /// Payload JSON recorded with the approval.
        #[arg(long, default_value = "{}")]
        payload: String,
    },
    /// Reject a pending interaction (the execution fails with the reason).
    Reject {
        execution: Uuid,
        #[arg(long)]
        interaction: Option<String>,
        #[arg(long)]
        reason: String,
    },
    /// Cancel an execution.
    Cancel {
        execution: Uuid,
        #[arg(long)]
        reason: String,
    },
    /// Re-drive a FAILED or DLQ execution.
    Redrive {
        execution: Uuid,
        #[arg(long)]
        reason: String,
        /// The version you looked at (default: the current one).
        #[arg(long)]
        expected_version: Option<u64>,
    },
    /// Check a pipeline file (YAML or JSON) and print its contract version.
    Validate {
        file: std::path::PathBuf,
        /// Also write its contract (`pipeline-contract.json`) beside it, for its workers.
        #[arg(long)]
        write_contract: bool,
    },
    /// Write a new pipeline: its file, a worker skeleton and the worker stack's SAM template.
    Init {
        name: String,
        #[arg(long, value_enum, default_value = "python")]
        lang: init::Lang,
        /// Directory to create (default: NAME).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// Rust: the path of the `stepline-worker` library the worker builds with.
        #[arg(long)]
        stepline_path: Option<std::path::PathBuf>,
    },
    /// Release registry: register, list, active, history, activate, rollback, diff, drift.
    Releases {
        /// The pipeline (with `register --file`: the file's).
        #[arg(long)]
        pipeline: Option<String>,
        #[command(subcommand)]
        action: ReleaseAction,
    },
    /// The workers of a pipeline that announced themselves: identity, queue, health.
    Workers {
        #[arg(long)]
        pipeline: String,
    },
    /// Dead letters: inspect a DLQ, replay the execution DLQ, or move a queue's dead letters back.
    Dlq {
        #[command(subcommand)]
        action: DlqAction,
    },
}

#[derive(Subcommand)]
enum DlqAction {
    /// List messages of a DLQ (left in place).
    Inspect {
        #[arg(long, default_value = "execution")]
        queue: String,
        #[arg(long, default_value_t = 10)]
        max: usize,
    },
    /// Re-drive the executions of matching dead-letter envelopes.
    Replay {
        #[command(flatten)]
        filter: FilterArgs,
    },
    /// Move matching dead letters of the launch, reply or start queue back to it.
    Move {
        #[arg(long)]
        queue: String,
        #[command(flatten)]
        filter: FilterArgs,
    },
}

#[derive(clap::Args)]
struct FilterArgs {
    #[arg(long)]
    pipeline: Option<String>,
    #[arg(long)]
    tenant: Option<String>,
    #[arg(long)]
    error_code: Option<String>,
    /// Epoch milliseconds, inclusive.
    #[arg(long)]
    from: Option<i64>,
    /// Epoch milliseconds, exclusive.
    #[arg(long)]
    to: Option<i64>,
    #[arg(long)]
    dry_run: bool,
    #[arg(long, default_value_t = 100)]
    max: usize,
    /// Messages per second.
    #[arg(long)]
    rate: Option<f64>,
    #[arg(long, default_value = "operator replay")]
    reason: String,
}

impl FilterArgs {
    fn request(&self) -> ReplayRequest {
        ReplayRequest {
            filter: ReplayFilter {
                pipeline_id: self.pipeline.clone(),
                tenant: self.tenant.clone(),
                error_code: self.error_code.clone(),
                from: self.from,
                to: self.to,
            },
            dry_run: self.dry_run,
            max_messages: self.max,
            rate_per_second: self.rate,
            reason: self.reason.clone(),
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::var_os("RUST_LOG").is_none() {
        std::env::set_var("RUST_LOG", "warn");
    }
    stepline::telemetry::init_to_stderr();
    let cli = Cli::parse();
    // What needs no stage.
    match cli.command {
        Command::Validate {
            file,
            write_contract,
        } => return init::validate(&file, write_contract),
        Command::Init {
            name,
            lang,
            dir,
            stepline_path,
        } => return init::init(&name, lang, dir, stepline_path),
        _ => {}
    }
    let stage = Stage::find(&cli.stage)
        .await
        .with_context(|| format!("finding stage {}", cli.stage))?;
    let api = stage.operator()?;
    let out = Output { json: cli.json };
    match cli.command {
        Command::Submit {
            pipeline,
            tenant,
            input,
            idempotency_key,
            release,
        } => {
            let submitted = api
                .submit(SubmitRequest {
                    pipeline_id: pipeline,
                    release_version: release,
                    tenant,
                    input: serde_json::from_str(&input).context("--input is not JSON")?,
                    idempotency_key,
                    parent: None,
                })
                .await?;
            out.show(&serde_json::to_value(&submitted)?, || {
                format!(
                    "{} {}",
                    submitted.execution,
                    if submitted.duplicate {
                        "(already submitted)"
                    } else {
                        "submitted"
                    }
                )
            });
        }
        Command::Status { execution } => {
            let record = api.get(execution).await?;
            let progress = api.unit_progress(&record).await?;
            let mut shown = serde_json::to_value(&record)?;
            // The reply secret stays in the coordinator (with it, anyone could forge replies).
            if let Some(fields) = shown.as_object_mut() {
                fields.remove("secret");
                if let Some(progress) = &progress {
                    fields.insert("progress".into(), serde_json::to_value(progress)?);
                }
            }
            out.show(&shown, || summary(&record, progress.as_ref()));
        }
        Command::List {
            pipeline,
            status,
            tenant,
            from,
            to,
            limit,
            after,
        } => {
            let mut statuses = Vec::new();
            for s in &status {
                statuses.push(
                    serde_json::from_value(Value::String(s.to_uppercase()))
                        .with_context(|| format!("no status {s:?}"))?,
                );
            }
            let page = api
                .list(stepline::ListRequest {
                    pipeline_id: pipeline,
                    statuses,
                    tenant,
                    from,
                    to,
                    limit,
                    after,
                })
                .await?;
            out.show(&serde_json::to_value(&page)?, || listing(&page));
        }
        Command::History { execution } => {
            let history = api.history(execution).await?;
            out.show(&serde_json::to_value(&history)?, || story(&history));
        }
        Command::Console { port } => return console::serve(stage, api, port).await,
        Command::Watch {
            execution,
            timeout_secs,
        } => return watch(&api, execution, Duration::from_secs(timeout_secs), &out).await,
        Command::Result { execution } => {
            let record = api.get(execution).await?;
            if !record.status.is_terminal() {
                bail!("execution {execution} is {} (not finished)", record.status);
            }
            let result = record.result.as_ref().map(|r| r.value().clone());
            out.show(
                &json!({"executionId": execution, "status": record.status, "result": result, "error": record.error}),
                || match (&result, &record.error) {
                    (Some(r), _) => r.to_string(),
                    (None, Some(e)) => format!("{}: {} {}", record.status, e.code, e.message),
                    _ => record.status.to_string(),
                },
            );
        }
        Command::Approve {
            execution,
            interaction,
            payload,
        } => {
            let payload = serde_json::from_str(&payload).context("--payload is not JSON")?;
            answer(
                &api,
                execution,
                interaction,
                Verdict::Approved,
                payload,
                &out,
            )
            .await?;
        }
        Command::Reject {
            execution,
            interaction,
            reason,
        } => {
            answer(
                &api,
                execution,
                interaction,
                Verdict::Rejected,
                json!({"reason": reason}),
                &out,
            )
            .await?;
        }
        Command::Cancel { execution, reason } => {
            let response = handlers::cancel(
                &api,
                CancelRequest {
                    execution_id: execution,
                    reason,
                },
            )
            .await?;
            out.show(&serde_json::to_value(&response)?, || {
                format!("{execution} {}", response.status)
            });
        }
        Command::Redrive {
            execution,
            reason,
            expected_version,
        } => {
            let expected_version = match expected_version {
                Some(v) => v,
                None => api.get(execution).await?.version,
            };
            let response = handlers::redrive(
                &api,
                RedriveRequest {
                    execution_id: execution,
                    expected_version,
                    reason,
                },
            )
            .await?;
            out.show(&serde_json::to_value(&response)?, || {
                format!(
                    "{execution} {} (version {})",
                    response.status, response.version
                )
            });
        }
        Command::Dlq { action } => dlq(&stage, &api, action, &out).await?,
        Command::Workers { pipeline } => {
            let workers = api.workers(&pipeline).await?;
            let listed: Vec<Value> = workers
                .iter()
                .map(|(w, health)| {
                    let mut shown = serde_json::to_value(w).unwrap_or_default();
                    shown["health"] = serde_json::to_value(health).unwrap_or_default();
                    shown
                })
                .collect();
            out.show(&Value::Array(listed), || {
                if workers.is_empty() {
                    return format!("no worker of {pipeline} announced itself");
                }
                workers
                    .iter()
                    .map(|(w, health)| {
                        format!(
                            "{} release {} {} queue {} contract {} seen {}",
                            w.worker_id,
                            w.release_version,
                            serde_json::to_value(health)
                                .unwrap_or_default()
                                .as_str()
                                .unwrap_or(""),
                            w.queue,
                            w.contract_version,
                            w.seen_at
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        Command::Releases { pipeline, action } => {
            stepline_stage::releases::run(&stage, &FilesOnly, pipeline.as_deref(), action).await?
        }
        Command::Validate { .. } | Command::Init { .. } => unreachable!("run without a stage"),
    }
    Ok(())
}

struct Output {
    json: bool,
}

impl Output {
    fn show(&self, value: &Value, human: impl FnOnce() -> String) {
        if self.json {
            println!("{value}");
        } else {
            println!("{}", human());
        }
    }
}

fn listing(page: &stepline::ListResponse) -> String {
    let mut lines: Vec<String> = page
        .executions
        .iter()
        .map(|e| {
            format!(
                "{}  {:<16} step {} attempt {}  tenant {}  release {}  created {}{}",
                e.execution_id,
                e.status.as_str(),
                e.step + 1,
                e.attempt,
                e.tenant,
                e.release_version,
                utc(e.created_at),
                e.error_code
                    .as_ref()
                    .map(|c| format!("  {c}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    if lines.is_empty() {
        lines.push("no executions".into());
    }
    if let Some(next) = &page.next {
        lines.push(format!("more: --after {next}"));
    }
    lines.join("\n")
}

fn story(history: &stepline::HistoryView) -> String {
    let e = &history.execution;
    let name = |k: u32| match history.steps.get(k as usize) {
        Some(step) => format!("{} ({})", k + 1, step.id),
        None => (k + 1).to_string(),
    };
    let mut lines = vec![format!(
        "{} {} pipeline {} release {} tenant {} created {}",
        e.execution_id,
        e.status,
        e.pipeline_id,
        e.release_version,
        e.tenant,
        utc(e.created_at)
    )];
    for entry in &history.entries {
        lines.push(format!(
            "  {}  +{:>9.3}s  {}{}",
            utc(entry.at),
            (entry.at - e.created_at) as f64 / 1000.0,
            describe(&entry.what, name),
            entry
                .launch_id
                .map(|l| format!("  launch {l}"))
                .unwrap_or_default()
        ));
    }
    lines.push("attempts:".into());
    for a in &history.attempts {
        lines.push(format!(
            "  step {} attempt {}  {}  {}{}{}",
            name(a.step),
            a.attempt,
            a.outcome,
            a.duration_ms
                .map(|d| format!("{d} ms"))
                .unwrap_or_else(|| "-".into()),
            a.code
                .as_ref()
                .map(|c| format!("  {c}"))
                .unwrap_or_default(),
            if a.heartbeats > 0 {
                format!("  {} heartbeat(s)", a.heartbeats)
            } else {
                String::new()
            }
        ));
    }
    if !history.missing_chunks.is_empty() {
        lines.push(format!(
            "journal chunks not found: {:?}",
            history.missing_chunks
        ));
    }
    lines.join("\n")
}

fn summary(record: &Execution, progress: Option<&UnitProgress>) -> String {
    let mut line = format!(
        "{} {} pipeline {} release {} step {} attempt {} version {}",
        record.id,
        record.status,
        record.pipeline_id,
        record.release_version,
        record.step + 1,
        record.attempt,
        record.version
    );
    if let (Some(unit), Some(progress)) = (&record.await_unit, progress) {
        if record.status == Status::WaitingExternal {
            line.push_str(&format!(" {}", waiting_on(unit, progress)));
        }
    }
    if let Some(error) = &record.error {
        line.push_str(&format!(" error {}: {}", error.code, error.message));
    }
    line
}

/// What an await unit waits on: its open interactions by name, or, for many (a fan-out's children),
/// the counts: `3/10 answered (SUCCEEDED 2, FAILED 1)`.
fn waiting_on(unit: &stepline::domain::AwaitUnit, progress: &UnitProgress) -> String {
    if unit.fan_out.is_none() && progress.interactions <= 3 {
        let pending: Vec<&str> = unit
            .interactions
            .iter()
            .filter(|i| i.completion.is_none())
            .map(|i| i.id.as_str())
            .collect();
        return format!("waiting on {}", pending.join(", "));
    }
    let answered: Vec<String> = progress
        .answered
        .iter()
        .map(|(outcome, n)| format!("{outcome} {n}"))
        .collect();
    format!(
        "{}/{} answered ({})",
        progress.interactions - progress.open,
        progress.interactions,
        answered.join(", ")
    )
}

async fn watch(api: &Coordinator, id: Uuid, timeout: Duration, out: &Output) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last = String::new();
    // Steps whose success was shown. They are read from the record's progress, not inferred from the
    // polls: a fast execution or a slow poll shows every step all the same.
    let mut shown = 0;
    loop {
        let record = api.get(id).await?;
        let definition = api
            .definition(&record.pipeline_id, &record.release_version)
            .await
            .ok();
        let step_id = |k: u32| {
            definition
                .as_ref()
                .and_then(|d| d.step(k).map(|s| s.id.clone()))
                .unwrap_or_default()
        };
        // The record holds the current step's progress only: every step before it succeeded.
        let succeeded = record.first_step as usize
            + record
                .steps
                .iter()
                .take_while(|p| p.status == StepStatus::Succeeded)
                .count();
        while shown < succeeded {
            let k = shown as u32;
            out.show(
                &json!({"executionId": id, "step": k, "stepId": step_id(k), "stepStatus": "SUCCEEDED"}),
                || format!("step {} ({}) succeeded", k + 1, step_id(k)),
            );
            shown += 1;
        }
        let step = step_id(record.step);
        let mut line = format!(
            "{} step {} ({}) attempt {}",
            record.status,
            record.step + 1,
            step,
            record.attempt
        );
        let waiting = record
            .await_unit
            .as_ref()
            .filter(|_| record.status == Status::WaitingExternal);
        let progress = match waiting {
            Some(_) => api.unit_progress(&record).await?,
            None => None,
        };
        if let (Some(unit), Some(progress)) = (waiting, &progress) {
            line.push_str(&format!(": {}", waiting_on(unit, progress)));
        }
        if line != last {
            out.show(
                &json!({"executionId": id, "status": record.status, "step": record.step, "stepId": step, "attempt": record.attempt, "version": record.version, "progress": progress}),
                || line.clone(),
            );
            last = line;
        }
        if record.status.is_terminal() {
            if record.status == Status::Succeeded {
                return Ok(());
            }
            let error = record
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.code, e.message));
            bail!(
                "execution {id} ended {} {}",
                record.status,
                error.unwrap_or_default()
            );
        }
        if tokio::time::Instant::now() > deadline {
            bail!("execution {id} still {} after {:?}", record.status, timeout);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn answer(
    api: &Coordinator,
    execution: Uuid,
    interaction: Option<String>,
    verdict: Verdict,
    payload: Value,
    out: &Output,
) -> Result<()> {
    let record = api.get(execution).await?;
    let Some(unit) = &record.await_unit else {
        bail!(
            "execution {execution} has no await unit (it is {})",
            record.status
        );
    };
    let pending: Vec<_> = unit
        .interactions
        .iter()
        .filter(|i| interaction.as_deref().is_none_or(|want| i.id == want))
        .collect();
    let target = match (pending.as_slice(), &interaction) {
        ([one], _) => *one,
        ([], Some(name)) => bail!("execution {execution} has no interaction {name:?}"),
        _ => bail!(
            "execution {execution} waits on several interactions: name one with --interaction"
        ),
    };
    let applied = handlers::complete_interaction(
        api,
        InteractionMessage {
            kind: INTERACTION_KIND.into(),
            execution_id: execution,
            interaction: target.id.clone(),
            token: target.token.clone(),
            verdict,
            payload,
            unit: None,
        },
    )
    .await?;
    let record = applied.record();
    out.show(
        &json!({"executionId": execution, "status": record.status, "version": record.version}),
        || {
            format!(
                "{execution} {} ({} {:?})",
                record.status, target.id, verdict
            )
        },
    );
    Ok(())
}

/// The stage's four DLQs: execution, launch, reply, start.
pub(crate) fn dead_letter_queues(stage: &Stage) -> Result<[SqsDeadLetterQueue; 4]> {
    let sqs = aws_sdk_sqs::Client::new(&stage.sdk);
    let queue = |logical: &str| -> Result<SqsDeadLetterQueue> {
        Ok(SqsDeadLetterQueue::new(
            sqs.clone(),
            stage.stack.queue(logical)?.1,
        ))
    };
    Ok([
        queue("ExecutionDeadLetterQueue")?,
        queue("LaunchDeadLetterQueue")?,
        queue("ReplyDeadLetterQueue")?,
        queue("StartDeadLetterQueue")?,
    ])
}

pub(crate) fn dlqs_of(queues: &[SqsDeadLetterQueue; 4]) -> DeadLetterQueues<'_> {
    DeadLetterQueues {
        execution: &queues[0],
        launch: &queues[1],
        reply: &queues[2],
        start: Some(&queues[3]),
    }
}

/// A DLQ by name.
pub(crate) fn dlq_reader<'a>(
    queues: &'a [SqsDeadLetterQueue; 4],
    name: &str,
) -> Result<&'a SqsDeadLetterQueue> {
    Ok(match name {
        "execution" => &queues[0],
        "launch" => &queues[1],
        "reply" => &queues[2],
        "start" => &queues[3],
        other => bail!("unknown DLQ {other:?} (execution, launch, reply, start)"),
    })
}

/// Up to `max` messages of a DLQ, left in place (made visible again at once).
pub(crate) async fn peek(reader: &SqsDeadLetterQueue, max: usize) -> Result<Vec<Value>> {
    let mut seen = Vec::new();
    while seen.len() < max {
        let batch = reader.receive(max - seen.len()).await?;
        if batch.is_empty() {
            break;
        }
        seen.extend(batch);
    }
    for m in &seen {
        reader.release(&m.handle).await?;
    }
    Ok(seen
        .iter()
        .map(|m| json!({"body": serde_json::from_str::<Value>(&m.body).unwrap_or(Value::String(m.body.clone())), "attributes": m.attributes, "sentAt": m.sent_at}))
        .collect())
}

async fn dlq(stage: &Stage, api: &Coordinator, action: DlqAction, out: &Output) -> Result<()> {
    let queues = dead_letter_queues(stage)?;
    let dlqs = dlqs_of(&queues);
    match action {
        DlqAction::Inspect { queue: name, max } => {
            let listed = peek(dlq_reader(&queues, &name)?, max).await?;
            out.show(&Value::Array(listed.clone()), || {
                listed
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join("\n")
            });
        }
        DlqAction::Replay { filter } => {
            let response =
                handlers::operator(api, &dlqs, OperatorRequest::Replay(filter.request())).await?;
            out.show(&serde_json::to_value(&response)?, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
        DlqAction::Move {
            queue: name,
            filter,
        } => {
            let source = match name.as_str() {
                "launch" => MoveSource::Launch,
                "reply" => MoveSource::Reply,
                "start" => MoveSource::Start,
                other => bail!("unknown queue {other:?} (launch, reply, start)"),
            };
            let request = OperatorRequest::Move(MoveRequest {
                queue: source,
                replay: filter.request(),
            });
            let response = handlers::operator(api, &dlqs, request).await?;
            out.show(&serde_json::to_value(&response)?, || {
                serde_json::to_string_pretty(&response).unwrap_or_default()
            });
        }
    }
    Ok(())
}
