//! The HTTP API (`functions/api`) on the local emulator: requests are built as `lambda_http::Request`s
//! and handed to `stepline::http::handle_for`, the function the Lambda binary runs, as the template's
//! function of the route's audience would run it (its environment, its IAM policies checked): the
//! submit endpoint `ApiFunction`, the operator's `OperatorApiFunction`, the administrator's
//! `AdminApiFunction`. Every test checks status codes and, for refusals, the stable error code.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use order_worker::OrderSteps;
use serde_json::{json, Value};
use stepline::contract::Contract;
use stepline::domain::{PipelineDef, Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::http::lambda_http::http::{self, header, HeaderMap};
use stepline::http::lambda_http::{Body, Request};
use stepline::http::{Audience, Audiences};
use stepline::release::{Artifact, Release};
use stepline::worker::StepFunction;
use stepline_suite::{on_emulator, TestStack};
use uuid::Uuid;

/// Writes per execution of the three-step pipeline without retries: the create (which launches the
/// first step) and three replies.
const HAPPY_PATH_VERSION: u64 = 4;

/// What the API answered.
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    /// The error code of a refusal (empty when the body is not an error).
    fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or_default()
    }

    fn message(&self) -> &str {
        self.body["error"]["message"].as_str().unwrap_or_default()
    }

    /// Asserts a refusal: its status and code.
    #[track_caller]
    fn refused(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status, self.code()),
            (status, code),
            "body: {}",
            self.body
        );
        assert!(!self.message().is_empty(), "an error has a message");
    }
}

/// The template's function that serves `method` `path`, and what it serves: as a client picks the URL
/// (stack outputs `ApiUrl`, `OperatorApiUrl`, `AdminApiUrl`) by what it does.
fn endpoint(method: &str, path: &str) -> (&'static str, Audiences) {
    let path = path
        .split('?')
        .next()
        .unwrap_or_default()
        .trim_end_matches('/');
    let last = path.rsplit('/').next().unwrap_or_default();
    let operate = ["cancel", "redrive", "interactions"].contains(&last)
        || path.rsplit('/').nth(1) == Some("interactions");
    let administer = method == "POST" && (path == "/releases" || last == "activations");
    if administer {
        ("AdminApiFunction", Audiences::only(Audience::Administer))
    } else if operate {
        ("OperatorApiFunction", Audiences::only(Audience::Operate))
    } else {
        ("ApiFunction", Audiences::only(Audience::Submit))
    }
}

/// Calls the API with a raw body, at the endpoint that serves the route.
async fn call_raw(stack: &TestStack, method: &str, path: &str, body: &str) -> Answer {
    let (function, served) = endpoint(method, path);
    call_at(stack, function, served, method, path, body).await
}

/// Calls the endpoint of `function`, which serves `served`.
async fn call_at(
    stack: &TestStack,
    function: &str,
    served: Audiences,
    method: &str,
    path: &str,
    body: &str,
) -> Answer {
    let coordinator = stack
        .local
        .coordinator(function)
        .expect("the function's coordinator");
    let request: Request = http::Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json")
        .body(if body.is_empty() {
            Body::Empty
        } else {
            Body::from(body.to_string())
        })
        .expect("request builds");
    let response = stepline::http::handle_for(&coordinator, served, request).await;
    assert_eq!(
        response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let body: Value = serde_json::from_slice(response.body().as_ref()).expect("a JSON body");
    Answer {
        status: response.status().as_u16(),
        headers: response.headers().clone(),
        body,
    }
}

async fn get(stack: &TestStack, path: &str) -> Answer {
    call_raw(stack, "GET", path, "").await
}

async fn post(stack: &TestStack, path: &str, body: Value) -> Answer {
    call_raw(stack, "POST", path, &body.to_string()).await
}

/// Posts each (path, body) in order and asserts that each is refused with its status and code.
async fn refused_posts(stack: &TestStack, refusals: &[(&str, Value, u16, &str)]) {
    for (path, body, status, code) in refusals {
        post(stack, path, body.clone()).await.refused(*status, code);
    }
}

/// The string `field` of every element of the JSON array `list`.
fn each<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| e[field].as_str().unwrap())
        .collect()
}

fn submission(stack: &TestStack, n: usize, key: Option<&str>) -> Value {
    let mut body = json!({
        "pipelineId": stack.pipeline.pipeline_id,
        "tenant": "acme",
        "input": order_worker::sample_order(n),
    });
    if let Some(key) = key {
        body["idempotencyKey"] = json!(key);
    }
    body
}

