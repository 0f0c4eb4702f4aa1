//! The operator CLI (`stepline`), driven as a process against stages the local stack runs on the
//! emulator.

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};
use stepline::domain::{Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline_local::{fresh_stage, functions, require_emulator, LocalStack};

/// Runs `stepline --stage <stage> <args>`.
fn stepline(stage: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stepline"))
        .args(["--stage", stage])
        .args(args)
        .output()
        .expect("the CLI runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The order steps, each taking a moment (so `watch` has progress to follow).
struct Paced;

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

async fn running_stack(prefix: &str) -> Result<(LocalStack, stepline_local::Runner)> {
    require_emulator();
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

fn submit(stage: &str, pipeline: &str, input: &Value) -> String {
    let out = stepline(
        stage,
        &[
            "--json",
            "submit",
            "--pipeline",
            pipeline,
            "--tenant",
            "cli",
            "--input",
            &input.to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let submitted: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    submitted["execution"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_an_execution_step_by_step_to_its_end() -> Result<()> {
    let (local, _runner) = running_stack("cli-watch").await?;
    let stage = local.stack.stage.clone();
    let id = submit(&stage, "orders", &order_worker::sample_order(1));

    let watched = tokio::task::spawn_blocking({
        let stage = stage.clone();
        let id = id.clone();
        move || stepline(&stage, &["watch", &id, "--timeout-secs", "60"])
    })
    .await?;

    assert!(
        watched.status.success(),
        "{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let lines: Vec<String> = stdout(&watched).lines().map(str::to_string).collect();
    // Every step is shown, in order, however fast the execution ran past the polls.
    let shown: Vec<usize> = ["validate", "price", "confirm"]
        .iter()
        .enumerate()
        .map(|(k, s)| {
            let line = format!("step {} ({s}) succeeded", k + 1);
            lines
                .iter()
                .position(|l| *l == line)
                .unwrap_or_else(|| panic!("watch did not show {line:?}: {lines:?}"))
        })
        .collect();
    assert!(
        shown.windows(2).all(|w| w[0] < w[1]),
        "steps shown in order: {lines:?}"
    );
    assert!(lines.last().unwrap().starts_with("SUCCEEDED"), "{lines:?}");

    let status = stepline(&stage, &["--json", "status", &id]);
    let record: Value = serde_json::from_str(stdout(&status).trim())?;
    assert_eq!(record["status"], "SUCCEEDED");
    let result = stepline(&stage, &["result", &id]);
    assert!(
        stdout(&result).contains("\"orderId\":\"order-1\""),
        "{}",
        stdout(&result)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_and_reject_from_the_cli() -> Result<()> {
    let (local, _runner) = running_stack("cli-approve").await?;
    let stage = local.stack.stage.clone();
    let api = local.coordinator(functions::REDRIVE)?;
    let approved = submit(
        &stage,
        "restaurant-approval",
        &restaurant_approval::sample_order(0),
    );
    let rejected = submit(
        &stage,
        "restaurant-approval",
        &restaurant_approval::sample_order(1),
    );
    for id in [&approved, &rejected] {
        let id = id.parse()?;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while api.get(id).await?.status != Status::WaitingExternal {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "never waited for approval"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let status = stepline(&stage, &["status", &approved]);
    assert!(
        stdout(&status).contains("waiting on manager"),
        "{}",
        stdout(&status)
    );

    let out = stepline(
        &stage,
        &[
            "approve",
            &approved,
            "--payload",
            &json!({"by": "ana"}).to_string(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = stepline(
        &stage,
        &["reject", &rejected, "--reason", "no truffles left"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let ok = stepline(&stage, &["watch", &approved]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let failed = stepline(&stage, &["watch", &rejected]);
    assert!(
        !failed.status.success(),
        "watch exits non-zero for a failed execution"
    );
    assert!(String::from_utf8_lossy(&failed.stderr).contains("REJECTED"));
    let result = stepline(&stage, &["--json", "result", &approved]);
    let result: Value = serde_json::from_str(stdout(&result).trim())?;
    assert!(result["result"]["message"]
        .as_str()
        .unwrap()
        .contains("approved by ana"));
    Ok(())
}
