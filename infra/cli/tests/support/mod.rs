//! What the CLI's end-to-end tests share: a stage the local stack runs with the example workers.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;
use stepline::domain::StepError;
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline::Coordinator;
use stepline_local::{fresh_stage, functions, LocalStack};

/// A process's standard output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `stepline --stage <stage> <args>`.
pub fn stepline(stage: &str, args: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_stepline"))
        .args(["--stage", stage])
        .args(args)
        .output()
        .with_context(|| format!("running `stepline {}`", args.join(" ")))
}

/// Submits an execution with the CLI; its id.
pub fn submit(stage: &str, pipeline: &str, input: &Value) -> Result<String> {
    let input = input.to_string();
    let args = [
        "submit",
        "--pipeline",
        pipeline,
        "--tenant",
        "cli",
        "--input",
        &input,
    ];
    let submitted = stepline_json(stage, &args)?;
    Ok(submitted["execution"]
        .as_str()
        .with_context(|| format!("submit printed no execution id: {submitted}"))?
        .to_string())
}

/// Runs `stepline --stage <stage> --json <args>`, which must succeed; the JSON it printed.
pub fn stepline_json(stage: &str, args: &[&str]) -> Result<Value> {
    let out = stepline(stage, &[&["--json"], args].concat())?;
    let command = args[0];
    ensure!(
        out.status.success(),
        "{command} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout(&out).trim())
        .with_context(|| format!("{command} printed no JSON: {}", stdout(&out)))
}

/// The order steps, each taking a moment (so `watch` and the console have progress to follow).
pub struct Paced;

#[async_trait::async_trait]
impl StepFunction for Paced {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if request.step_id == "notify"
            || request.step_id == "validate" && input.get("table").is_some()
        {
            return restaurant_approval::RestaurantSteps
                .run(request, input)
                .await;
        }
        order_worker::OrderSteps.run(request, input).await
    }
}

/// A fresh stage with the order and restaurant examples released and their workers running.
pub async fn running_stack(prefix: &str) -> Result<(LocalStack, stepline_local::Runner)> {
    let local = LocalStack::up(&fresh_stage(prefix)).await?;
    let (orders, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(orders, order_worker::RELEASE_VERSION, 60)
        .await?;
    local.release_restaurant().await?;
    let runner = local.run_workers(vec![
        (
            functions::ORDER_WORKER,
            order_worker::contract(),
            Arc::new(Paced),
        ),
        (
            "RestaurantWorkerFunction",
            restaurant_approval::contract(),
            Arc::new(Paced),
        ),
    ])?;
    Ok((local, runner))
}

/// A running stack (see [`running_stack`]): its stage's name, an operator's client of it, and what
/// keeps it running (held to the end of the test).
pub async fn running_stage(
    prefix: &str,
) -> Result<(String, Coordinator, (LocalStack, stepline_local::Runner))> {
    let (local, runner) = running_stack(prefix).await?;
    let stage = local.stack.stage.clone();
    let api = local.operator()?;
    Ok((stage, api, (local, runner)))
}
