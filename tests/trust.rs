//! Replies are trusted only when they prove it, on the emulator: anyone allowed to send to the reply
//! queue can derive a launch id, but only the coordinator can make the reply token a request carries.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use order_worker::OrderSteps;
use serde_json::{json, Value};
use stepline::domain::seal::{seal, sealed_token, split_token, SealKey};
use stepline::domain::{launch_id, Status, StepError};
use stepline::envelope::{
    Identity, RawRequest, ReplyEnvelope, ReplyOutcome, RequestHeader, REPLY_KIND,
};
use stepline::worker::StepFunction;
use stepline_suite::{on_emulator, TestStack};

async fn send_reply(stack: &TestStack, reply: &Value) -> anyhow::Result<()> {
    stack.send_to("ReplyQueue", reply.to_string()).await
}

/// Submits `order` (no worker running yet) and takes its request off the request queue, as a worker
/// would receive it: the execution and the request's text.
async fn intercepted(stack: &TestStack, order: Value) -> anyhow::Result<(uuid::Uuid, String)> {
    let id = stack.submit(order).await?;
    let mut requests = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(requests.len(), 1);
    Ok((id, requests.remove(0)))
}

/// Puts `request` back on the request queue and starts the real worker, which answers it.
async fn pass_on(stack: &mut TestStack, request: impl Into<String>) -> anyhow::Result<()> {
    stack.send_to("OrderRequestQueue", request).await?;
    stack.start(Arc::new(OrderSteps))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_forged_from_the_public_derivation_is_refused_and_the_genuine_reply_applied(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("trust-forge", |_| {}).await?);
    let gate = Arc::new(AtomicBool::new(false));
    stack.start(Arc::new(Gated(gate.clone())))?;
    let id = stack.submit(order_worker::sample_order(1)).await?;
    let before = stack.api.get(id).await?;
    // The forger knows the execution id, the pipeline's public identity and how launch ids derive;
    // it sends before the real worker has even started.
    let launch = launch_id(id, 0, 1);
    let forged = |outcome: ReplyOutcome, token: &str| ReplyEnvelope {
        kind: REPLY_KIND.into(),
        identity: stack.identity(),
        execution_id: id,
        step_index: 0,
        attempt: 1,
        launch_id: launch,
        reply_token: token.into(),
        outcome,
    };
    let forged_output = json!({"orderId": "order-1", "totalCents": 1, "forged": true});
    // Over the claim-check threshold: a refused reply must not cost a stored object either.
    let threshold = stack.claims()?.threshold();
    let large_output = json!({"orderId": "order-1", "forged": "x".repeat(threshold + 1)});
    for reply in [
        forged(
            ReplyOutcome::Succeeded {
                output: forged_output,
            },
            "",
        ),
        forged(
            ReplyOutcome::Succeeded {
                output: large_output.clone(),
            },
            &launch.simple().to_string(),
        ),
        forged(ReplyOutcome::Running, &"0".repeat(32)),
    ] {
        send_reply(&stack, &serde_json::to_value(&reply)?).await?;
    }
    assert_eq!(
        stack.dead_letter_reasons(3).await?,
        vec!["UNAUTHENTICATED"; 3]
    );
    let after_forgeries = stack.api.get(id).await?;
    assert_eq!(
        after_forgeries, before,
        "refused messages write nothing: no outcome, no deadline moved, no incident"
    );
    assert!(
        !stack.holds_payload(id, &large_output).await?,
        "a refused reply's output is not claim-checked: it is refused before anything is stored"
    );

    // Now the real worker answers.
    gate.store(true, Ordering::SeqCst);
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded);
    let result = record.result.expect("a result");
    assert_eq!(result.value()["totalCents"], 820, "the genuine output");
    assert!(result.value().get("forged").is_none());
    assert!(record.incidents.is_empty(), "{:?}", record.incidents);
    Ok(())
}

/// The order steps, held until the gate opens (the real worker, slower than the forger).
struct Gated(Arc<AtomicBool>);

