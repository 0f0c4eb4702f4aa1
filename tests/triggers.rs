//! EventBridge triggers on the local emulator: a StartExecution event on the project's bus starts an
//! execution through the bus's rule; the same event delivered again starts nothing new.

use std::time::Duration;

use serde_json::json;
use stepline::domain::Status;
use stepline::SubmitRequest;
use stepline_suite::{on_emulator, wait_until, TestStack};

/// What an empty launch DLQ shows.
const NO_LAUNCH_DEAD_LETTERS: &str = "nothing was dead-lettered on its way to a worker";

async fn executions_in_table(stack: &TestStack) -> anyhow::Result<usize> {
    // A test-only Scan: the product never scans.
    let table = stack.local.stack.table("ExecutionTable")?;
    let out = aws_sdk_dynamodb::Client::new(&stack.local.sdk)
        .scan()
        .table_name(table)
        .send()
        .await?;
    Ok(out
        .items()
        .iter()
        .filter(|i| {
            i.get("pk")
                .and_then(|v| v.as_s().ok())
                .is_some_and(|pk| pk.starts_with("exec#"))
        })
        .count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_event_starts_one_execution_however_often_it_is_delivered() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::running("e2e-trigger").await?);
    let detail = json!({
        "pipelineId": "orders",
        "tenant": "bistro",
        "input": order_worker::sample_order(1),
    });
    let bus = stack.local.stack.reference_of("EventBus")?;
    let put = aws_sdk_eventbridge::Client::new(&stack.local.sdk)
        .put_events()
        .entries(
            aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
                .event_bus_name(&bus)
                .source("shop.orders")
                .detail_type("StartExecution")
                .detail(detail.to_string())
                .build(),
        )
        .send()
        .await?;
    assert_eq!(put.failed_entry_count, 0);
    let event_id = put.entries()[0].event_id().unwrap().to_string();

    // The execution the event started (its id is derived from the event id).
    let lookup = SubmitRequest {
        pipeline_id: "orders".into(),
        tenant: "bistro".into(),
        input: json!(null),
        idempotency_key: Some(format!("event:{event_id}")),
        release_version: None,
        parent: None,
    };
    wait_until(Duration::from_secs(30), || async {
        Ok(executions_in_table(&stack).await? == 1)
    })
    .await?;
    let started = stack.api.submit(lookup.clone()).await?;
    assert!(started.duplicate, "the event's execution exists");
    let record = stack.wait_terminal(started.execution).await?;
    assert_eq!(record.status, Status::Succeeded);
    assert_eq!(record.tenant, "bistro");
    // The event's detail was the input: its order went through every step.
    assert_eq!(
        record.result.as_ref().unwrap().value()["orderId"],
        "order-1"
    );

    // EventBridge delivers at least once: the same event again, twice, straight into the start queue.
    let redelivered = stepline_local::start_event(&event_id, detail.clone());
    let (_, start_queue) = stack.local.stack.queue("StartQueue")?;
    for _ in 0..2 {
        stack
            .send_message(start_queue, redelivered.to_string())
            .await?;
    }
    stack
        .wait_drained("StartQueue", Duration::from_secs(30))
        .await?;
    assert_eq!(
        executions_in_table(&stack).await?,
        1,
        "a redelivered event started another execution"
    );
    assert_eq!(
        stack.api.get(started.execution).await?,
        record,
        "and left the first alone"
    );
    stack
        .assert_empty("LaunchDeadLetterQueue", NO_LAUNCH_DEAD_LETTERS)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_queue_poison_goes_to_the_start_dlq_and_moves_back_to_the_start_queue(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::running("e2e-start-poison").await?);
    let (_, start_queue) = stack.local.stack.queue("StartQueue")?;
    let unknown_pipeline = stepline_local::start_event(
        "evt-unknown",
        json!({"pipelineId": "no-such-pipeline", "tenant": "bistro", "input": {}}),
    );
    let mut wrong_type = stepline_local::start_event(
        "evt-type",
        json!({"pipelineId": "orders", "tenant": "bistro", "input": {}}),
    );
    wrong_type["detail-type"] = json!("SomethingElse");
    let poison = [
        "not json".to_string(),
        r#"{"id": "evt-cut", "detail-type": "StartExecution", "deta"#.to_string(),
        unknown_pipeline.to_string(),
        wrong_type.to_string(),
    ];
    for body in &poison {
        stack.send_message(start_queue, body).await?;
    }
    wait_until(Duration::from_secs(30), || async {
        Ok(stack.queue_depth("StartDeadLetterQueue").await? == poison.len() as u64)
    })
    .await?;
    stack
        .assert_empty("LaunchDeadLetterQueue", NO_LAUNCH_DEAD_LETTERS)
        .await?;
    let dlqs = stack.dead_letter_queues()?;
    let start_dlq = dlqs.start.as_ref().expect("a start DLQ");
    let held = start_dlq.receive(10).await?;
    assert_eq!(held.len(), poison.len());
    for message in &held {
        let source = message
            .attributes
            .get(stepline::envelope::SOURCE_ATTRIBUTE)
            .cloned()
            .unwrap_or_default();
        assert!(source.starts_with("start/"), "{source}");
        assert!(
            poison.contains(&message.body),
            "kept as sent: {}",
            message.body
        );
        start_dlq.release(&message.handle).await?;
    }

    // An operator moves them back to the start queue (where they are dead-lettered again).
    let moved = stepline::handlers::operator(
        &stack.api,
        &dlqs,
        stepline::handlers::OperatorRequest::Move(stepline::handlers::MoveRequest {
            queue: stepline::coordinator::Inbox::Start,
            replay: stepline::handlers::ReplayRequest {
                filter: Default::default(),
                dry_run: false,
                max_messages: 10,
                rate_per_second: None,
                reason: "test".into(),
                onto_release: None,
            },
        }),
    )
    .await?;
    let stepline::handlers::OperatorResponse::Replay(report) = moved else {
        panic!("a move reports like a replay: {moved:?}");
    };
    assert_eq!(report.replayed, poison.len(), "{report:?}");
    wait_until(Duration::from_secs(30), || async {
        Ok(
            stack.queue_depth("StartDeadLetterQueue").await? == poison.len() as u64
                && stack.queue_depth("StartQueue").await? == 0,
        )
    })
    .await?;
    stack
        .assert_empty("LaunchDeadLetterQueue", NO_LAUNCH_DEAD_LETTERS)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_event_cannot_make_itself_a_fan_out_child_or_take_a_childs_id() -> anyhow::Result<()>
{
    let stack = on_emulator!(TestStack::running("e2e-parent-link").await?);
    let (_, start_queue) = stack.local.stack.queue("StartQueue")?;
    let parent = uuid::Uuid::new_v4();
    // Anyone who may send to the start queue writes a parent link of their own, naming where the
    // child's end should go (a queue that does not exist), under the id the real child of item 0 of
    // that parent's fan-out would have.
    let child_event = stepline::domain::fan_out_event_id(parent, 1, "item-0");
    let forged = stepline_local::start_event(
        &child_event,
        json!({
            "pipelineId": "orders",
            "tenant": "bistro",
            "input": order_worker::sample_order(2),
            "parent": {
                "executionId": parent,
                "interaction": "item-0",
                "token": "0".repeat(32),
                "completeTo": format!("{start_queue}-elsewhere"),
                "step": 1,
                "signature": "00".repeat(32),
            },
        }),
    );
    stack.send_message(start_queue, forged.to_string()).await?;
    wait_until(Duration::from_secs(30), || async {
        Ok(executions_in_table(&stack).await? == 1)
    })
    .await?;
    let id = stepline::domain::idempotent_id(
        "bistro",
        "orders",
        &stepline::domain::start_event_key(&child_event),
    );
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded);
    // The link was stripped: the execution is nobody's child, owes no parent a notice (nothing left
    // for the sweeper to retry), and its id is not the child's.
    assert_eq!(record.parent, None);
    assert_eq!(record.due_at(), None, "nothing due: {record:?}");
    assert_ne!(
        id,
        stepline::domain::fan_out_child_id("bistro", "orders", parent, 1, "item-0")
    );
    assert_eq!(stack.queue_depth("StartDeadLetterQueue").await?, 0);
    Ok(())
}
