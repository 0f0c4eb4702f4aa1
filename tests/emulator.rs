//! End-to-end tests against the local AWS emulator (moto server started by infra/test.sh, or whatever
//! `AWS_ENDPOINT_URL` points at). Every test provisions its own stage of template.yaml and drives the
//! real handlers through the local runner.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use order_worker::OrderSteps;
use serde_json::{json, Value};
use stepline::adapters::SqsSender;
use stepline::coordinator::Inbox;
use stepline::domain::{launch_id, Status, StepError, StepStatus};
use stepline::envelope::{
    DeadLetterEnvelope, LaunchWork, RequestHeader, REASON_ATTRIBUTE, SOURCE_ATTRIBUTE,
};
use stepline::handlers::{
    self, CancelRequest, MoveRequest, OperatorRequest, OperatorResponse, RedriveRequest,
};
use stepline::handlers::{ReplayFilter, ReplayRequest};
use stepline::ports::{MessageSender, OutMessage, Sent};
use stepline::worker::{StepFunction, Worker};
use stepline::SubmitRequest;
use stepline_local::functions;
use stepline_suite::{on_emulator, wait_until, TestStack};
use uuid::Uuid;

/// Writes per execution of the three-step pipeline without retries: the create (which launches the
/// first step) and three replies.
const HAPPY_PATH_VERSION: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_pipeline_succeeds_with_the_result_recorded_and_consumed_outputs_dropped(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::running("e2e-ok").await?);
    let input = order_worker::sample_order(1);
    let id = stack.submit(input).await?;

    let record = stack.wait_terminal(id).await?;

    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    // Each output travelled to the next step in its request; the record keeps only the last step's
    // progress and the result.
    assert_eq!((record.first_step, record.steps.len()), (2, 1));
    let progress = &record.steps[0];
    assert_eq!(progress.status, StepStatus::Succeeded);
    assert_eq!(progress.launch_id, launch_id(id, 2, 1));
    assert!(progress.receipt.is_some(), "the last step has no receipt");
    assert!(record.input.is_null(), "the input is kept");
    let result = record.result.as_ref().expect("result").value();
    assert_eq!(result["orderId"], "order-1");
    // 2 x 250 + 1 x 320, priced by the second step and carried through the third.
    assert_eq!(result["totalCents"], 820);
    assert!(result["confirmation"].as_str().unwrap().starts_with("C-"));
    assert_eq!(record.version, HAPPY_PATH_VERSION);
    assert_eq!(
        record.due_at(),
        None,
        "a finished execution leaves the due index"
    );
    Ok(())
}

/// SQS refuses a message holding characters outside XML's (U+0000-U+001F but tab, line feed and
/// carriage return; U+FFFE, U+FFFF), which JSON strings may carry. Such a value travels escaped in
/// every message and arrives intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn characters_sqs_refuses_in_a_message_travel_escaped_and_arrive_intact() -> anyhow::Result<()>
{
    let stack = on_emulator!(TestStack::running("e2e-chars").await?);
    let order_id = "order-\u{1}\u{1f}\u{fffe}\u{ffff}-\u{10ffff}-1";
    let mut input = order_worker::sample_order(1);
    input["orderId"] = json!(order_id);
    let id = stack.submit(input).await?;

    let record = stack.wait_terminal(id).await?;

    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    let result = record.result.as_ref().expect("result").value();
    assert_eq!(result["orderId"], order_id);
    Ok(())
}

/// Sends every message twice and keeps a copy of each body.
struct DuplicatingSender {
    inner: SqsSender,
    sent: Mutex<Vec<(String, String)>>,
}