#[async_trait]
impl StepFunction for Gated {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.0.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        OrderSteps.run(request, input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_of_an_unknown_kind_or_another_release_are_refused() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("trust-kind", |_| {}).await?);
    // A worker that saw the request knows its token: still, the reply must be a reply, for the
    // release the execution is pinned to.
    let (id, sent) = intercepted(&stack, order_worker::sample_order(2)).await?;
    let request: RawRequest = serde_json::from_str(&sent)?;
    let (token, sealed) = split_token(&request.header.reply_token);
    assert_eq!(token.len(), 32);
    assert!(sealed.is_some(), "the request carries its record sealed");
    let genuine = ReplyEnvelope::for_request(
        &request.header,
        ReplyOutcome::Succeeded {
            output: json!({"forged": true}),
        },
    );
    let mut bogus = serde_json::to_value(&genuine)?;
    bogus["kind"] = json!("stepline.bogus.v9");
    let mut other_release = serde_json::to_value(&genuine)?;
    other_release["identity"] = serde_json::to_value(Identity {
        release_version: "9".into(),
        ..stack.identity()
    })?;
    for reply in [&bogus, &other_release] {
        send_reply(&stack, reply).await?;
    }
    // The real worker then answers the same request.
    pass_on(&mut stack, sent).await?;
    assert_eq!(
        stack.dead_letter_reasons(2).await?,
        vec!["IDENTITY_MISMATCH", "UNKNOWN_KIND"]
    );
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded);
    let result = record.result.expect("a result");
    assert_eq!(result.value()["orderId"], "order-2", "the genuine output");
    assert!(result.value().get("forged").is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reads_nothing_in_the_seal_and_a_record_sealed_without_the_key_is_not_trusted(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("trust-seal", |_| {}).await?);
    let (id, sent) = intercepted(&stack, order_worker::sample_order(3)).await?;
    let mut request: Value = serde_json::from_str(&sent)?;
    let token = request["header"]["replyToken"].as_str().unwrap_or_default();
    let (own, sealed) = split_token(token);
    // What the worker sees of the record in its token: nothing, neither its secret nor its tenant.
    let record = stack.api.get(id).await?;
    let opened =
        String::from_utf8_lossy(&URL_SAFE_NO_PAD.decode(sealed.expect("sealed"))?).into_owned();
    for visible in [
        record.secret.as_str(),
        "\"tenant\"",
        "order-3",
        &record.write_id,
    ] {
        assert!(!opened.contains(visible), "{visible} readable in the seal");
    }
    // Someone who reads the table (not the key) seals a record of their choosing (another tenant,
    // a secret of theirs) under a key of their own and passes the request on; the worker copies the
    // token into its reply untouched.
    let mut chosen = record.clone();
    chosen.tenant = "mallory".into();
    chosen.secret = "00".repeat(16);
    let forged = seal(&SealKey::generate(), &chosen).expect("sealed");
    request["header"]["replyToken"] = json!(sealed_token(own, &forged));
    pass_on(&mut stack, request.to_string()).await?;
    // The reply is genuine (its launch's own token): it is applied, on the record as read.
    let ended = stack.wait_terminal(id).await?;
    assert_eq!(ended.status, Status::Succeeded);
    assert_eq!(
        ended.tenant, record.tenant,
        "the chosen record was not written"
    );
    assert_eq!(
        ended.secret, record.secret,
        "the chosen secret was not written"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_announced_by_anyone_lasts_only_until_the_worker_is_heard_again(
) -> anyhow::Result<()> {
    use stepline::envelope::WorkerAnnouncement;
    use stepline::release::{WorkerHealth, WorkerState};
    let stack = on_emulator!(TestStack::running("trust-drain").await?);
    let first = stack.submit(order_worker::sample_order(1)).await?;
    stack.wait_terminal(first).await?;
    let pipeline = stack.identity().pipeline_id;
    let health = || async { anyhow::Ok(stack.api.workers(&pipeline).await?) };
    // The worker announced itself with its first batch: `stepline workers` lists it.
    stepline_suite::wait_until(Duration::from_secs(30), || async {
        Ok(health().await?.len() == 1)
    })
    .await?;
    let (worker, _) = health().await?.remove(0);
    let announcement = |state| {
        let message = WorkerAnnouncement::new(
            worker.worker_id.clone(),
            stack.identity(),
            worker.queue.clone(),
            state,
        );
        serde_json::to_value(message)
    };
    let is = |wanted: WorkerHealth| {
        let health = &health;
        async move { Ok(health().await?[0].1 == wanted) }
    };
    let fresh = || stack.coordinator_at("ApiFunction", Duration::ZERO);
    let submission = stepline::SubmitRequest {
        pipeline_id: pipeline.clone(),
        tenant: "test".into(),
        input: order_worker::sample_order(2),
        ..Default::default()
    };

    // Anyone who may send to the reply queue announces that worker draining: while that is the
    // latest word of it, its release takes no new executions.
    send_reply(&stack, &announcement(WorkerState::Draining)?).await?;
    stepline_suite::wait_until(Duration::from_secs(30), || is(WorkerHealth::Draining)).await?;
    let refused = fresh()?.submit(submission.clone()).await.unwrap_err();
    assert_eq!(refused.code().as_str(), "RELEASE_DRAINING");
    // The worker's next announcement takes it back: a drain does not stick.
    send_reply(&stack, &announcement(WorkerState::Healthy)?).await?;
    stepline_suite::wait_until(Duration::from_secs(30), || is(WorkerHealth::Healthy)).await?;
    let accepted = fresh()?.submit(submission).await?;
    assert_eq!(
        stack.wait_terminal(accepted.execution).await?.status,
        Status::Succeeded
    );
    Ok(())
}

/// Every string a principal that may read both tables and the payload bucket can read (attribute
/// values, nested ones, and object bodies), as candidate key material.
async fn what_a_reader_reads(stack: &TestStack) -> anyhow::Result<Vec<Vec<u8>>> {
    use aws_sdk_dynamodb::types::AttributeValue;
    fn collect(value: &AttributeValue, out: &mut Vec<Vec<u8>>) {
        match value {
            AttributeValue::S(text) => {
                out.push(text.as_bytes().to_vec());
                if let Ok(json) = serde_json::from_str::<Value>(text) {
                    collect_json(&json, out);
                }
            }
            AttributeValue::B(blob) => out.push(blob.as_ref().to_vec()),
            AttributeValue::M(map) => map.values().for_each(|v| collect(v, out)),
            AttributeValue::L(list) => list.iter().for_each(|v| collect(v, out)),
            AttributeValue::Ss(set) => set.iter().for_each(|s| out.push(s.as_bytes().to_vec())),
            _ => {}
        }
    }
    fn collect_json(value: &Value, out: &mut Vec<Vec<u8>>) {
        match value {
            Value::String(text) => out.push(text.as_bytes().to_vec()),
            Value::Array(list) => list.iter().for_each(|v| collect_json(v, out)),
            Value::Object(map) => map.values().for_each(|v| collect_json(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    let dynamodb = &stack.local.clients.dynamodb;
    for table in ["ExecutionTable", "ReleaseTable"] {
        let name = stack.local.stack.table(table)?;
        let mut start = None;
        loop {
            let page = dynamodb
                .scan()
                .table_name(name)
                .set_exclusive_start_key(start)
                .send()
                .await?;
            for item in page.items() {
                item.values().for_each(|v| collect(v, &mut out));
            }
            start = page.last_evaluated_key;
            if start.is_none() {
                break;
            }
        }
    }
    let bucket = stack.local.stack.reference_of("PayloadBucket")?;
    let s3 = &stack.local.clients.s3;
    let listed = s3.list_objects_v2().bucket(&bucket).send().await?;
    for object in listed.contents() {
        let body = s3
            .get_object()
            .bucket(&bucket)
            .key(object.key().unwrap_or_default())
            .send()
            .await?
            .body
            .collect()
            .await?
            .into_bytes();
        if let Ok(json) = serde_json::from_slice::<Value>(&body) {
            let mut strings = Vec::new();
            collect_json(&json, &mut strings);
            out.extend(strings);
        }
        out.push(body.to_vec());
    }
    Ok(out)
}

/// The keys a reader could make of what it read: the bytes themselves, hex, base64, and the
/// coordinator's own derivation of a key from a secret's text.
fn keys_made_of(material: &[u8]) -> Vec<SealKey> {
    let mut keys = Vec::new();
    let mut push = |bytes: &[u8]| {
        if let Ok(raw) = <[u8; 32]>::try_from(bytes) {
            keys.push(SealKey::new(raw));
        }
    };
    push(material);
    if let Ok(text) = std::str::from_utf8(material) {
        if let Ok(bytes) = hex::decode(text.trim()) {
            push(&bytes);
        }
        for engine in [base64::engine::general_purpose::STANDARD, URL_SAFE_NO_PAD] {
            if let Ok(bytes) = engine.decode(text.trim()) {
                push(&bytes);
            }
        }
        if let Some(key) = SealKey::from_secret(text) {
            keys.push(key);
        }
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_of_both_tables_and_the_bucket_holds_no_key_that_opens_or_makes_a_seal(
) -> anyhow::Result<()> {
    // A payload large enough to be claim-checked, so that the bucket holds something to read.
    let stack = on_emulator!(
        TestStack::with_parameters("trust-reader", &[("PayloadThresholdBytes", "1024")], |_| {})
            .await?
    );
    let mut order = order_worker::sample_order(4);
    order["note"] = json!("x".repeat(4096));
    let (id, sent) = intercepted(&stack, order).await?;
    let request: Value = serde_json::from_str(&sent)?;
    let token = request["header"]["replyToken"].as_str().unwrap_or_default();
    let sealed = split_token(token).1.expect("the request is sealed");
    // Nor do the operators' tools hold one.
    assert!(stack.local.operator()?.key_source().is_none());
    let material = what_a_reader_reads(&stack).await?;
    assert!(
        material.len() > 10,
        "the reader read the tables and the bucket ({} strings)",
        material.len()
    );
    let mut tried = 0;
    for candidate in &material {
        for key in keys_made_of(candidate) {
            tried += 1;
            assert!(
                stepline::domain::seal::unseal(&key, sealed, id).is_none(),
                "a value readable in a table or the bucket is the sealing key"
            );
        }
    }
    println!(
        "{} values read, {tried} keys made of them: none opens a seal",
        material.len()
    );
    Ok(())
}
