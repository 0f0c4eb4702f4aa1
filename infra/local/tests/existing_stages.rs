//! The local tools on a stage that already exists, driven as processes on the local emulator: what an
//! operator set (the active release, the parameters the stage was created with) survives a runner
//! restart and commands that only read the stage.

use std::sync::{Arc, Mutex};

use anyhow::Result;
use aws_sdk_dynamodb::config::ConfigBag;
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::Value;
use stepline::SubmitRequest;
use stepline_local::iam::HttpCall;
use stepline_local::observe::{observed_clients, Observer};
use stepline_local::{fresh_stage, LocalStack, Stage};

mod support;

use support::{run, stepline_binary, RunProcess};

/// Runs `stepline --stage <stage> <args>`, which must succeed.
fn stepline(stage: &str, args: &[&str]) -> String {
    let out = run(stepline_binary(), &[&["--stage", stage], args].concat());
    assert!(
        out.status.success(),
        "stepline {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A submission of the example's sample order for `tenant`.
fn sample_submission(tenant: &str) -> SubmitRequest {
    SubmitRequest {
        pipeline_id: order_worker::PIPELINE_ID.into(),
        tenant: tenant.into(),
        input: order_worker::sample_order(1),
        ..Default::default()
    }
}

async fn active_release(local: &LocalStack) -> Result<Option<String>> {
    let api = local.operator()?;
    Ok(api
        .registry()
        .active(order_worker::PIPELINE_ID)
        .await?
        .map(|a| a.release_version))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_runner_keeps_the_release_an_operator_activated() -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("restart-release");
    let mut first = RunProcess::started(&stage, "first", &[])?;
    let local = LocalStack::find(&stage).await?;
    assert_eq!(
        active_release(&local).await?.as_deref(),
        Some(order_worker::RELEASE_VERSION),
        "a runner activates its release on a pipeline without an active one"
    );

    // The operator registers the example's definition from a pipeline file (the CLI links no pipeline).
    let (queue, _) = local.stack.queue(stepline_local::ORDER_REQUEST_QUEUE)?;
    let definition = order_worker::pipeline(queue);
    let file = std::env::temp_dir().join(format!("{stage}-orders.json"));
    std::fs::write(
        &file,
        serde_json::json!({"pipelineId": definition.pipeline_id, "steps": definition.steps})
            .to_string(),
    )?;
    let file = file.to_string_lossy();
    stepline(
        &stage,
        &["releases", "register", "--file", &file, "--release", "2"],
    );
    let pipeline = ["releases", "--pipeline", order_worker::PIPELINE_ID];
    stepline(&stage, &[&pipeline[..], &["activate", "2"]].concat());
    first.kill();
    let _second = RunProcess::started(&stage, "second", &[])?;

    assert_eq!(active_release(&local).await?.as_deref(), Some("2"));
    let api = local.operator()?;
    let history = api.registry().history(order_worker::PIPELINE_ID).await?;
    assert_eq!(
        history
            .iter()
            .map(|a| a.release_version.as_str())
            .collect::<Vec<_>>(),
        [order_worker::RELEASE_VERSION, "2"],
        "the restart appended an activation"
    );
    let submitted = api.submit(sample_submission("restart")).await?;
    // Pinned at submission; the example worker of release 1 running here would refuse its requests,
    // which is the release identity check working, not this test's concern.
    let record = api.get(submitted.execution).await?;
    assert_eq!(
        record.release_version, "2",
        "new executions pin the active release"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_commands_attach_to_a_stage_run_with_other_parameters() -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("attach");
    let _runner = RunProcess::started(&stage, "run", &["--param", "QueueVisibilitySeconds=30"])?;

    let out = run(
        env!("CARGO_BIN_EXE_stepline-local"),
        &["releases", "--stage", &stage, "list"],
    );
    assert!(
        out.status.success(),
        "releases list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        listed[0]["releaseVersion"],
        order_worker::RELEASE_VERSION,
        "{listed}"
    );

    let local = LocalStack::find(&stage).await?;
    let visibility = local
        .queue_attributes(
            "OrderRequestQueue",
            &[QueueAttributeName::VisibilityTimeout],
        )
        .await?
        .remove(&QueueAttributeName::VisibilityTimeout);
    assert_eq!(visibility.as_deref(), Some("30"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_commands_on_a_missing_stage_fail_and_create_nothing() -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("missing");
    let out = run(
        env!("CARGO_BIN_EXE_stepline-local"),
        &["releases", "--stage", &stage, "list"],
    );
    assert!(!out.status.success(), "listed releases of a missing stage");
    let sdk = stepline::aws::sdk_config().await;
    let queues = aws_sdk_sqs::Client::new(&sdk)
        .list_queues()
        .queue_name_prefix(format!("stepline-{stage}-"))
        .send()
        .await?;
    assert!(queues.queue_urls().is_empty(), "{queues:?}");
    let dynamodb = aws_sdk_dynamodb::Client::new(&sdk);
    for table in ["executions", "releases"] {
        let found = dynamodb
            .describe_table()
            .table_name(format!("stepline-{stage}-{table}"))
            .send()
            .await;
        let missing = matches!(&found, Err(e) if e
            .as_service_error()
            .is_some_and(|s| s.is_resource_not_found_exception()));
        assert!(missing, "table {table}: {found:?}");
    }
    Ok(())
}

/// The calls a set of clients made, each named by its operation (`DynamoDB_20120810.PutItem`).
#[derive(Debug, Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Observer for Calls {
    fn name(&self) -> &'static str {
        "calls"
    }

    fn request(&self, call: HttpCall, _: &mut ConfigBag) -> Result<(), BoxError> {
        self.0.lock().expect("calls").push(call.operation());
        Ok(())
    }
}

impl Calls {
    fn taken(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("calls"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reaches_a_stage_by_its_names_and_a_submit_makes_only_the_calls_it_needs(
) -> Result<()> {
    stepline_local::needs_emulator!();
    let stage = fresh_stage("reach");
    let local = LocalStack::up(&stage).await?;
    let (queue, _) = local.stack.queue(stepline_local::ORDER_REQUEST_QUEUE)?;
    local
        .release_example(queue, order_worker::RELEASE_VERSION, 30)
        .await?;

    // The operator CLI's way in: the stage by the names its template gives, and the URLs of the
    // queues its configuration names alone (launch, reply, start, and the four DLQs).
    let calls = Calls::default();
    let sdk = stepline::aws::sdk_config().await;
    let clients = observed_clients(&stepline::aws::Clients::new(&sdk), calls.clone());
    let reached = Stage::reach_on(&stage, sdk, clients).await?;
    let api = reached.operator()?;
    assert_eq!(
        calls.taken(),
        ["AmazonSQS.GetQueueUrl"; 7],
        "reaching the stage"
    );

    // A submit: the pipeline's active release read, the record created, its first request sent
    // (the request queue's URL looked up once, by the name the release gives).
    let submitted = api.submit(sample_submission("t")).await?;
    // A process's first submit also reads the release it pins and the workers' announcements (a
    // draining release takes no new executions); a warm one has both cached.
    let made = calls.taken();
    let expected = [
        "DynamoDB_20120810.Query",
        "DynamoDB_20120810.GetItem",
        "DynamoDB_20120810.Query",
        "DynamoDB_20120810.PutItem",
        "AmazonSQS.GetQueueUrl",
        "AmazonSQS.SendMessageBatch",
    ];
    assert_eq!(made, expected, "a submit's calls");
    let record = api.get(submitted.execution).await?;
    assert_eq!(
        record.status,
        stepline::domain::Status::Running,
        "{record:#?}"
    );

    Ok(())
}
