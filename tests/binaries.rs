//! The real function binaries under the Lambda Runtime API: the test builds every function, serves the
//! Runtime API itself (`next`, `response`, `error`), feeds each binary real event payloads from
//! `tests/fixtures/`, and drives one execution through launch, the worker, completion, claim, the
//! operator function and the HTTP API, on the local emulator. It records each binary's init time (process
//! start to its first `next`).

use anyhow::{bail, Result};
use serde_json::Value;
use stepline::domain::{Status, Timestamp};
use stepline_local::runtime_api::{fixture, sqs_event};
use stepline_suite::{binaries, on_emulator, TestStack};

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_function_binary_serves_real_events_under_the_runtime_api() -> Result<()> {
    let stack = on_emulator!(TestStack::new("e2e-bin", |_| {}).await?);
    let env = |function: &str| stack.function_env(function);
    let arn_of = |logical: &str| -> Result<String> {
        match stack.local.stack.resources.get(logical) {
            Some(stepline_local::stack::Physical::Queue { arn, .. }) => Ok(arn.clone()),
            _ => bail!("no queue {logical}"),
        }
    };
    let mut launch = binaries::start("launch", &env("LaunchFunction")?).await?;
    let mut worker = binaries::start("order-worker", &env("OrderWorkerFunction")?).await?;
    let mut completion = binaries::start("completion", &env("CompletionFunction")?).await?;
    let mut claim = binaries::start("claim", &env("ClaimFunction")?).await?;
    let mut operator = binaries::start("redrive", &env("RedriveFunction")?).await?;
    let mut api = binaries::start("api", &env("ApiFunction")?).await?;

    // The launch binary starts an execution from a StartExecution event on the start queue, which
    // launches its first step: the request is on the worker's queue.
    let event = stepline_local::start_event(
        &uuid::Uuid::new_v4().to_string(),
        serde_json::json!({"pipelineId": "orders", "tenant": "bin", "input": order_worker::sample_order(1)}),
    );
    let answer = launch
        .invoke(sqs_event(&event.to_string(), &arn_of("StartQueue")?)?)
        .await?;
    assert_eq!(answer["batchItemFailures"], serde_json::json!([]));
    let requests = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(requests.len(), 1);
    let request: Value = serde_json::from_str(&requests[0])?;
    let id: uuid::Uuid = serde_json::from_value(request["header"]["executionId"].clone())?;
    assert_eq!(stack.api.get(id).await?.status, Status::Running);
    assert_eq!(stack.queue_depth("LaunchQueue").await?, 0, "no launch work");

    // The worker binary runs the request and replies; the completion binary applies the reply.
    let answer = worker
        .invoke(sqs_event(&requests[0], &arn_of("OrderRequestQueue")?)?)
        .await?;
    assert_eq!(answer["batchItemFailures"], serde_json::json!([]));
    // On the reply queue: its reply, and its announcement of itself (at its first batch).
    let replies = stack.take_all("ReplyQueue").await?;
    let mut kinds: Vec<String> = replies
        .iter()
        .map(|r| serde_json::from_str::<Value>(r).map(|v| v["kind"].to_string()))
        .collect::<Result<_, _>>()?;
    kinds.sort();
    assert_eq!(
        kinds,
        ["\"stepline.reply.v1\"", "\"stepline.worker.v1\""],
        "{replies:?}"
    );
    for reply in &replies {
        let answer = completion
            .invoke(sqs_event(reply, &arn_of("ReplyQueue")?)?)
            .await?;
        assert_eq!(answer["batchItemFailures"], serde_json::json!([]));
    }
    let record = stack.api.get(id).await?;
    assert_eq!(record.step, 1, "the reply advanced the execution");

    // The claim binary answers a scheduled event with its report.
    let report = claim.invoke(fixture("scheduled-event.json", &[])?).await?;
    assert!(report.get("claimed").is_some(), "{report}");

    // The HTTP API binary answers a function-URL request.
    let execution = id.to_string();
    let about_it = |name: &str| fixture(name, &[("EXECUTION_ID", &execution)]);
    let response = api
        .invoke(about_it("function-url-get-execution.json")?)
        .await?;
    assert_eq!(response["statusCode"], 200, "{response}");
    let body: Value = serde_json::from_str(response["body"].as_str().unwrap_or("{}"))?;
    assert_eq!(body["status"], "RUNNING");

    // The operator binary cancels it.
    let answer = operator.invoke(about_it("operator-cancel.json")?).await?;
    assert_eq!(answer["status"], "CANCELLED");
    assert_eq!(stack.api.get(id).await?.status, Status::Cancelled);

    // The other examples' worker binaries: one request each, answered on the reply queue.
    let reply_to = stack.local.stack.queue("ReplyQueue")?.1.to_string();
    let mut others = Vec::new();
    for (binary, function, queue, contract, step, input, pipeline_env) in [
        (
            "restaurant-approval",
            "RestaurantWorkerFunction",
            "RestaurantRequestQueue",
            restaurant_approval::contract(),
            "validate",
            restaurant_approval::sample_order(0),
            None,
        ),
        (
            "csv-payments",
            "CsvWorkerFunction",
            "CsvRequestQueue",
            csv_payments::batch_contract(),
            "parse",
            csv_payments::sample_csv(),
            Some("csv-payments"),
        ),
        (
            "csv-payments",
            "PaymentWorkerFunction",
            "PaymentRequestQueue",
            csv_payments::payment_contract(),
            "pay",
            serde_json::json!({"line": 2, "payee": "Ada", "iban": "GB33BUKB20201555555555", "amountCents": 100}),
            Some("csv-payment"),
        ),
    ] {
        let mut env = env(function)?;
        if let Some(pipeline) = pipeline_env {
            env.insert("WORKER_PIPELINE".into(), pipeline.into());
        }
        let mut f = binaries::start(binary, &env).await?;
        let execution = uuid::Uuid::new_v4();
        let request = stepline::envelope::RequestEnvelope {
            header: stepline::envelope::RequestHeader {
                kind: stepline::envelope::REQUEST_KIND.into(),
                identity: stepline::envelope::Identity {
                    pipeline_id: contract.pipeline_id.clone(),
                    contract_version: contract.contract_version.clone(),
                    release_version: "1".into(),
                },
                tenant: "bin".into(),
                execution_id: execution,
                step_id: step.into(),
                step_index: 0,
                attempt: 1,
                launch_id: stepline::domain::launch_id(execution, 0, 1),
                step_key: String::new(),
                reply_to: reply_to.clone(),
                deadline: Timestamp::from_millis(now_ms() + 60_000),
                reply_token: format!("token-of-{execution}"),
            },
            payload: &input,
        };
        let answer = f
            .invoke(sqs_event(
                &serde_json::to_string(&request)?,
                &arn_of(queue)?,
            )?)
            .await?;
        assert_eq!(
            answer["batchItemFailures"],
            serde_json::json!([]),
            "{function}"
        );
        // Its reply (beside its announcement of itself, at its first batch).
        let replies: Vec<String> = stack
            .take_all("ReplyQueue")
            .await?
            .into_iter()
            .filter(|r| !r.contains("\"stepline.worker.v1\""))
            .collect();
        assert_eq!(replies.len(), 1, "{function} replied");
        let reply: stepline::envelope::ReplyEnvelope = serde_json::from_str(&replies[0])?;
        assert_eq!(reply.execution_id, execution);
        assert_eq!(
            reply.reply_token,
            format!("token-of-{execution}"),
            "{function} returns the request's reply token"
        );
        assert!(
            matches!(
                reply.outcome,
                stepline::envelope::ReplyOutcome::Succeeded { .. }
            ),
            "{function}: {:?}",
            reply.outcome
        );
        others.push(f);
    }

    // Init times: process start to the first `next`.
    for f in [&launch, &worker, &completion, &claim, &operator, &api]
        .into_iter()
        .chain(others.iter())
    {
        let init = f.init_ms().expect("every binary asked for an event");
        eprintln!("init {:<14} {init:>7.1} ms", f.name);
    }
    Ok(())
}
