//! Size limits end in a typed, final failure, never in a retry loop: a step whose outcome makes the
//! execution record too large for the store fails with `ITEM_TOO_LARGE` and is dead-lettered; without
//! a payload bucket, what cannot travel inline is refused or fails with `PAYLOAD_TOO_LARGE`; with one,
//! payloads above the threshold are stored first and the record and requests hold references.

mod common;

use std::sync::Arc;

use common::{last_request, reply, sqs, submitted, task_pipeline};
use serde_json::json;
use stepline::adapters::{InMemoryExecutionStore, InMemoryPayloadStore, RecordingSender};
use stepline::claims::ClaimCheck;
use stepline::domain::payload::PayloadRef;
use stepline::domain::{Code, Status, StepError};
use stepline::envelope::ReplyOutcome;
use stepline::{handlers, Coordinator};
use uuid::Uuid;

/// A store refusing records over 20 KB, and an execution of two steps launched on it.
async fn launched() -> (
    Arc<InMemoryExecutionStore>,
    Arc<RecordingSender>,
    Coordinator,
    Uuid,
) {
    let store = Arc::new(InMemoryExecutionStore::default().with_item_limit(20_000));
    let (sender, coordinator, id) =
        submitted(task_pipeline("limits", &["a", "b"]), store.clone()).await;
    (store, sender, coordinator, id)
}

#[tokio::test]
async fn an_output_too_large_for_the_record_fails_the_step_with_item_too_large_at_once() {
    let (store, sender, coordinator, id) = launched().await;
    let output = json!({"blob": "x".repeat(30_000)});
    let body = reply(&last_request(&sender), ReplyOutcome::Succeeded { output });

    let response = handlers::completion(&coordinator, sqs(body.clone())).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "the reply is not retried: {response:?}"
    );
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    let error = record.error.clone().expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(!error.retryable);
    assert!(error.message.contains("output"), "{}", error.message);
    let sent = sender.drain();
    assert!(
        sent.iter()
            .any(|(q, m)| q == "execution-dlq" && m.body.contains("ITEM_TOO_LARGE")),
        "dead-lettered with its code: {sent:?}"
    );
    assert!(
        !sent.iter().any(|(q, _)| q == "reply-dlq"),
        "the reply itself is not poison"
    );

    // The same reply delivered again is the duplicate of what was applied: acknowledged, no write.
    let writes = store.writes();
    let again = handlers::completion(&coordinator, sqs(body)).await;
    assert!(again.batch_item_failures.is_empty());
    assert_eq!(store.writes(), writes);
    assert_eq!(store.snapshot(id).unwrap().version, record.version);
}

#[tokio::test]
async fn an_error_too_large_for_the_record_fails_with_item_too_large_naming_the_workers_code() {
    let (store, sender, coordinator, id) = launched().await;
    let error = StepError::new("HUGE", "e".repeat(15_000), false);
    let body = reply(&last_request(&sender), ReplyOutcome::Failed { error });

    let response = handlers::completion(&coordinator, sqs(body)).await;
    assert!(response.batch_item_failures.is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    let error = record.error.expect("an error");
    assert_eq!(error.code, Code::ItemTooLarge.as_str());
    assert!(error.message.contains("HUGE"), "{}", error.message);

    // Nothing is stuck: the failed execution reads as it is, and an operator can re-drive it.
    assert_eq!(coordinator.get(id).await.unwrap().status, Status::Failed);
    let version = store.snapshot(id).unwrap().version;
    let redriven = coordinator
        .redrive(handlers::RedriveRequest {
            execution_id: id,
            expected_version: version,
            reason: "smaller outputs deployed".into(),
            release_version: None,
        })
        .await
        .unwrap();
    assert_eq!(redriven.status, Status::Queued);
}

/// A submission of `input` to a two-step pipeline, by `coordinator`.
async fn submit(coordinator: &Coordinator, input: serde_json::Value) -> Result<Uuid, Code> {
    let request = stepline::SubmitRequest {
        pipeline_id: "limits".into(),
        tenant: "t".into(),
        input,
        ..Default::default()
    };
    match coordinator.submit(request).await {
        Ok(submitted) => Ok(submitted.execution),
        Err(e) => Err(e.code()),
    }
}

#[tokio::test]
async fn without_a_payload_bucket_what_cannot_travel_inline_is_refused_or_fails_for_good() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(RecordingSender::default());
    let def = task_pipeline("limits", &["a", "b"]);
    let coordinator = common::coordinator_of(def, store.clone(), sender.clone()).await;

    // A submission: refused with its code (413 from the API), nothing written.
    let big = json!({"blob": "x".repeat(250_000)});
    assert_eq!(
        submit(&coordinator, big.clone()).await,
        Err(Code::PayloadTooLarge)
    );
    assert_eq!(Code::PayloadTooLarge.http_status(), 413);
    assert_eq!(store.writes(), 0);

    // A worker's output (sent inline by a worker without claim checks): the step fails for good at
    // once, rather than a next request that no queue would take.
    let id = submit(&coordinator, json!({})).await.unwrap();
    let body = reply(
        &last_request(&sender),
        ReplyOutcome::Succeeded { output: big },
    );
    let response = handlers::completion(&coordinator, sqs(body)).await;
    assert!(response.batch_item_failures.is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!(record.status, Status::Failed);
    let error = record.error.expect("an error");
    assert_eq!(
        (error.code.as_str(), error.retryable),
        (Code::PayloadTooLarge.as_str(), false)
    );
}

#[tokio::test]
async fn with_a_payload_bucket_the_record_and_the_requests_hold_references() {
    let store = Arc::new(InMemoryExecutionStore::default());
    let sender = Arc::new(RecordingSender::default());
    let payloads = Arc::new(InMemoryPayloadStore::default());
    let claims = ClaimCheck::new(payloads.clone(), "payloads", 1_024);
    let def = task_pipeline("limits", &["a", "b"]);
    let coordinator = common::coordinator_of(def, store.clone(), sender.clone())
        .await
        .with_claim_check(claims.clone());

    let input = json!({"rows": "r".repeat(10_000)});
    let id = submit(&coordinator, input.clone()).await.unwrap();
    let record = store.snapshot(id).unwrap();
    let reference = record.input.value().clone();
    assert!(PayloadRef::of(&reference).is_some(), "{reference}");
    assert_eq!(claims.resolve(reference.clone()).await.unwrap(), input);
    let sent = sender.drain();
    let request: serde_json::Value = serde_json::from_str(&sent[0].1.body).unwrap();
    assert_eq!(
        request["payload"], reference,
        "the request carries the reference"
    );

    // An inline output above the threshold (a worker that does not claim-check) is stored first.
    let header: stepline::envelope::RequestHeader =
        serde_json::from_value(request["header"].clone()).unwrap();
    let output = json!({"total": "t".repeat(50_000)});
    let body = reply(
        &header,
        ReplyOutcome::Succeeded {
            output: output.clone(),
        },
    );
    assert!(handlers::completion(&coordinator, sqs(body))
        .await
        .batch_item_failures
        .is_empty());
    let record = store.snapshot(id).unwrap();
    assert_eq!((record.status, record.step), (Status::Running, 1));
    assert_eq!(
        claims.resolve(record.input.value().clone()).await.unwrap(),
        output
    );
    assert!(
        serde_json::to_vec(&record).unwrap().len() < 2_000,
        "the record holds references only"
    );
    assert_eq!(payloads.len(), 2);
}