/// A submission of sample order 1 with `field` left out (`None`) or set to `value`.
fn submission_with(stack: &TestStack, field: &str, value: Option<Value>) -> Value {
    let mut body = submission(stack, 1, None);
    match value {
        Some(value) => body[field] = value,
        None => {
            body.as_object_mut().unwrap().remove(field);
        }
    }
    body
}

/// Submits through the API; returns the new execution's id.
async fn submit(stack: &TestStack, n: usize) -> Uuid {
    let answer = post(stack, "/executions", submission(stack, n, None)).await;
    assert_eq!(answer.status, 201, "{}", answer.body);
    answer.body["executionId"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .expect("an execution id")
}

/// The order steps, with `price` held until the gate opens.
#[derive(Default)]
struct Gated {
    open: AtomicBool,
}

#[async_trait]
impl StepFunction for Gated {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id == "price" {
            while !self.open.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        OrderSteps.run(request, input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_is_idempotent_and_status_and_result_follow_the_execution() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("api-submit", |_| {}).await?);
    let body = submission(&stack, 1, Some("order-1"));

    let first = post(&stack, "/executions", body.clone()).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body["duplicate"], false);
    assert_eq!(first.body["version"], 1);
    let id = first.body["executionId"].as_str().unwrap().to_string();
    assert_eq!(
        first.headers.get(header::LOCATION).unwrap(),
        &format!("/executions/{id}")
    );
    let again = post(&stack, "/executions", body.clone()).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["duplicate"], true);
    assert_eq!(again.body["executionId"], id.as_str());

    // No worker runs yet: its first step is launched, the request waits on the worker's queue.
    let queued = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(queued.status, 200, "{}", queued.body);
    assert_eq!(queued.body["executionId"], id.as_str());
    assert_eq!(queued.body["status"], "RUNNING");
    assert_eq!(queued.body["tenant"], "acme");
    assert_eq!(
        queued.body["pipelineId"],
        stack.pipeline.pipeline_id.as_str()
    );
    assert_eq!(
        queued.body["releaseVersion"],
        stack.pipeline.release_version.as_str()
    );
    assert_eq!(
        queued.body["contractVersion"],
        Contract::of(&stack.pipeline).contract_version.as_str()
    );
    assert_eq!(queued.body["step"], 0);
    assert_eq!(queued.body["stepId"], "validate");
    assert_eq!(queued.body["attempt"], 1);
    assert!(queued.body.get("error").is_none());
    assert!(queued.body["createdAt"].as_i64().unwrap() > 0);
    get(&stack, &format!("/executions/{id}/result"))
        .await
        .refused(409, "NOT_FINISHED");

    // Running, held on `price`.
    let gate = Arc::new(Gated::default());
    stack.start(gate.clone())?;
    let uuid: Uuid = id.parse()?;
    stack
        .wait_for(uuid, Duration::from_secs(30), |r| {
            r.status == Status::Running && r.step == 1
        })
        .await?;
    let running = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(running.status, 200);
    assert_eq!(running.body["status"], "RUNNING");
    assert_eq!(running.body["step"], 1);
    assert_eq!(running.body["stepId"], "price");
    assert_eq!(running.body["attempt"], 1);
    get(&stack, &format!("/executions/{id}/result"))
        .await
        .refused(409, "NOT_FINISHED");

    // Finished.
    gate.open.store(true, Ordering::SeqCst);
    stack.wait_terminal(uuid).await?;
    let done = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(done.status, 200);
    assert_eq!(done.body["status"], "SUCCEEDED");
    assert_eq!(done.body["version"], HAPPY_PATH_VERSION);
    assert!(done.body["updatedAt"].as_i64() >= done.body["createdAt"].as_i64());
    let result = get(&stack, &format!("/executions/{id}/result")).await;
    assert_eq!(result.status, 200, "{}", result.body);
    assert_eq!(result.body["executionId"], id.as_str());
    assert_eq!(result.body["status"], "SUCCEEDED");
    assert_eq!(result.body["result"]["orderId"], "order-1");
    assert_eq!(result.body["result"]["totalCents"], 820);

    // The key still names the same execution once it finished.
    let late = post(&stack, "/executions", body).await;
    assert_eq!((late.status, &late.body["duplicate"]), (200, &json!(true)));
    assert_eq!(late.body["executionId"], id.as_str());
    assert_eq!(late.body["version"], HAPPY_PATH_VERSION);
    // Another key is another execution.
    let other = post(
        &stack,
        "/executions",
        submission(&stack, 1, Some("order-1b")),
    )
    .await;
    assert_eq!(other.status, 201);
    assert_ne!(other.body["executionId"], id.as_str());

    // A finished execution can be neither cancelled nor re-driven.
    let cancel = format!("/executions/{id}/cancel");
    let redrive = format!("/executions/{id}/redrive");
    let redrive_again = json!({"expectedVersion": HAPPY_PATH_VERSION, "reason": "again"});
    let too_late = json!({"reason": "too late"});
    refused_posts(
        &stack,
        &[
            (&cancel, too_late, 409, "ALREADY_TERMINAL"),
            (&redrive, redrive_again, 409, "NOT_REDRIVABLE"),
        ],
    )
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_submits_each_item_on_its_own_and_refuses_a_malformed_one_in_its_place(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("api-batch", |_| {}).await?);
    let unknown_pipeline = json!({"pipelineId": "nope", "tenant": "acme", "input": {}});
    // What submitting that one alone answers.
    let alone = post(&stack, "/executions", unknown_pipeline.clone()).await;
    assert!(alone.status >= 400, "{}", alone.body);
    let batch = json!({"executions": [
        submission(&stack, 1, Some("batch-1")),
        submission_with(&stack, "tenant", None),
        submission(&stack, 2, None),
        unknown_pipeline,
        submission(&stack, 1, Some("batch-1")),
    ]});

    let answer = post(&stack, "/executions:batch", batch).await;

    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        (&answer.body["submitted"], &answer.body["refused"]),
        (&json!(3), &json!(2))
    );
    let results = answer.body["results"].as_array().unwrap();
    let indexes: Vec<u64> = results
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indexes, [0, 1, 2, 3, 4], "in the order submitted");
    assert_eq!(results[1]["error"]["code"], "INVALID_BODY");
    assert!(results[1]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tenant"));
    assert_eq!(
        results[3]["error"]["code"],
        alone.code(),
        "as a submission alone"
    );
    // The same key twice in one batch names one execution, created once.
    assert_eq!(results[0]["executionId"], results[4]["executionId"]);
    let created: Vec<&Value> = [&results[0], &results[4]]
        .into_iter()
        .filter(|r| r["duplicate"] == json!(false))
        .collect();
    assert_eq!(created.len(), 1, "{results:?}");
    assert_ne!(results[2]["executionId"], results[0]["executionId"]);
    // Each one submitted runs: its first request is out.
    for result in [&results[0], &results[2]] {
        let id = result["executionId"].as_str().unwrap();
        let status = get(&stack, &format!("/executions/{id}")).await;
        assert_eq!(status.body["status"], "RUNNING", "{}", status.body);
        assert_eq!(status.body["step"], 0);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_unknown_requests_are_refused_with_stable_codes() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("api-bad", |_| {}).await?);
    let unknown = Uuid::new_v4();

    // Bodies.
    for raw in ["{\"pipelineId\": ", ""] {
        let refusal = call_raw(&stack, "POST", "/executions", raw).await;
        refusal.refused(400, "INVALID_BODY");
    }
    // A batch over the limit is refused whole.
    let too_many: Vec<Value> = (0..=stepline::http::MAX_BATCH_ITEMS)
        .map(|n| submission(&stack, n, None))
        .collect();
    post(&stack, "/executions:batch", json!({"executions": too_many}))
        .await
        .refused(400, "INVALID_BODY");
    // Submissions with a field left out (`None`) or set, each refused with its status and code and,
    // where given, a message naming what is wrong (the serde message names the field).
    for (field, value, status, code, named) in [
        ("tenant", None, 400, "INVALID_BODY", Some("tenant")),
        ("input", None, 400, "INVALID_BODY", None),
        (
            "idempotencykey",
            Some(json!("k")),
            400,
            "INVALID_BODY",
            Some("unknown field"),
        ),
        ("tenant", Some(json!(7)), 400, "INVALID_BODY", None),
        ("tenant", Some(json!("")), 400, "INVALID_REQUEST", None),
    ] {
        let refusal = post(&stack, "/executions", submission_with(&stack, field, value)).await;
        refusal.refused(status, code);
        if let Some(named) = named {
            let message = refusal.message();
            assert!(message.contains(named), "{field}: {message}");
        }
    }
    let redrive = format!("/executions/{unknown}/redrive");
    // Without a version, or with a negative one.
    let negative = json!({"expectedVersion": -1, "reason": "negative"});
    for body in [json!({"reason": "no version"}), negative] {
        post(&stack, &redrive, body)
            .await
            .refused(400, "INVALID_BODY");
    }

    // Releases and pipelines that do not exist.
    for (field, value, code) in [
        ("releaseVersion", "9", "UNKNOWN_RELEASE"),
        ("pipelineId", "no-such-pipeline", "NO_ACTIVE_RELEASE"),
    ] {
        let body = submission_with(&stack, field, Some(json!(value)));
        post(&stack, "/executions", body).await.refused(404, code);
    }

    // Ids.
    for path in [
        "/executions/not-a-uuid",
        "/executions/not-a-uuid/result",
        "/executions/not-a-uuid/interactions",
        "/executions/%zz/result",
    ] {
        get(&stack, path).await.refused(400, "INVALID_ID");
    }
    let malformed = json!({"reason": "malformed id"});
    post(&stack, "/executions/123/cancel", malformed)
        .await
        .refused(400, "INVALID_ID");

    // Executions that do not exist.
    for path in [
        format!("/executions/{unknown}"),
        format!("/executions/{unknown}/result"),
        format!("/executions/{unknown}/interactions"),
    ] {
        get(&stack, &path).await.refused(404, "NOT_FOUND");
    }
    for (route, body) in [
        ("cancel", json!({"reason": "gone"})),
        ("redrive", json!({"expectedVersion": 3, "reason": "gone"})),
        (
            "interactions/approval",
            json!({"token": "t", "verdict": "APPROVED"}),
        ),
    ] {
        post(&stack, &format!("/executions/{unknown}/{route}"), body)
            .await
            .refused(404, "NOT_FOUND");
    }

    // Routes and methods.
    for path in ["/", "/nowhere", "/executions/a/b/c/d", "/pipelines/orders"] {
        get(&stack, path).await.refused(404, "NO_ROUTE");
    }
    let delete = call_raw(&stack, "DELETE", &format!("/executions/{unknown}"), "").await;
    delete.refused(405, "METHOD_NOT_ALLOWED");
    assert_eq!(delete.headers.get(header::ALLOW).unwrap(), "GET");
    // `GET /executions` lists (a pipeline is required); other methods are refused.
    get(&stack, "/executions")
        .await
        .refused(400, "INVALID_REQUEST");
    let put = call_raw(&stack, "PUT", "/executions", "").await;
    put.refused(405, "METHOD_NOT_ALLOWED");
    assert_eq!(put.headers.get(header::ALLOW).unwrap(), "GET, POST");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_execution_is_cancelled_once() -> anyhow::Result<()> {
    // No runner: the execution stays queued.
    let stack = on_emulator!(TestStack::new("api-cancel", |_| {}).await?);
    let id = submit(&stack, 2).await;
    let cancel = format!("/executions/{id}/cancel");

    refused_posts(
        &stack,
        &[
            (&cancel, json!({"reason": " "}), 400, "INVALID_REQUEST"),
            (&cancel, json!({}), 400, "INVALID_BODY"),
        ],
    )
    .await;
    let cancelled = post(&stack, &cancel, json!({"reason": "customer withdrew"})).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    assert_eq!(cancelled.body["executionId"], id.to_string());
    assert_eq!(cancelled.body["status"], "CANCELLED");
    assert_eq!(cancelled.body["version"], 2);

    let status = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(status.status, 200);
    assert_eq!(status.body["status"], "CANCELLED");
    assert_eq!(status.body["error"]["code"], "CANCELLED");
    assert_eq!(status.body["error"]["message"], "customer withdrew");
    get(&stack, &format!("/executions/{id}/result"))
        .await
        .refused(409, "NOT_SUCCEEDED");
    let redrive = format!("/executions/{id}/redrive");
    let not_failed = json!({"expectedVersion": 2, "reason": "cancelled is not failed"});
    refused_posts(
        &stack,
        &[
            (&cancel, json!({"reason": "twice"}), 409, "ALREADY_TERMINAL"),
            (&redrive, not_failed, 409, "NOT_REDRIVABLE"),
        ],
    )
    .await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_needs_the_current_version() -> anyhow::Result<()> {
    let (stack, steps) =
        on_emulator!(TestStack::with_failing_pricing("api-redrive", false, |_| {}).await?);
    let id = submit(&stack, 4).await;
    // Settled: failed, and its dead-letter envelope sent (which is one more write).
    stack.wait_dead_lettered(id).await?;

    let failed = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(failed.status, 200);
    assert_eq!(failed.body["status"], "FAILED");
    assert_eq!(failed.body["stepId"], "price");
    assert_eq!(failed.body["attempt"], 1);
    assert_eq!(failed.body["error"]["code"], "PRICING_DOWN");
    assert_eq!(failed.body["error"]["retryable"], false);
    let version = failed.body["version"].as_u64().unwrap();
    get(&stack, &format!("/executions/{id}/result"))
        .await
        .refused(409, "NOT_SUCCEEDED");

    let path = format!("/executions/{id}/redrive");
    let redrive =
        |version: u64, reason: &str| json!({"expectedVersion": version, "reason": reason});
    refused_posts(
        &stack,
        &[
            (
                &path,
                redrive(version - 1, "stale view"),
                409,
                "VERSION_CONFLICT",
            ),
            (&path, redrive(version, ""), 400, "INVALID_REQUEST"),
        ],
    )
    .await;
    assert_eq!(
        stack.api.get(id).await?.version,
        version,
        "refused re-drives change nothing"
    );

    steps.failing.store(false, Ordering::SeqCst);
    let redriven = post(&stack, &path, redrive(version, "pricing restored")).await;
    assert_eq!(redriven.status, 200, "{}", redriven.body);
    assert_eq!(redriven.body["status"], "QUEUED");
    assert_eq!(redriven.body["version"], version + 1);
    // The same re-drive again is stale now.
    post(&stack, &path, redrive(version, "pricing restored"))
        .await
        .refused(409, "NOT_REDRIVABLE");

    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(steps.price_runs(), 2);
    let result = get(&stack, &format!("/executions/{id}/result")).await;
    assert_eq!(result.status, 200);
    assert_eq!(result.body["result"]["totalCents"], 500 + 320);
    let cancel = format!("/executions/{id}/cancel");
    post(&stack, &cancel, json!({"reason": "done already"}))
        .await
        .refused(409, "ALREADY_TERMINAL");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_are_registered_once_and_activated_by_version() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("api-releases", |_| {}).await?);
    let pipeline = stack.pipeline.pipeline_id.clone();
    let mut def = stack.pipeline.clone();
    def.release_version = "2".into();
    for step in &mut def.steps {
        step.retry.max_attempts = 4;
    }
    let release = Release::new(def.clone(), Vec::new());

    let created = post(&stack, "/releases", serde_json::to_value(&release)?).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["registration"], "CREATED");
    assert_eq!(created.body["pipelineId"], pipeline.as_str());
    assert_eq!(created.body["releaseVersion"], "2");
    assert_eq!(
        created.body["contractVersion"],
        release.contract_version.as_str()
    );
    let unchanged = post(&stack, "/releases", serde_json::to_value(&release)?).await;
    assert_eq!(unchanged.status, 200, "{}", unchanged.body);
    assert_eq!(unchanged.body["registration"], "UNCHANGED");

    // Another descriptor under the same version (consistent, but with an artifact).
    let other = Release::new(
        def.clone(),
        vec![Artifact {
            kind: "contract".into(),
            uri: "file:pipeline-contract.json".into(),
            digest: stepline::release::digest(b"{}"),
        }],
    );
    post(&stack, "/releases", serde_json::to_value(&other)?)
        .await
        .refused(409, "RELEASE_CONFLICT");
    // Inconsistent descriptors.
    let mut tampered = release.clone();
    tampered.contract_version = "sha256:00".into();
    post(&stack, "/releases", serde_json::to_value(&tampered)?)
        .await
        .refused(400, "INVALID_RELEASE");
    let mut renamed = Release::new(
        PipelineDef {
            release_version: "3".into(),
            ..def.clone()
        },
        Vec::new(),
    );
    renamed.release_version = "4".into();
    post(&stack, "/releases", serde_json::to_value(&renamed)?)
        .await
        .refused(400, "INVALID_RELEASE");
    post(&stack, "/releases", json!({"pipelineId": pipeline}))
        .await
        .refused(400, "INVALID_BODY");

    // Activations.
    let activations = format!("/pipelines/{pipeline}/activations");
    let activate =
        |version: &str, reason: &str| json!({"releaseVersion": version, "reason": reason});
    refused_posts(
        &stack,
        &[
            (
                &activations,
                activate("9", "no such release"),
                404,
                "UNKNOWN_RELEASE",
            ),
            (&activations, activate("2", ""), 400, "INVALID_REQUEST"),
            (
                &activations,
                json!({"releaseVersion": "2"}),
                400,
                "INVALID_BODY",
            ),
        ],
    )
    .await;
    let before = get(&stack, &format!("/pipelines/{pipeline}/active")).await;
    assert_eq!(before.status, 200, "{}", before.body);
    assert_eq!(before.body["releaseVersion"], "1");
    let activated = post(&stack, &activations, activate("2", "roll out")).await;
    assert_eq!(activated.status, 201, "{}", activated.body);
    assert_eq!(activated.body["releaseVersion"], "2");
    assert_eq!(activated.body["reason"], "roll out");
    assert_eq!(
        activated.body["sequence"].as_u64(),
        before.body["sequence"].as_u64().map(|s| s + 1)
    );
    let active = get(&stack, &format!("/pipelines/{pipeline}/active")).await;
    assert_eq!(active.status, 200);
    assert_eq!(active.body["releaseVersion"], "2");

    let list = get(&stack, &format!("/pipelines/{pipeline}/releases")).await;
    assert_eq!(list.status, 200, "{}", list.body);
    let mut versions = each(&list.body, "releaseVersion");
    versions.sort_unstable();
    assert_eq!(versions, ["1", "2"]);
    let listed: Vec<Release> = serde_json::from_value(list.body.clone())?;
    assert!(listed.contains(&release), "descriptors are listed whole");

    // A new execution pins the active release.
    let id = submit(&stack, 1).await;
    let status = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(status.body["releaseVersion"], "2");
    assert_eq!(
        status.body["contractVersion"],
        release.contract_version.as_str()
    );

    // A pipeline nobody registered.
    get(&stack, "/pipelines/no-such-pipeline/active")
        .await
        .refused(404, "NO_ACTIVE_RELEASE");
    let none = get(&stack, "/pipelines/no-such-pipeline/releases").await;
    assert_eq!((none.status, none.body.clone()), (200, json!([])));
    post(
        &stack,
        "/pipelines/no-such-pipeline/activations",
        activate("1", "x"),
    )
    .await
    .refused(404, "UNKNOWN_RELEASE");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactions_are_listed_and_completed_once() -> anyhow::Result<()> {
    // The approval notice goes to a queue nobody reads: the test finds the token through the API.
    let (stack, _) = on_emulator!(TestStack::with_approval("api-await", 600).await?);
    let id = submit(&stack, 1).await;
    let interactions = format!("/executions/{id}/interactions");
    let none = get(&stack, &interactions).await;
    assert_eq!(none.status, 200);
    stack
        .wait_for(id, Duration::from_secs(30), |r| {
            r.status == Status::WaitingExternal
        })
        .await?;

    let listed = get(&stack, &interactions).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let list = listed.body.as_array().unwrap();
    assert_eq!(list.len(), 1, "{}", listed.body);
    assert_eq!(list[0]["interactionId"], "manager");
    assert_eq!(list[0]["completed"], false);
    assert!(!list[0]["idempotencyKey"].as_str().unwrap().is_empty());
    assert!(list[0]["deadline"].as_i64().unwrap() > stack.api.now().millis());
    let token = list[0]["token"].as_str().unwrap().to_string();
    let status = get(&stack, &format!("/executions/{id}")).await;
    assert_eq!(status.body["status"], "WAITING_EXTERNAL");
    assert_eq!(status.body["stepId"], "approve");

    let manager = format!("{interactions}/manager");
    let somebody = format!("{interactions}/somebody");
    let answer = |token: &str, verdict: &str| json!({"token": token, "verdict": verdict});
    let made_up = Uuid::new_v4().simple().to_string();
    refused_posts(
        &stack,
        &[
            (&manager, answer(&made_up, "APPROVED"), 403, "INVALID_TOKEN"),
            (
                &somebody,
                answer(&token, "APPROVED"),
                404,
                "UNKNOWN_INTERACTION",
            ),
            (&manager, answer(&token, "MAYBE"), 400, "INVALID_BODY"),
            (
                &manager,
                json!({"verdict": "APPROVED"}),
                400,
                "INVALID_BODY",
            ),
        ],
    )
    .await;

    let approval = json!({"token": token, "verdict": "APPROVED", "payload": {"by": "maria"}});
    let approved = post(&stack, &manager, approval.clone()).await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert_eq!(approved.body["duplicate"], false);
    assert_eq!(approved.body["interactionId"], "manager");
    assert_eq!(approved.body["executionId"], id.to_string());
    // A double click: the same answer again changes nothing.
    let again = post(&stack, &manager, approval.clone()).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.body["duplicate"], true);
    let changed_mind =
        json!({"token": token, "verdict": "REJECTED", "payload": {"reason": "changed my mind"}});
    post(&stack, &manager, changed_mind)
        .await
        .refused(409, "INTERACTION_CONFLICT");

    // The API dispatches the resumed step itself (well before the 60 s lease would let the sweeper).
    let record = stack
        .wait_for(id, Duration::from_secs(30), |r| r.status.is_terminal())
        .await?;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let result = get(&stack, &format!("/executions/{id}/result")).await;
    assert_eq!(result.status, 200);
    assert_eq!(result.body["result"]["totalCents"], 820);
    let after = get(&stack, &interactions).await;
    assert_eq!((after.status, after.body.clone()), (200, json!([])));
    // Once resolved, the same answer is still acknowledged; a new one is refused.
    let late = post(&stack, &manager, approval).await;
    assert_eq!((late.status, &late.body["duplicate"]), (200, &json!(true)));
    assert_eq!(late.body["status"], "SUCCEEDED");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_are_listed_and_their_history_read_over_http() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("api-list", |_| {}).await?);
    let pipeline = stack.pipeline.pipeline_id.clone();
    let first = submit(&stack, 1).await;
    let second = submit(&stack, 2).await;
    stack.start(Arc::new(OrderSteps))?;
    stack.wait_terminal(first).await?;
    stack.wait_terminal(second).await?;

    let listed = get(&stack, &format!("/executions?pipeline={pipeline}")).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    let ids = each(&listed.body["executions"], "executionId");
    assert_eq!(ids, [second.to_string(), first.to_string()], "newest first");
    assert_eq!(listed.body["executions"][0]["status"], "SUCCEEDED");
    let page = get(&stack, &format!("/executions?pipeline={pipeline}&limit=1")).await;
    let next = page.body["next"].as_str().expect("a next page").to_string();
    let rest = get(
        &stack,
        &format!("/executions?pipeline={pipeline}&limit=1&after={next}"),
    )
    .await;
    assert_eq!(rest.body["executions"][0]["executionId"], first.to_string());
    let failed = get(
        &stack,
        &format!("/executions?pipeline={pipeline}&status=FAILED"),
    )
    .await;
    assert_eq!(failed.body["executions"], json!([]));
    // Windows back to the epoch and thousands of years ahead: each call reads a bounded number of
    // index pages, lists what it found, and (back to the epoch) says where to go on.
    let since_1970 = get(&stack, &format!("/executions?pipeline={pipeline}&from=1")).await;
    assert_eq!(since_1970.status, 200, "{}", since_1970.body);
    assert_eq!(
        each(&since_1970.body["executions"], "executionId"),
        [second.to_string(), first.to_string()]
    );
    assert!(since_1970.body["next"].is_string(), "{}", since_1970.body);
    let far_ahead = get(
        &stack,
        &format!("/executions?pipeline={pipeline}&to=1000000000000000"),
    )
    .await;
    assert_eq!(far_ahead.status, 200, "{}", far_ahead.body);
    assert_eq!(
        each(&far_ahead.body["executions"], "executionId"),
        [second.to_string(), first.to_string()]
    );
    get(&stack, "/executions?status=FAILED")
        .await
        .refused(400, "INVALID_REQUEST");
    get(
        &stack,
        &format!("/executions?pipeline={pipeline}&status=LOST"),
    )
    .await
    .refused(400, "INVALID_REQUEST");

    let history = get(&stack, &format!("/executions/{first}/history")).await;
    assert_eq!(history.status, 200, "{}", history.body);
    let outcomes = each(&history.body["attempts"], "outcome");
    assert_eq!(outcomes, ["SUCCEEDED"; 3]);
    let kinds = each(&history.body["entries"], "kind");
    assert_eq!(kinds.first(), Some(&"STARTED"));
    assert_eq!(kinds.last(), Some(&"ENDED"));
    let states = each(&history.body["steps"], "state");
    assert_eq!(states, ["SUCCEEDED"; 3]);
    get(&stack, &format!("/executions/{}/history", Uuid::new_v4()))
        .await
        .refused(404, "NOT_FOUND");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_endpoint_serves_its_audience_and_refuses_the_others_before_anything_is_written(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("api-audiences", |_| {}).await?);
    let id = submit(&stack, 1).await;
    let pipeline = stack.pipeline.pipeline_id.clone();
    let release = Release::new(
        PipelineDef {
            release_version: "9".into(),
            ..stack.pipeline.clone()
        },
        Vec::new(),
    );
    let at = |function: &'static str, audience: Audience| {
        let stack = &stack;
        move |method: &'static str, path: String, body: Value| async move {
            let body = if body.is_null() {
                String::new()
            } else {
                body.to_string()
            };
            call_at(
                stack,
                function,
                Audiences::only(audience),
                method,
                &path,
                &body,
            )
            .await
        }
    };
    let submitter = at("ApiFunction", Audience::Submit);
    let operator = at("OperatorApiFunction", Audience::Operate);
    let administrator = at("AdminApiFunction", Audience::Administer);
    let cancel = json!({"reason": "audience test"});
    let activation = json!({"releaseVersion": "9", "reason": "audience test"});

    let registration = serde_json::to_value(&release)?;
    let key_k = submission(&stack, 2, Some("k"));

    // A submit-only integration can neither touch releases nor act on executions; an operator submits
    // nothing and registers nothing; an administrator acts on no execution.
    for (caller, method, path, body) in [
        (
            &submitter,
            "POST",
            "/releases".to_string(),
            registration.clone(),
        ),
        (
            &submitter,
            "POST",
            format!("/pipelines/{pipeline}/activations"),
            activation.clone(),
        ),
        (
            &submitter,
            "POST",
            format!("/executions/{id}/cancel"),
            cancel.clone(),
        ),
        (
            &submitter,
            "POST",
            format!("/executions/{id}/redrive"),
            json!({"reason": "x"}),
        ),
        (
            &submitter,
            "GET",
            format!("/executions/{id}/interactions"),
            Value::Null,
        ),
        (&operator, "POST", "/executions".to_string(), key_k.clone()),
        (
            &operator,
            "POST",
            "/executions:batch".to_string(),
            json!({"executions": [key_k.clone()]}),
        ),
        (
            &operator,
            "POST",
            "/releases".to_string(),
            registration.clone(),
        ),
        (
            &administrator,
            "POST",
            "/executions".to_string(),
            key_k.clone(),
        ),
        (
            &administrator,
            "POST",
            format!("/executions/{id}/cancel"),
            cancel.clone(),
        ),
    ] {
        caller(method, path, body).await.refused(403, "NOT_SERVED");
    }

    // Nothing refused was written: the release is not registered, the execution is not cancelled,
    // and the idempotency key is still free.
    let releases = submitter(
        "GET",
        format!("/pipelines/{pipeline}/releases"),
        Value::Null,
    )
    .await;
    assert_eq!(releases.status, 200, "{}", releases.body);
    assert!(
        !releases
            .body
            .to_string()
            .contains("\"releaseVersion\":\"9\""),
        "a refused registration wrote nothing: {}",
        releases.body
    );
    let record = stack.api.get(id).await?;
    assert_ne!(record.status, Status::Cancelled);
    let keyed = submitter(
        "POST",
        "/executions".into(),
        submission(&stack, 2, Some("k")),
    )
    .await;
    assert_eq!(keyed.status, 201, "the key was free: {}", keyed.body);

    // The reads are served at every endpoint; each endpoint's own routes work there.
    for read in [&submitter, &operator, &administrator] {
        let status = read("GET", format!("/executions/{id}"), Value::Null).await;
        assert_eq!(status.status, 200, "{}", status.body);
    }
    let registered =
        administrator("POST", "/releases".into(), serde_json::to_value(&release)?).await;
    assert_eq!(registered.status, 201, "{}", registered.body);
    let cancelled = operator("POST", format!("/executions/{id}/cancel"), cancel).await;
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    Ok(())
}
