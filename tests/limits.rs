//! Size limits on the emulator. Payloads above the claim-check threshold travel through the stack's
//! payload bucket (a 100 MB step output reaches the next step intact; a 300 KB worker error is kept
//! once, in the bucket); outputs under it that are large together are replied in batches split by
//! bytes; the record stays the same size over a 1,000-step pipeline; and a step whose outcome would
//! make the execution item exceed DynamoDB's 400 KB (claim checks set high) fails at once with
//! `ITEM_TOO_LARGE` and is dead-lettered with its context, not retried.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use stepline::adapters::SqsSender;
use stepline::domain::history::JOURNAL_CHUNK;
use stepline::domain::payload::PayloadRef;
use stepline::domain::{Code, Status, StepError};
use stepline::envelope::{DeadLetterEnvelope, RequestHeader};
use stepline::ports::{MessageSender, OutMessage};
use stepline::worker::StepFunction;
use stepline_suite::{on_emulator, TestStack};

/// Fails the first step with an error message of the given length.
struct HugeError(usize);

#[async_trait]
impl StepFunction for HugeError {
    async fn run(&self, _request: &RequestHeader, _input: Value) -> Result<Value, StepError> {
        Err(StepError::new("HUGE", "e".repeat(self.0), false))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_kb_worker_error_is_stored_once_and_fails_the_execution_with_its_code(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("limits-error", |_| {}).await?);
    stack.start(Arc::new(HugeError(300_000)))?;
    let id = stack.submit(order_worker::sample_order(1)).await?;
    let record = stack.wait_dead_lettered(id).await?;
    assert_eq!(record.status, Status::Failed);
    assert_eq!(
        record.attempt, 1,
        "failed on its first reply, not after timeouts"
    );
    let error = record.error.clone().expect("an error");
    assert_eq!(error.code, "HUGE");
    assert!(error.message.len() <= 1024, "the beginning stays inline");
    // The whole message is in the payload bucket, once; the item holds its reference.
    let detail = error
        .detail
        .clone()
        .expect("a reference to the whole message");
    assert!(PayloadRef::of(&detail).is_some(), "{detail}");
    assert_eq!(
        stack.claims()?.resolve(detail).await?,
        json!("e".repeat(300_000))
    );
    let item = stack.local.execution_item(id).await?.expect("the item");
    assert!(
        item_bytes(&item) < 8_000,
        "an item of {} bytes",
        item_bytes(&item)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_too_large_for_the_item_fails_the_execution_with_item_too_large(
) -> anyhow::Result<()> {
    // Claim checks set as high as they go (200 KiB): these payloads stay inline.
    let mut stack = on_emulator!(
        TestStack::with_parameters("limits", &[("PayloadThresholdBytes", "204800")], |_| {})
            .await?
    );
    // An input and an error of 200 KiB each (as much as travels inline), with the rest of the record:
    // just over DynamoDB's 400 KB.
    stack.start(Arc::new(HugeError(204_800)))?;
    let mut input = order_worker::sample_order(1);
    input["note"] = Value::String(String::new());
    let base = input.to_string().len();
    input["note"] = Value::String("n".repeat(204_800 - base));
    assert_eq!(input.to_string().len(), 204_800);
    let id = stack.submit(input).await?;
    let record = stack.wait_dead_lettered(id).await?;
    assert_eq!(record.status, Status::Failed);
    let error = record.error.expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(error.message.contains("HUGE"), "{}", error.message);
    assert_eq!(
        record.attempt, 1,
        "failed on its first reply, not after timeouts"
    );

    // Dead-lettered with its context; the reply itself was not poison.
    let (_, dlq) = stack.local.stack.queue("ExecutionDeadLetterQueue")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let message = loop {
        if let Some(message) = stepline_local::receive(&stack.sqs(), dlq).await?.pop() {
            break message;
        }
        anyhow::ensure!(Instant::now() < deadline, "no dead-letter envelope in 30 s");
    };
    let envelope: DeadLetterEnvelope =
        serde_json::from_str(message.body.as_deref().unwrap_or_default())?;
    assert_eq!(envelope.execution_id, id);
    assert_eq!(
        envelope.error.map(|e| e.code),
        Some(Code::ItemTooLarge.as_str().to_string())
    );
    assert_eq!(stack.queue_depth("ReplyDeadLetterQueue").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_sent_together_are_split_into_batches_that_fit() -> anyhow::Result<()> {
    // Ten replies of 120 KB: 1.2 MB in one SendMessageBatch is refused as a whole (over the batch
    // limit), and a sender that groups by count alone fails all ten, every time it retries.
    let stack = on_emulator!(TestStack::new("limits-batch", |_| {}).await?);
    let (_, url) = stack.local.stack.queue("ReplyQueue")?;
    let messages: Vec<OutMessage> = (0..10)
        .map(|i| OutMessage::new(format!("{i}{}", "r".repeat(120_000))))
        .collect();
    let results = SqsSender::new(stack.sqs()).send(url, &messages).await;
    let failed: Vec<String> = results
        .iter()
        .filter_map(|r| {
            r.as_ref()
                .err()
                .map(|e| e.reason.chars().take(120).collect())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 10 not sent: {:?}",
        failed.len(),
        failed.first()
    );
    assert_eq!(stack.queue_depth("ReplyQueue").await?, 10);
    Ok(())
}

/// Every step answers with `pad` bytes of padding beside the step's index.
struct Padded(usize);

#[async_trait]
impl StepFunction for Padded {
    async fn run(&self, request: &RequestHeader, _input: Value) -> Result<Value, StepError> {
        Ok(json!({"step": request.step_index, "pad": "p".repeat(self.0)}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_30_kb_outputs_replied_in_one_batch_all_succeed() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("limits-30kb", |_| {}).await?);
    let ids = stack.submit_orders(10).await?;
    // The ten first requests, handled as one worker batch: ten replies of about 30 KB each (under the
    // claim-check threshold, so inline), 300 KB together: more than one SendMessageBatch takes.
    let worker = Arc::new(stack.worker(Arc::new(Padded(30_000)))?);
    let (_, arn) = match stack.local.stack.resources.get("OrderRequestQueue") {
        Some(stepline_local::stack::Physical::Queue { url, arn, .. }) => (url.clone(), arn.clone()),
        _ => anyhow::bail!("no request queue"),
    };
    let requests = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(requests.len(), 10);
    let mut event = SqsEvent::default();
    for (i, body) in requests.into_iter().enumerate() {
        let mut message = SqsMessage::default();
        message.message_id = Some(format!("m-{i}"));
        message.body = Some(body);
        message.event_source_arn = Some(arn.clone());
        event.records.push(message);
    }
    let response = worker.handle(event).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "replies not sent: {:?}",
        response.batch_item_failures.len()
    );
    stack.start_worker(worker)?;
    for id in ids {
        let record = stack.wait_terminal(id).await?;
        assert_eq!(record.status, Status::Succeeded, "{record:#?}");
        let result = record.result.expect("a result");
        assert_eq!(result.value()["pad"].as_str().map(str::len), Some(30_000));
    }
    Ok(())
}

/// Step 0 returns a document of so many bytes with its digest; step 1 checks what it received against
/// it.
struct Blob(usize);

#[async_trait]
impl StepFunction for Blob {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_index {
            0 => {
                let blob: String = (0..self.0 / 16)
                    .map(|i| format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
                    .collect();
                let sha256 = hex::encode(Sha256::digest(blob.as_bytes()));
                Ok(json!({"blob": blob, "sha256": sha256}))
            }
            1 => {
                let blob = input["blob"].as_str().unwrap_or_default();
                let sha256 = hex::encode(Sha256::digest(blob.as_bytes()));
                Ok(json!({
                    "bytes": blob.len(),
                    "intact": input["sha256"].as_str() == Some(sha256.as_str()),
                }))
            }
            _ => Ok(input),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_output_of_many_megabytes_reaches_the_next_step_intact() -> anyhow::Result<()> {
    stepline_local::needs_emulator!();
    // 100 MB in the full tier; 8 MB, far past every inline limit, in the quick one.
    let blob_bytes = stepline_local::testing::sized(8, 100) * 1024 * 1024;
    let mut stack = TestStack::new("limits-blob", |def| {
        for step in &mut def.steps {
            step.timeout_secs = 600;
        }
    })
    .await?;
    stack.start(Arc::new(Blob(blob_bytes)))?;
    let id = stack.submit(json!({"job": 1})).await?;
    let record = stack
        .wait_for(id, Duration::from_secs(600), |r| r.status.is_terminal())
        .await?;
    assert_eq!(record.status, Status::Succeeded, "{:?}", record.error);
    let result = record.result.expect("a result");
    assert_eq!(
        result.value(),
        &json!({"bytes": blob_bytes, "intact": true})
    );
    Ok(())
}

/// Passes a counter on, one more at each step.
struct Count;

#[async_trait]
impl StepFunction for Count {
    async fn run(&self, _request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        let n = input["n"].as_u64().unwrap_or_default();
        Ok(json!({"n": n + 1, "doc": "d".repeat(200)}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_step_pipeline_succeeds_with_an_item_that_does_not_grow() -> anyhow::Result<()> {
    const STEPS: usize = 1_000;
    let mut stack = on_emulator!(
        TestStack::new("limits-long", |def| {
            let first = def.steps[0].clone();
            def.steps = (0..STEPS)
                .map(|k| first.clone().renamed(format!("s{k}")))
                .collect();
        })
        .await?
    );
    stack.start(Arc::new(Count))?;
    let id = stack.submit(json!({"n": 0})).await?;
    // Item sizes along the way, as stored.
    let mut sizes = Vec::new();
    let record = loop {
        let record = stack.api.get(id).await?;
        if let Some(mut item) = stack.local.execution_item(id).await? {
            // The history the item holds is bounded on its own (its entries' digits grow with the
            // step numbers and times): measured apart.
            let history = match item.remove("history") {
                Some(AttributeValue::L(entries)) => entries.len(),
                _ => 0,
            };
            anyhow::ensure!(
                history <= 2 * JOURNAL_CHUNK + 2,
                "the item holds {history} history entries"
            );
            item.remove("historyBase");
            sizes.push((record.step, item_bytes(&item)));
        }
        if record.status.is_terminal() {
            break record;
        }
        anyhow::ensure!(
            sizes.len() < 6_000,
            "not finished after {} polls: {record:?}",
            sizes.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(record.status, Status::Succeeded, "{:?}", record.error);
    assert_eq!(record.result.expect("a result").value()["n"], STEPS as u64);
    let largest = |steps: std::ops::Range<u32>| {
        sizes
            .iter()
            .filter(|(s, _)| steps.contains(s))
            .map(|(_, b)| *b)
            .max()
    };
    let (Some(early), Some(late)) = (largest(1..100), largest(900..1_000)) else {
        anyhow::bail!("no item seen early or late: {} polls", sizes.len());
    };
    assert!(
        late <= early + 16,
        "the item grew from {early} to {late} bytes over the pipeline"
    );
    assert!(
        late < 1_024,
        "an item of {late} bytes (its history aside) with 200-byte payloads"
    );
    Ok(())
}

/// An item's size as DynamoDB counts it: attribute names and values (numbers as their text).
fn item_bytes(item: &std::collections::HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) | AttributeValue::N(s) => s.len(),
            AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
            AttributeValue::M(m) => {
                3 + m.iter().map(|(k, v)| 1 + k.len() + value(v)).sum::<usize>()
            }
            AttributeValue::L(l) => 3 + l.iter().map(|v| 1 + value(v)).sum::<usize>(),
            _ => 0,
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

/// Step 0 answers with the size of the input it saw; the others pass it on.
struct Measure;

#[async_trait]
impl StepFunction for Measure {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        Ok(match request.step_index {
            0 => json!({"bytes": input.to_string().len(), "refs": PayloadRef::any_in(&input)}),
            _ => input,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_input_is_claim_checked_at_submission_and_resolved_for_its_step(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("limits-input", |_| {}).await?);
    let input = json!({"note": "n".repeat(100_000)});
    let id = stack.submit(input.clone()).await?;
    let record = stack.api.get(id).await?;
    let reference = PayloadRef::of(record.input.value()).expect("the record holds a reference");
    assert_eq!(reference.size as usize, input.to_string().len());
    stack.start(Arc::new(Measure))?;
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded, "{:?}", record.error);
    assert_eq!(
        record.result.expect("a result").value(),
        &json!({"bytes": input.to_string().len(), "refs": false})
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_checked_payload_cannot_be_overwritten_by_whoever_saw_its_reference(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("limits-immutable", |_| {}).await?);
    let claims = stack.claims()?;
    let execution = uuid::Uuid::new_v4();
    let genuine = serde_json::to_vec(&json!({"rows": "x".repeat(claims.threshold() + 1)}))?;
    let reference = claims.store_bytes(execution, genuine.clone()).await?;
    // A worker has seen the reference (its bucket and key) and writes there through the same
    // adapter: refused, and every later reader still resolves the genuine payload.
    let overwrite = claims.put_named(&reference.key, b"{}".to_vec()).await;
    assert!(overwrite.is_err(), "{overwrite:?}");
    assert_eq!(claims.fetch(&reference).await?, genuine);
    // The same payload stored again (a retry after a lost response) is the same reference.
    assert_eq!(claims.store_bytes(execution, genuine).await?, reference);
    Ok(())
}
