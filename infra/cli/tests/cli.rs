//! The operator CLI (`stepline`), driven as a process against stages the local stack runs on the
//! emulator.

mod support;

use std::process::Output;
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};
use stepline::domain::Status;
use support::{running_stack, running_stage, stdout};

/// Runs `stepline --stage <stage> <args>`.
fn stepline(stage: &str, args: &[&str]) -> Output {
    support::stepline(stage, args).expect("the CLI runs")
}

/// Submits an execution with the CLI; its id.
fn submit(stage: &str, pipeline: &str, input: &Value) -> String {
    support::submit(stage, pipeline, input).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_an_execution_step_by_step_to_its_end() -> Result<()> {
    stepline_local::needs_emulator!();
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
    stepline_local::needs_emulator!();
    let (stage, api, _running) = running_stage("cli-approve").await?;
    let restaurant = |n| {
        submit(
            &stage,
            "restaurant-approval",
            &restaurant_approval::sample_order(n),
        )
    };
    let (approved, rejected) = (restaurant(0), restaurant(1));
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

/// Waits (with a deadline) until the execution ends; returns its status.
async fn ended(api: &stepline::Coordinator, id: &str) -> Result<Status> {
    let id = id.parse()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status = api.get(id).await?.status;
        if status.is_terminal() {
            return Ok(status);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "{id} still {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_the_failed_executions_and_history_tells_each_attempt() -> Result<()> {
    stepline_local::needs_emulator!();
    let (stage, api, _running) = running_stage("cli-list").await?;
    let good = submit(&stage, "orders", &order_worker::sample_order(1));
    let bad = submit(&stage, "orders", &json!({"orderId": "empty", "lines": []}));
    let other = submit(
        &stage,
        "orders",
        &json!({"orderId": "zero", "lines": [{"sku": "tea", "qty": 0, "unitCents": 1}]}),
    );
    assert_eq!(ended(&api, &good).await?, Status::Succeeded);
    assert_eq!(ended(&api, &bad).await?, Status::Failed);
    assert_eq!(ended(&api, &other).await?, Status::Failed);

    let out = stepline(
        &stage,
        &[
            "--json",
            "list",
            "--pipeline",
            "orders",
            "--status",
            "FAILED",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_str(stdout(&out).trim())?;
    let listed: Vec<&str> = page["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["executionId"].as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        [other.as_str(), bad.as_str()],
        "newest first, FAILED only"
    );
    assert_eq!(page["executions"][0]["errorCode"], "INVALID_ORDER");
    let human = stdout(&stepline(&stage, &["list", "--pipeline", "orders"]));
    for id in [&good, &bad, &other] {
        assert!(human.contains(id.as_str()), "{human}");
    }
    // Pages: one execution at a time, following `next`.
    let first = stepline(
        &stage,
        &["--json", "list", "--pipeline", "orders", "--limit", "1"],
    );
    let first: Value = serde_json::from_str(stdout(&first).trim())?;
    assert_eq!(first["executions"][0]["executionId"], other.as_str());
    let next = first["next"].as_str().expect("a next page");
    let second = stepline(
        &stage,
        &[
            "--json",
            "list",
            "--pipeline",
            "orders",
            "--limit",
            "1",
            "--after",
            next,
        ],
    );
    let second: Value = serde_json::from_str(stdout(&second).trim())?;
    assert_eq!(second["executions"][0]["executionId"], bad.as_str());

    let out = stepline(&stage, &["--json", "history", &good]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let history: Value = serde_json::from_str(stdout(&out).trim())?;
    let attempts = history["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{history:#}");
    for (k, a) in attempts.iter().enumerate() {
        assert_eq!(a["step"], k);
        assert_eq!(a["outcome"], "SUCCEEDED");
        assert!(a["durationMs"].as_i64().unwrap() >= 300, "paced steps: {a}");
        let launch = stepline::domain::launch_id(good.parse()?, k as u32, 1);
        assert_eq!(a["launchId"], launch.to_string());
    }
    assert_eq!(attempts[2]["output"]["orderId"], "order-1");
    let human = stdout(&stepline(&stage, &["history", &bad]));
    assert!(
        human.contains("step 1 (validate) failed, attempt 1: INVALID_ORDER"),
        "{human}"
    );
    assert!(human.contains("ended FAILED: INVALID_ORDER"), "{human}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_submits_one_execution_per_line_all_of_which_succeed_and_again_nothing_twice(
) -> Result<()> {
    stepline_local::needs_emulator!();
    let local = stepline_local::LocalStack::up(&stepline_local::fresh_stage("cli-bulk")).await?;
    let (orders, _) = local.stack.queue("OrderRequestQueue")?;
    // A step waits behind the whole backlog of the file on the one local worker: its deadline is
    // long enough for that, as a deployment's would be for its workers' concurrency.
    local
        .release_example(orders, order_worker::RELEASE_VERSION, 900)
        .await?;
    let _runner = local.run_workers(vec![(
        stepline_local::functions::ORDER_WORKER,
        order_worker::contract(),
        std::sync::Arc::new(order_worker::OrderSteps),
    )])?;
    let stage = local.stack.stage.clone();
    let count: usize = stepline_local::testing::sized(120, 1000);
    let dir = std::env::temp_dir().join(&stage);
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("orders.jsonl");
    let mut lines: Vec<String> = (1..=count)
        .map(|n| order_worker::sample_order(n).to_string())
        .collect();
    lines.insert(count / 2, String::new()); // a blank line is no execution
    std::fs::write(&file, lines.join("\n") + "\n")?;
    let submit_file = |file: &std::path::Path| -> Vec<String> {
        let args = "submit --pipeline orders --tenant bulk --file";
        let mut args: Vec<String> = args.split(' ').map(String::from).collect();
        args.push(file.to_string_lossy().into_owned());
        args
    };
    let args = [vec!["--json".to_string()], submit_file(&file)].concat();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let results = submitted(stepline(&stage, &args))?;
    assert_eq!(results.len(), count);
    assert!(
        results.iter().all(|r| r["duplicate"] == json!(false)),
        "{results:?}"
    );
    let mut ids: Vec<uuid::Uuid> = results
        .iter()
        .map(|r| r["executionId"].as_str().unwrap().parse().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), count, "one execution per line");

    // Every one of them runs to its end and succeeds.
    let api = local.operator()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(1200);
    let mut running = ids.clone();
    while !running.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {count} still running",
            running.len()
        );
        let mut still = Vec::new();
        for id in running {
            match api.get(id).await?.status {
                Status::Succeeded => {}
                status if status.is_terminal() => panic!("{id} ended {status}"),
                _ => still.push(id),
            }
        }
        running = still;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The same file again submits nothing: every line names the execution it started.
    let repeated = submitted(stepline(&stage, &args))?;
    assert!(repeated.iter().all(|r| r["duplicate"] == json!(true)));
    assert_eq!(
        repeated
            .iter()
            .map(|r| &r["executionId"])
            .collect::<Vec<_>>(),
        results
            .iter()
            .map(|r| &r["executionId"])
            .collect::<Vec<_>>()
    );

    // A line that is not JSON stops the file before anything is submitted.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"orderId\": \"late-1\"}\n{not json\n")?;
    let bad_args = submit_file(&bad);
    let bad_args: Vec<&str> = bad_args.iter().map(String::as_str).collect();
    let refused = stepline(&stage, &bad_args);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("line 2 is not JSON"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // Its first line's execution (named by the line's key) does not exist.
    let prefix = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, &std::fs::read(&bad)?);
    let key = format!("{}/1", prefix.simple());
    let first_line = stepline::domain::idempotent_id("bulk", "orders", &key);
    assert!(
        api.get(first_line).await.is_err(),
        "nothing of the bad file was submitted"
    );
    Ok(())
}

/// What `submit --file --json` printed, one result per line; it must have succeeded.
fn submitted(out: Output) -> Result<Vec<Value>> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_str(stdout(&out).trim())?)
}