#[async_trait]
impl MessageSender for DuplicatingSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        let doubled: Vec<OutMessage> = messages
            .iter()
            .flat_map(|m| [m.clone(), m.clone()])
            .collect();
        self.sent
            .lock()
            .unwrap()
            .extend(messages.iter().map(|m| (queue.to_string(), m.body.clone())));
        let results = self.inner.send(queue, &doubled).await;
        results.chunks(2).map(|pair| pair[0].clone()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_replies_do_not_advance_an_execution_twice() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-dup", |_| {}).await?);
    let sender = Arc::new(DuplicatingSender {
        inner: SqsSender::new(stack.sqs()),
        sent: Mutex::new(Vec::new()),
    });
    let worker = Arc::new(Worker::new(
        stack.identity(),
        sender.clone(),
        Arc::new(OrderSteps),
    ));
    stack.start_worker(worker)?;
    let id = stack.submit(order_worker::sample_order(2)).await?;

    let record = stack.wait_terminal(id).await?;
    stack
        .wait_drained("ReplyQueue", Duration::from_secs(30))
        .await?;

    assert_eq!(record.status, Status::Succeeded);
    let after = stack.api.get(id).await?;
    assert_eq!(
        after.version, HAPPY_PATH_VERSION,
        "each reply arrived twice but must advance once"
    );
    assert!(after
        .steps
        .iter()
        .all(|s| s.status == StepStatus::Succeeded));
    assert_eq!(after.first_step, 2);

    // Inject a copy of the first step's reply, straight into the reply queue, after the run ended.
    let (_, reply_url) = stack.local.stack.queue("ReplyQueue")?;
    let first_reply = sender
        .sent
        .lock()
        .unwrap()
        .iter()
        .find(|(_, body)| body.contains(&launch_id(id, 0, 1).to_string()))
        .map(|(_, body)| body.clone())
        .expect("the worker replied to step 0");
    stack.send_message(reply_url, first_reply).await?;
    stack
        .wait_drained("ReplyQueue", Duration::from_secs(30))
        .await?;
    let last = stack.api.get(id).await?;
    assert_eq!(last, after, "an injected duplicate changed the record");
    let why = "a byte-identical duplicate is absorbed, not dead-lettered";
    stack.assert_empty("ReplyDeadLetterQueue", why).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_step_is_retried_up_to_its_budget_then_failed() -> anyhow::Result<()> {
    let (stack, steps) = on_emulator!(
        TestStack::with_failing_pricing("e2e-retry", true, |def| {
            for step in &mut def.steps {
                step.retry.max_attempts = 3;
                step.retry.initial_delay_ms = 200;
                step.retry.max_delay_ms = 400;
            }
        })
        .await?
    );
    let id = stack.submit(order_worker::sample_order(3)).await?;

    let record = stack.wait_dead_lettered(id).await?;

    assert_eq!(record.status, Status::Failed, "{record:#?}");
    let error = record.error.as_ref().expect("error recorded");
    assert_eq!(error.code, "PRICING_DOWN");
    assert_eq!(record.step, 1, "failed at the price step");
    assert_eq!(record.attempt, 3, "three attempts, the budget");
    assert_eq!(steps.price_runs(), 3);
    assert_eq!(record.first_step, 1, "the first step succeeded");
    assert_eq!(record.steps[0].status, StepStatus::Failed);
    assert_eq!(record.due_at(), None, "envelope sent: nothing left to do");

    // The execution DLQ holds one envelope with everything needed to re-drive it.
    let envelopes = stack.take_all("ExecutionDeadLetterQueue").await?;
    assert_eq!(envelopes.len(), 1);
    let envelope: DeadLetterEnvelope = serde_json::from_str(&envelopes[0])?;
    assert_eq!(envelope.execution_id, id);
    assert_eq!(
        envelope.dead_letter_id,
        record.dead_letter.as_ref().unwrap().id
    );
    assert_eq!(envelope.step_id, "price");
    assert_eq!(envelope.attempt, 3);
    assert_eq!(envelope.release_version, record.release_version);
    assert_eq!(envelope.error.as_ref().unwrap().code, "PRICING_DOWN");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_runs_a_failed_execution_to_success_once_the_fault_is_gone() -> anyhow::Result<()> {
    let (stack, steps) =
        on_emulator!(TestStack::with_failing_pricing("e2e-redrive", false, |_| {}).await?);
    let id = stack.submit(order_worker::sample_order(4)).await?;
    // Settled: failed, and its dead-letter envelope sent (which is one more write).
    let failed = stack.wait_dead_lettered(id).await?;
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.attempt, 1, "a non-retryable failure is not retried");

    // A re-drive against a version the operator did not look at is refused.
    let stale = handlers::redrive(
        &stack.api,
        RedriveRequest {
            execution_id: id,
            expected_version: failed.version - 1,
            reason: "stale view".into(),
            release_version: None,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(stale.code(), "VERSION_CONFLICT");

    steps.failing.store(false, Ordering::SeqCst);
    let response = handlers::redrive(
        &stack.api,
        RedriveRequest {
            execution_id: id,
            expected_version: failed.version,
            reason: "pricing service restored".into(),
            release_version: None,
        },
    )
    .await?;
    assert_eq!(response.status, Status::Queued);

    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(record.release_version, failed.release_version, "pin kept");
    assert_eq!(
        steps.price_launches(),
        vec![launch_id(id, 1, 1), launch_id(id, 1, 2)],
        "the re-drive ran the failed step as a new attempt"
    );
    assert_eq!(record.redrives.len(), 1);
    assert_eq!(record.redrives[0].reason, "pricing service restored");
    assert_eq!(record.redrives[0].from_status, Status::Failed);
    assert!(record.error.is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_take_exactly_one_lease_per_execution() -> anyhow::Result<()> {
    // No runner, and the first requests are lost: only the sweeper can move these executions.
    let stack = on_emulator!(TestStack::new("e2e-claim", |_| {}).await?);
    let mut ids = Vec::new();
    for n in 0..8 {
        ids.push(stack.submit(order_worker::sample_order(n)).await?);
    }
    let submitted = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(submitted.len(), ids.len());

    // Two claim invocations whose clock is past the step deadlines race for the same due executions.
    let later = Duration::from_secs(600);
    let a = stack.coordinator_at(functions::CLAIM, later)?;
    let b = stack.coordinator_at(functions::CLAIM, later)?;
    let event = stepline_local::runner::scheduled_event;
    let (ra, rb) = tokio::join!(handlers::claim(&a, event()), handlers::claim(&b, event()));
    let (ra, rb) = (ra?, rb?);

    assert_eq!(ra.claimed + rb.claimed, ids.len(), "{ra:?} {rb:?}");
    for id in &ids {
        let record = stack.api.get(*id).await?;
        assert_eq!(record.generation, 1, "exactly one lease taken");
        assert!(record.lease.is_some());
    }
    let work: Vec<LaunchWork> = stack
        .take_all("LaunchQueue")
        .await?
        .iter()
        .map(|body| serde_json::from_str(body))
        .collect::<Result<_, _>>()?;
    assert_eq!(work.len(), ids.len(), "one launch work per lease");
    for id in &ids {
        let mine: Vec<_> = work.iter().filter(|w| w.execution_id == *id).collect();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].generation, 1);
        let record = stack.api.get(*id).await?;
        assert_eq!(record.lease.as_ref().unwrap().token, mine[0].token);
    }

    // A third claim now finds nothing it may take: every lease is held.
    let c = stack.coordinator_at(functions::CLAIM, later)?;
    let rc = handlers::claim(&c, event()).await?;
    assert_eq!(rc.claimed, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_replies_go_to_the_dlq_with_their_reason_and_leave_records_alone(
) -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("e2e-poison", |_| {}).await?);
    let id = stack.submit(order_worker::sample_order(5)).await?;
    let before = stack.api.get(id).await?;
    let completion = stack.local.coordinator(functions::COMPLETION)?;
    let mut event = stepline::aws_lambda_events::event::sqs::SqsEvent::default();
    for (n, body) in [
        "not json",
        &json!({"kind": "stepline.reply.v1"}).to_string(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut message = stepline::aws_lambda_events::event::sqs::SqsMessage::default();
        message.message_id = Some(format!("m{n}"));
        message.body = Some(body.to_string());
        event.records.push(message);
    }
    let response = handlers::completion(&completion, event).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "poison is dead-lettered at once, not retried"
    );
    assert_eq!(stack.api.get(id).await?, before);

    let (_, dlq) = stack.local.stack.queue("ReplyDeadLetterQueue")?;
    let messages = stepline_local::receive(&stack.sqs(), dlq).await?;
    assert_eq!(messages.len(), 2);
    for m in &messages {
        let attrs = m.message_attributes.as_ref().expect("attributes");
        assert_eq!(
            attrs[REASON_ATTRIBUTE].string_value.as_deref(),
            Some("UNDECODABLE")
        );
        assert!(attrs[SOURCE_ATTRIBUTE]
            .string_value
            .as_deref()
            .unwrap()
            .starts_with("reply/m"));
    }
    let bodies: Vec<_> = messages.iter().filter_map(|m| m.body.as_deref()).collect();
    assert!(
        bodies.contains(&"not json"),
        "the original body is kept: {bodies:?}"
    );
    Ok(())
}

/// The order steps with a slow `price` step.
/// The order steps with a slow `price` step; records the launch ids it ran for.
struct SlowPricing(Duration, std::sync::Mutex<Vec<Uuid>>);

impl SlowPricing {
    fn new(delay: Duration) -> Self {
        Self(delay, Default::default())
    }
}

#[async_trait]
impl StepFunction for SlowPricing {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id == "price" {
            self.1.lock().expect("launches").push(request.launch_id);
            tokio::time::sleep(self.0).await;
        }
        OrderSteps.run(request, input).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_execution_launches_nothing_more_and_ignores_a_late_reply() -> anyhow::Result<()>
{
    let mut stack = on_emulator!(TestStack::new("e2e-cancel", |_| {}).await?);
    stack.start(Arc::new(SlowPricing::new(Duration::from_secs(2))))?;
    let id = stack.submit(order_worker::sample_order(6)).await?;
    stack
        .wait_for(id, Duration::from_secs(30), |r| {
            r.step == 1 && r.status == Status::Running
        })
        .await?;

    let cancelled = handlers::cancel(
        &stack.api,
        CancelRequest {
            execution_id: id,
            reason: "customer withdrew the order".into(),
        },
    )
    .await?;
    assert_eq!(cancelled.status, Status::Cancelled);

    // The price step's reply still arrives (the worker was mid-step): it must not advance anything.
    // The request (in flight while the step runs) and the cancel notice leave the request queue once
    // the worker is done; its reply leaves the reply queue once the completion handler has seen it.
    wait_until(Duration::from_secs(30), || async {
        Ok(stack.queue_depth("OrderRequestQueue").await? == 0
            && stack.queue_depth("ReplyQueue").await? == 0)
    })
    .await?;
    let record = stack.api.get(id).await?;
    assert_eq!(record.status, Status::Cancelled);
    assert_eq!(
        record.version, cancelled.version,
        "a late reply changed a cancelled execution"
    );
    assert_eq!(
        (record.first_step, record.step),
        (1, 1),
        "no step launched after the cancellation"
    );
    assert_eq!(record.error.as_ref().unwrap().code, "CANCELLED");
    assert_eq!(record.due_at(), None);

    let again = handlers::cancel(
        &stack.api,
        CancelRequest {
            execution_id: id,
            reason: "twice".into(),
        },
    )
    .await
    .unwrap_err();
    assert_eq!(again.code(), "ALREADY_TERMINAL");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_replay_filters_dry_runs_and_redrives_from_the_execution_dlq() -> anyhow::Result<()> {
    let (stack, steps) =
        on_emulator!(TestStack::with_failing_pricing("e2e-replay", false, |_| {}).await?);
    let mut ids = Vec::new();
    for (n, tenant) in ["acme", "acme", "globex"].into_iter().enumerate() {
        let submitted = stack
            .api
            .submit(SubmitRequest {
                pipeline_id: stack.pipeline.pipeline_id.clone(),
                tenant: tenant.into(),
                input: order_worker::sample_order(n),
                ..Default::default()
            })
            .await?;
        ids.push(submitted.execution);
    }
    for id in &ids {
        let record = stack.wait_dead_lettered(*id).await?;
        assert_eq!(record.status, Status::Failed);
    }
    let dlq = stack.dead_letter_queues()?;
    let replay = |dry_run: bool| {
        OperatorRequest::Replay(ReplayRequest {
            filter: ReplayFilter {
                tenant: Some("acme".into()),
                error_code: Some("PRICING_DOWN".into()),
                ..Default::default()
            },
            dry_run,
            max_messages: 50,
            rate_per_second: Some(10.0),
            reason: "pricing restored".into(),
            onto_release: None,
        })
    };
    let report = |response| match response {
        OperatorResponse::Replay(report) => report,
        other => panic!("unexpected {other:?}"),
    };

    // Dry run: reports the two acme executions, changes nothing.
    let dry = report(handlers::operator(&stack.api, &dlq, replay(true)).await?);
    assert_eq!(
        (dry.examined, dry.matched, dry.replayed),
        (3, 2, 0),
        "{dry:?}"
    );
    let mut matched = dry.executions.clone();
    matched.sort();
    let mut acme = ids[..2].to_vec();
    acme.sort();
    assert_eq!(matched, acme);
    for id in &ids {
        assert_eq!(stack.api.get(*id).await?.status, Status::Failed);
    }

    steps.failing.store(false, Ordering::SeqCst);
    let done = report(handlers::operator(&stack.api, &dlq, replay(false)).await?);
    assert_eq!(
        (done.matched, done.replayed, done.absorbed),
        (2, 2, 0),
        "{done:?}"
    );
    for id in &ids[..2] {
        let record = stack.wait_terminal(*id).await?;
        assert_eq!(record.status, Status::Succeeded);
        assert_eq!(record.redrives.len(), 1);
        assert_eq!(record.redrives[0].reason, "pricing restored");
    }
    assert_eq!(
        stack.api.get(ids[2]).await?.status,
        Status::Failed,
        "globex was filtered out"
    );

    // A copy of a replayed envelope (as a crash between re-drive and delete leaves) is absorbed.
    let (_, dlq_url) = stack.local.stack.queue("ExecutionDeadLetterQueue")?;
    let copy = DeadLetterEnvelope {
        kind: stepline::envelope::DEAD_LETTER_KIND.into(),
        dead_letter_id: Uuid::new_v4(),
        execution_id: ids[0],
        tenant: "acme".into(),
        pipeline_id: stack.pipeline.pipeline_id.clone(),
        release_version: stack.pipeline.release_version.clone(),
        status: Status::Failed,
        step_index: 1,
        step_id: "price".into(),
        attempt: 1,
        error: Some(StepError::new("PRICING_DOWN", "down", false)),
        failed_at: stack.api.now(),
        version: 3,
    };
    stack
        .send_message(dlq_url, serde_json::to_string(&copy)?)
        .await?;
    let again = report(handlers::operator(&stack.api, &dlq, replay(false)).await?);
    assert_eq!(
        (again.matched, again.replayed, again.absorbed),
        (1, 0, 1),
        "{again:?}"
    );
    assert_eq!(
        stack.queue_depth("ExecutionDeadLetterQueue").await?,
        1,
        "only globex's envelope remains"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_requests_stale_launch_work_and_garbage_in_every_queue_change_nothing(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-garbage", |_| {}).await?);
    let mut ids = Vec::new();
    for n in 0..4 {
        ids.push(stack.submit(order_worker::sample_order(n)).await?);
    }
    let sqs = stack.sqs();
    // Two extra copies of each execution's first request, launch work under a lease nobody holds, and
    // garbage in every queue.
    let (_, request_url) = stack.local.stack.queue("OrderRequestQueue")?;
    let requests = stack.take_all("OrderRequestQueue").await?;
    assert_eq!(requests.len(), ids.len());
    for request in &requests {
        for _ in 0..3 {
            sqs.send_message()
                .queue_url(request_url)
                .message_body(request)
                .send()
                .await?;
        }
    }
    let (_, launch_url) = stack.local.stack.queue("LaunchQueue")?;
    for id in &ids {
        let record = stack.api.get(*id).await?;
        let work = LaunchWork {
            execution_id: *id,
            generation: record.generation,
            token: Uuid::new_v4(),
        };
        sqs.send_message()
            .queue_url(launch_url)
            .message_body(serde_json::to_string(&work)?)
            .send()
            .await?;
    }
    for queue in ["LaunchQueue", "ReplyQueue", "OrderRequestQueue"] {
        let (_, url) = stack.local.stack.queue(queue)?;
        for body in ["{{{ not json", r#"{"kind":"stepline.reply.v1"}"#] {
            sqs.send_message()
                .queue_url(url)
                .message_body(body)
                .send()
                .await?;
        }
    }
    stack.start(Arc::new(OrderSteps))?;

    for id in &ids {
        let record = stack.wait_terminal(*id).await?;
        assert_eq!(record.status, Status::Succeeded);
        assert_eq!(
            record.version, HAPPY_PATH_VERSION,
            "a duplicate advanced {id}"
        );
    }
    for dlq in [
        "LaunchDeadLetterQueue",
        "ReplyDeadLetterQueue",
        "OrderRequestDeadLetterQueue",
    ] {
        wait_until(Duration::from_secs(30), || async {
            Ok(stack.queue_depth(dlq).await? == 2)
        })
        .await?;
    }
    Ok(())
}

/// Sends replies to the reply queue's DLQ instead, while `divert` is set (as if they had been
/// dead-lettered after too many receives).
struct DivertingSender {
    inner: SqsSender,
    reply_dlq: String,
    divert: AtomicBool,
}

#[async_trait]
impl MessageSender for DivertingSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        if self.divert.swap(false, Ordering::SeqCst) {
            let parked: Vec<OutMessage> = messages
                .iter()
                .map(|m| OutMessage {
                    attributes: vec![(REASON_ATTRIBUTE.into(), "MAX_RECEIVES".into())],
                    ..m.clone()
                })
                .collect();
            return self.inner.send(&self.reply_dlq, &parked).await;
        }
        self.inner.send(queue, messages).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_dead_lettered_reply_back_resumes_its_execution() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-move", |_| {}).await?);
    let (_, reply_dlq) = stack.local.stack.queue("ReplyDeadLetterQueue")?;
    let sender = Arc::new(DivertingSender {
        inner: SqsSender::new(stack.sqs()),
        reply_dlq: reply_dlq.to_string(),
        divert: AtomicBool::new(true),
    });
    let worker = Arc::new(Worker::new(stack.identity(), sender, Arc::new(OrderSteps)));
    stack.start_worker(worker)?;
    let id = stack.submit(order_worker::sample_order(7)).await?;
    // The first reply is parked in the DLQ: the execution waits at step 0.
    wait_until(Duration::from_secs(30), || async {
        Ok(stack.queue_depth("ReplyDeadLetterQueue").await? == 1)
    })
    .await?;
    assert_eq!(stack.api.get(id).await?.step, 0);

    let queues = stack.dead_letter_queues()?;
    let request = |dry_run: bool| {
        OperatorRequest::Move(MoveRequest {
            queue: Inbox::Reply,
            replay: ReplayRequest {
                filter: ReplayFilter {
                    pipeline_id: Some(stack.pipeline.pipeline_id.clone()),
                    error_code: Some("MAX_RECEIVES".into()),
                    ..Default::default()
                },
                dry_run,
                max_messages: 10,
                rate_per_second: None,
                reason: "reply queue consumer fixed".into(),
                onto_release: None,
            },
        })
    };
    let OperatorResponse::Replay(dry) =
        handlers::operator(&stack.api, &queues, request(true)).await?
    else {
        panic!("a move answers with a report");
    };
    assert_eq!((dry.matched, dry.replayed), (1, 0));
    assert_eq!(dry.executions, vec![id]);
    assert_eq!(stack.api.get(id).await?.step, 0, "a dry run moves nothing");
    // A move sends a message back as it is: it cannot take it onto another release.
    let mut onto = request(false);
    if let OperatorRequest::Move(m) = &mut onto {
        m.replay.onto_release = Some("2".into());
    }
    let refused = handlers::operator(&stack.api, &queues, onto)
        .await
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "INVALID_REQUEST", "{refused}");

    let OperatorResponse::Replay(moved) =
        handlers::operator(&stack.api, &queues, request(false)).await?
    else {
        panic!("a move answers with a report");
    };
    assert_eq!((moved.matched, moved.replayed), (1, 1));
    let record = stack.wait_terminal(id).await?;
    assert_eq!(record.status, Status::Succeeded);
    assert_eq!(
        record.version, HAPPY_PATH_VERSION,
        "the moved reply was applied once"
    );
    assert_eq!(stack.queue_depth("ReplyDeadLetterQueue").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_step_that_outlives_its_timeout_on_its_first_attempt(
) -> anyhow::Result<()> {
    // A 4 s timeout and a 9 s price step: without heartbeats the sweeper would re-send the request at
    // 4 s and give up on the attempt at 8 s. (Heartbeats come every ~1.3 s: wide margins on a busy box.)
    let mut stack = on_emulator!(
        TestStack::new("e2e-beat", |def| {
            for step in &mut def.steps {
                step.timeout_secs = 4;
            }
        })
        .await?
    );
    let steps = Arc::new(SlowPricing::new(Duration::from_secs(9)));
    stack.start(steps.clone())?;
    let id = stack.submit(order_worker::sample_order(8)).await?;

    let record = stack.wait_terminal(id).await?;

    assert_eq!(record.status, Status::Succeeded, "{record:#?}");
    assert_eq!(
        *steps.1.lock().unwrap(),
        vec![launch_id(id, 1, 1)],
        "the slow step ran once, on its first attempt"
    );
    assert!(
        record.version > HAPPY_PATH_VERSION,
        "heartbeats were recorded (each extends the deadline)"
    );
    Ok(())
}
