//! `stepline`: the operator CLI. Works against any deployed stage of template.yaml, on AWS (standard
//! AWS configuration and credentials) or on an emulator (`AWS_ENDPOINT_URL`). Human-readable output by
//! default, `--json` for scripts.

mod console;
mod dlq;
mod init;
mod render;
mod submit;

use dlq::*;
use render::*;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{json, Value};
use stepline::config::{CoordinatorConfig, Inbox};
use stepline::domain::history::describe;
use stepline::domain::Timestamp;
use stepline::domain::{Execution, Status, StepStatus, UnitProgress, Verdict};
use stepline::envelope::{InteractionMessage, INTERACTION_KIND};
use stepline::handlers::{
    self, CancelRequest, DeadLetterQueues, MoveRequest, OperatorRequest, RedriveRequest,
};
use stepline::handlers::{ReplayFilter, ReplayRequest};
use stepline::ports::DeadLetterQueue;
use stepline::{Coordinator, SubmitRequest};
use stepline_stage::releases::{FilesOnly, ReleaseAction};
use stepline_stage::{functions, Stage};
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
        #[arg(long, default_value = "{}", conflicts_with = "file")]
        input: String,
        /// With --file: the prefix of each line's key (`<prefix>/<line>`; default: the file's digest).
        #[arg(long)]
        idempotency_key: Option<String>,
        #[arg(long)]
        release: Option<String>,
        /// A JSON Lines file: one execution per line, its input; submitted in batches, each line on
        /// its own key, so that running the file again submits nothing twice.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
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
        /// Continue on this release of the pipeline (a hotfix): refused unless it keeps the steps
        /// before the failed one and the failed step's input, and has every step after it.
        #[arg(long)]
        release: Option<String>,
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
        /// Continue each on this release of its pipeline (a hotfix): a move it cannot continue on
        /// is refused (INCOMPATIBLE_RELEASE), reported, and left in the DLQ.
        #[arg(long)]
        onto: Option<String>,
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
    /// The release the execution failed on (a request's or reply's release).
    #[arg(long)]
    release: Option<String>,
    /// The step (its id) it failed at.
    #[arg(long)]
    step: Option<String>,
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
    fn request(&self, onto_release: Option<String>) -> ReplayRequest {
        ReplayRequest {
            filter: ReplayFilter {
                pipeline_id: self.pipeline.clone(),
                tenant: self.tenant.clone(),
                error_code: self.error_code.clone(),
                release_version: self.release.clone(),
                step_id: self.step.clone(),
                from: self.from.map(Timestamp::from_millis),
                to: self.to.map(Timestamp::from_millis),
            },
            dry_run: self.dry_run,
            max_messages: self.max,
            rate_per_second: self.rate,
            reason: self.reason.clone(),
            onto_release,
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
    let stage = Stage::reach(&cli.stage)
        .await
        .with_context(|| format!("reaching stage {}", cli.stage))?;
    let api = stage.operator()?;
    let out = Output { json: cli.json };
    match cli.command {
        Command::Submit {
            pipeline,
            tenant,
            idempotency_key,
            release,
            file: Some(path),
            ..
        } => {
            let request = submit::FileSubmission {
                pipeline,
                tenant,
                release,
                key_prefix: idempotency_key,
                path,
            };
            submit::submit_file(&api, request, &out).await?;
        }
        Command::Submit {
            pipeline,
            tenant,
            input,
            idempotency_key,
            release,
            file: None,
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
            out.show(&submitted, || {
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
                    from: from.map(Timestamp::from_millis),
                    to: to.map(Timestamp::from_millis),
                    limit,
                    after,
                })
                .await?;
            out.show(&page, || listing(&page));
        }
        Command::History { execution } => {
            let history = api.history(execution).await?;
            out.show(&history, || story(&history));
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
            out.show(&response, || format!("{execution} {}", response.status));
        }
        Command::Redrive {
            execution,
            reason,
            expected_version,
            release,
        } => {
            let expected_version = match expected_version {
                Some(v) => v,
                None => api.get(execution).await?.version,
            };
            let request = RedriveRequest {
                execution_id: execution,
                expected_version,
                reason,
                release_version: release,
            };
            let response = handlers::redrive(&api, request).await?;
            out.show(&response, || {
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
                            w.seen_at.millis()
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
