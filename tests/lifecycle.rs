//! Lifecycle events on the local emulator: a rule on the project's bus routes them to an SQS queue;
//! a whole run yields one event per transition (deduplicated by event id: publication is at least
//! once), with the documented schema.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use order_worker::OrderSteps;
use serde_json::Value;
use stepline::domain::{Status, StepError};
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline_suite::{on_emulator, TestStack};
use uuid::Uuid;

/// Creates a queue and a rule on the stack's bus that sends every lifecycle event to it.
async fn subscribe(stack: &TestStack) -> anyhow::Result<String> {
    let stage = &stack.local.stack.stage;
    let queue = stack
        .create_private_queue(&format!("stepline-{stage}-lifecycle"))
        .await?;
    let (url, arn) = (queue.url, queue.arn);
    let bus = stack.local.stack.reference_of("EventBus")?;
    let events = aws_sdk_eventbridge::Client::new(&stack.local.sdk);
    events
        .put_rule()
        .name(format!("stepline-{stage}-lifecycle"))
        .event_bus_name(&bus)
        .event_pattern(r#"{"source": ["stepline"]}"#)
        .send()
        .await?;
    events
        .put_targets()
        .rule(format!("stepline-{stage}-lifecycle"))
        .event_bus_name(&bus)
        .targets(
            aws_sdk_eventbridge::types::Target::builder()
                .id("lifecycle-queue")
                .arn(arn)
                .build()?,
        )
        .send()
        .await?;
    Ok(url)
}

/// Collects events (by id) until `done` holds or the deadline passes.
async fn collect(
    stack: &TestStack,
    url: &str,
    done: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> anyhow::Result<BTreeMap<String, Value>> {
    let mut seen = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(&seen) {
        anyhow::ensure!(Instant::now() < deadline, "events so far: {seen:#?}");
        for m in stepline_local::receive(&stack.sqs(), url).await? {
            let event: Value = serde_json::from_str(m.body.as_deref().unwrap_or("{}"))?;
            let id = event["detail"]["eventId"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            seen.insert(id, event);
        }
    }
    Ok(seen)
}

fn kinds(events: &BTreeMap<String, Value>) -> Vec<(String, Option<u64>)> {
    let mut by_seq: Vec<(u64, String, Option<u64>)> = events
        .values()
        .map(|e| {
            (
                e["detail"]["seq"].as_u64().unwrap(),
                e["detail-type"].as_str().unwrap().to_string(),
                e["detail"]["step"].as_u64(),
            )
        })
        .collect();
    by_seq.sort();
    by_seq
        .into_iter()
        .map(|(_, kind, step)| (kind, step))
        .collect()
}

/// The transitions a run publishes when its step attempts end as `attempts` say (step, succeeded):
/// `ExecutionStarted`, then `StepSucceeded` or `StepFailed` per attempt, then `ExecutionSucceeded` or
/// `ExecutionFailed` as the last attempt ended, at its step.
fn transitions(attempts: &[(u64, bool)]) -> Vec<(String, Option<u64>)> {
    let outcome = |succeeded: bool| if succeeded { "Succeeded" } else { "Failed" };
    let mut kinds = vec![("ExecutionStarted".to_string(), None)];
    for &(step, succeeded) in attempts {
        kinds.push((format!("Step{}", outcome(succeeded)), Some(step)));
    }
    let &(step, succeeded) = attempts.last().expect("at least one attempt");
    kinds.push((format!("Execution{}", outcome(succeeded)), Some(step)));
    kinds
}

/// Subscribes to the stack's lifecycle events, runs sample order `n` with `steps` to its end, and
/// asserts it ends `status` having published the transitions of `attempts` (in order). Returns the
/// execution and its events.
async fn run_published(
    stack: &mut TestStack,
    steps: Arc<dyn StepFunction>,
    n: usize,
    status: Status,
    attempts: &[(u64, bool)],
) -> anyhow::Result<(Uuid, BTreeMap<String, Value>)> {
    let url = subscribe(stack).await?;
    stack.start(steps)?;
    let id = stack.submit(order_worker::sample_order(n)).await?;
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, status);

    let expected = transitions(attempts);
    let events = collect(stack, &url, |seen| seen.len() >= expected.len()).await?;
    assert_eq!(kinds(&events), expected);
    Ok((id, events))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_run_publishes_one_lifecycle_event_per_transition() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::with_lifecycle_events("e2e-life", |_| {}).await?);
    let every_step_once = [(0, true), (1, true), (2, true)];
    let (id, events) = run_published(
        &mut stack,
        Arc::new(OrderSteps),
        1,
        Status::Succeeded,
        &every_step_once,
    )
    .await?;
    for event in events.values() {
        assert_eq!(event["source"], "stepline");
        assert_eq!(event["detail"]["executionId"], id.to_string());
        assert_eq!(event["detail"]["pipelineId"], "orders");
        assert_eq!(event["detail"]["tenant"], "test");
    }
    // Published events leave the outbox.
    let settled = stack
        .wait_for(id, Duration::from_secs(30), |r| r.events.is_empty())
        .await?;
    assert_eq!(settled.due_at(), None);
    Ok(())
}

struct FailingPrice(AtomicUsize);

#[async_trait]
impl StepFunction for FailingPrice {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id == "price" {
            self.0.fetch_add(1, Ordering::SeqCst);
            return Err(StepError::new("PRICING_DOWN", "down", true));
        }
        OrderSteps.run(request, input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_and_the_failure_are_published() -> anyhow::Result<()> {
    let mut stack = on_emulator!(
        TestStack::with_lifecycle_events("e2e-lifefail", |def| {
            for step in &mut def.steps {
                step.retry.max_attempts = 2;
                step.retry.initial_delay_ms = 100;
            }
        })
        .await?
    );
    // Pricing (step 1) fails both its attempts.
    let price_fails_twice = [(0, true), (1, false), (1, false)];
    let steps = Arc::new(FailingPrice(AtomicUsize::new(0)));
    let (_, events) =
        run_published(&mut stack, steps, 2, Status::Failed, &price_fails_twice).await?;
    let failed = events
        .values()
        .find(|e| e["detail-type"] == "ExecutionFailed")
        .unwrap();
    assert_eq!(failed["detail"]["code"], "PRICING_DOWN");
    Ok(())
}
