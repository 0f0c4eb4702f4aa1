//! Release registry and pinning on the local emulator: two releases side by side, each with its own
//! workers on its own request queue; activation never moves running executions; rollback; identity
//! checks at the worker; immutable descriptors.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use order_worker::OrderSteps;
use serde_json::Value;
use stepline::contract::Contract;
use stepline::domain::history::What;
use stepline::domain::{Execution, PipelineDef, Status, StepError};
use stepline::envelope::{RequestHeader, REASON_ATTRIBUTE};
use stepline::handlers::{
    self, OperatorRequest, OperatorResponse, RedriveRequest, ReplayFilter, ReplayReport,
    ReplayRequest,
};
use stepline::ports::{Registration, StoreError};
use stepline::release::Release;
use stepline::worker::StepFunction;
use stepline::{CoordinatorError, SubmitRequest};
use stepline_local::runner::Binding;
use stepline_local::stack::SqsSource;
use stepline_local::{functions, worker_handler};
use stepline_suite::{on_emulator, ExtraQueue, TestStack};
use uuid::Uuid;

/// The example steps, slowed down, recording which executions this worker ran.
struct Recording {
    delay: Duration,
    ran: Mutex<BTreeSet<Uuid>>,
}

impl Recording {
    fn new(delay_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            delay: Duration::from_millis(delay_ms),
            ran: Mutex::new(BTreeSet::new()),
        })
    }

    fn ran(&self) -> BTreeSet<Uuid> {
        self.ran.lock().unwrap().clone()
    }
}

#[async_trait]
impl StepFunction for Recording {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        self.ran.lock().unwrap().insert(request.execution_id);
        tokio::time::sleep(self.delay).await;
        OrderSteps.run(request, input).await
    }
}

/// Release 2: the same steps with a larger retry budget (so another contract), on its own queue.
fn release_two(v1: &PipelineDef, queue: &str) -> PipelineDef {
    let mut def = v1.clone();
    def.release_version = "2".into();
    for step in &mut def.steps {
        step.queue = queue.to_string();
        step.retry.max_attempts = 4;
    }
    def
}

/// Release 2's workers: a worker of release 2's contract polling release 2's queue, deployed as the
/// worker stack `stepline init` writes (its environment; its calls checked against its policies).
fn v2_worker(
    stack: &TestStack,
    def: &PipelineDef,
    queue: &ExtraQueue,
    dlq: &ExtraQueue,
    steps: Arc<Recording>,
) -> anyhow::Result<Binding> {
    let physical = |q: &ExtraQueue| stepline_local::stack::Physical::Queue {
        name: q.name.clone(),
        url: q.url.clone(),
        arn: q.arn.clone(),
    };
    let (clients, config) =
        stack
            .local
            .worker_stack(&physical(queue), &physical(dlq), &def.release_version)?;
    assert_eq!(config.request_dlq_url.as_deref(), Some(dlq.url.as_str()));
    let worker = stepline::aws::worker_on(&clients, &config, &Contract::of(def), steps);
    Ok(Binding::Queue {
        source: SqsSource {
            queue: queue.name.clone(),
            queue_url: queue.url.clone(),
            queue_arn: queue.arn.clone(),
            batch_size: 10,
        },
        handler: worker_handler(Arc::new(worker)),
    })
}

/// Runs the coordinator functions, `workers`, and release 2's workers (`v2` on `queue`, parking on
/// `dlq`) running `v2_steps`.
fn start_beside_release_two(
    stack: &mut TestStack,
    workers: Vec<Binding>,
    (v2, queue, dlq): (&PipelineDef, &ExtraQueue, &ExtraQueue),
    v2_steps: Arc<Recording>,
) -> anyhow::Result<()> {
    let mut bindings = stack.local.coordinator_bindings()?;
    bindings.extend(workers);
    bindings.push(v2_worker(stack, v2, queue, dlq, v2_steps)?);
    stack.start_bindings(bindings)
}

/// The release versions of `items` (activations, releases), in their order.
fn versions<T>(items: Vec<T>, version: impl Fn(T) -> String) -> Vec<String> {
    items.into_iter().map(version).collect()
}

/// Release 2's request queue and its DLQ, beside the stage.
async fn v2_queues(stack: &TestStack) -> anyhow::Result<(ExtraQueue, ExtraQueue)> {
    let stage = &stack.local.stack.stage;
    let queue = stack
        .create_queue(&format!("stepline-{stage}-orders-v2-request"))
        .await?;
    let dlq = stack
        .create_private_queue(&format!("stepline-{stage}-orders-v2-request-dlq"))
        .await?;
    Ok((queue, dlq))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_stay_on_their_release_across_activation_and_rollback() -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-rel", |_| {}).await?);
    let (v2_queue, v2_dlq) = v2_queues(&stack).await?;
    let v1 = stack.pipeline.clone();
    let v2 = release_two(&v1, &v2_queue.name);
    let registry = stack.api.registry().clone();
    assert_eq!(
        registry
            .register(&Release::new(v2.clone(), Vec::new()))
            .await?,
        Registration::Created
    );
    assert_ne!(
        Contract::of(&v1).contract_version,
        Contract::of(&v2).contract_version
    );

    let v1_steps = Recording::new(300);
    let v2_steps = Recording::new(0);
    let v1_worker = stack.local.worker_binding(
        functions::ORDER_WORKER,
        &Contract::of(&v1),
        v1_steps.clone(),
    )?;
    start_beside_release_two(
        &mut stack,
        vec![v1_worker],
        (&v2, &v2_queue, &v2_dlq),
        v2_steps.clone(),
    )?;

    // Release 1 is active: these executions pin it.
    let mut first = Vec::new();
    for n in 0..3 {
        first.push(stack.submit(order_worker::sample_order(n)).await?);
    }
    // Activate release 2 while they run.
    stack
        .api
        .activate_release("orders", "2", "roll out v2")
        .await?;
    let mut running = 0;
    for id in &first {
        if !stack.api.get(*id).await?.status.is_terminal() {
            running += 1;
        }
    }
    assert!(
        running > 0,
        "release 2 was activated after release 1's executions ended"
    );
    let mut second = Vec::new();
    for n in 3..6 {
        second.push(stack.submit(order_worker::sample_order(n)).await?);
    }

    for id in &first {
        let record = stack.wait_terminal(*id).await?;
        assert_eq!(record.status, Status::Succeeded);
        assert_eq!(
            record.release_version, "1",
            "activation moved a running execution"
        );
        assert_eq!(record.contract_version, Contract::of(&v1).contract_version);
    }
    for id in &second {
        let record = stack.wait_terminal(*id).await?;
        assert_eq!(record.status, Status::Succeeded);
        assert_eq!(record.release_version, "2");
        assert_eq!(record.contract_version, Contract::of(&v2).contract_version);
    }
    let (ran_v1, ran_v2) = (v1_steps.ran(), v2_steps.ran());
    assert_eq!(
        ran_v1,
        first.iter().copied().collect(),
        "release 1 ran elsewhere"
    );
    assert_eq!(
        ran_v2,
        second.iter().copied().collect(),
        "release 2 ran elsewhere"
    );

    // Rollback: release 1 active again; new executions run on release 1's workers.
    stack
        .api
        .activate_release("orders", "1", "rollback")
        .await?;
    let back = stack.submit(order_worker::sample_order(9)).await?;
    let record = stack.wait_terminal(back).await?;
    assert_eq!(record.status, Status::Succeeded);
    assert_eq!(record.release_version, "1");
    assert!(v1_steps.ran().contains(&back));
    assert!(!v2_steps.ran().contains(&back));

    let history = versions(registry.history("orders").await?, |a| a.release_version);
    assert_eq!(history, ["1", "2", "1"], "activations are append-only");
    assert_eq!(
        registry.active("orders").await?.unwrap().release_version,
        "1"
    );
    let listed = versions(registry.list("orders").await?, |r| r.release_version);
    assert_eq!(listed, ["1", "2"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_for_another_release_is_dead_lettered_unread_and_fails_its_execution_at_once(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-ident", |_| {}).await?);
    let (v2_queue, v2_dlq) = v2_queues(&stack).await?;
    let v2 = release_two(&stack.pipeline, &v2_queue.name);
    // Misrouted release 3: release 1's contract, but its commands go to release 2's queue.
    let mut v3 = stack.pipeline.clone();
    v3.release_version = "3".into();
    for step in &mut v3.steps {
        step.queue = v2_queue.name.clone();
    }
    stack
        .api
        .registry()
        .register(&Release::new(v3, Vec::new()))
        .await?;
    let v2_steps = Recording::new(0);
    start_beside_release_two(
        &mut stack,
        Vec::new(),
        (&v2, &v2_queue, &v2_dlq),
        v2_steps.clone(),
    )?;

    let submitted = stack
        .api
        .submit(SubmitRequest {
            pipeline_id: "orders".into(),
            release_version: Some("3".into()),
            tenant: "test".into(),
            input: order_worker::sample_order(1),
            idempotency_key: None,
            parent: None,
        })
        .await?;
    let record = stack
        .wait_for(submitted.execution, Duration::from_secs(30), |r| {
            r.status.is_terminal()
        })
        .await?;

    assert_eq!(record.status, Status::Failed, "{record:#?}");
    let error = record.error.as_ref().unwrap();
    assert_eq!(error.code, "IDENTITY_MISMATCH");
    assert!(!error.retryable);
    assert_eq!(
        record.attempt, 1,
        "no attempt was burnt retrying the wrong worker"
    );
    assert!(
        v2_steps.ran().is_empty(),
        "the command was run by the wrong release"
    );

    let parked = stack
        .receive_from(&v2_dlq.url, Duration::from_secs(30))
        .await?;
    assert_eq!(parked.len(), 1);
    let attrs = parked[0].message_attributes.as_ref().unwrap();
    assert_eq!(
        attrs[REASON_ATTRIBUTE].string_value.as_deref(),
        Some("IDENTITY_MISMATCH")
    );
    let detail = attrs[stepline::envelope::DETAIL_ATTRIBUTE]
        .string_value
        .clone()
        .unwrap();
    assert!(
        detail.contains("release 3") && detail.contains("release 2"),
        "{detail}"
    );
    let command: serde_json::Value = serde_json::from_str(parked[0].body.as_deref().unwrap())?;
    assert_eq!(
        command["header"]["executionId"],
        submitted.execution.to_string(),
        "the command is kept whole, with its context"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_descriptors_are_immutable() -> anyhow::Result<()> {
    let stack = on_emulator!(TestStack::new("e2e-immut", |_| {}).await?);
    let registry = stack.api.registry().clone();
    let v2 = release_two(&stack.pipeline, "some-queue");
    let release = Release::new(v2.clone(), Vec::new());
    assert_eq!(registry.register(&release).await?, Registration::Created);
    assert_eq!(
        registry.register(&release).await?,
        Registration::Unchanged,
        "identical re-registration is a no-op"
    );
    let mut changed = v2.clone();
    changed.steps[0].timeout_secs += 1; // a deployment setting: same contract, other descriptor
    assert_eq!(
        registry.register(&Release::new(changed, Vec::new())).await,
        Err(StoreError::Conflict),
        "different content under the same version is a conflict"
    );
    assert_eq!(registry.get("orders", "2").await?, Some(release));
    assert!(matches!(
        stack
            .api
            .activate_release("orders", "9", "no such release")
            .await,
        Err(CoordinatorError::UnknownRelease { .. })
    ));
    Ok(())
}

/// Release 1's steps with a bug: pricing fails for good on an order of three espressos.
struct BuggyPricing;

#[async_trait]
impl StepFunction for BuggyPricing {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id == "price" && input["lines"][0]["qty"] == 3 {
            return Err(StepError::new("PRICING_BUG", "three of a kind", false));
        }
        OrderSteps.run(request, input).await
    }
}

/// Release 1 with its pricing bug on the stack's workers, beside it release 2 (the fix: the same steps
/// and contract, its code behind its own queue) and release 3 (every step's retry policy changed: not
/// a fix an execution can continue on). Six orders run on release 1: orders 2 and 5 have three
/// espressos and fail at pricing, the others succeed.
struct Hotfix {
    fixed_steps: Arc<Recording>,
    failed: Vec<Execution>,
    succeeded: Vec<Execution>,
}

async fn run_into_the_pricing_bug(stack: &mut TestStack) -> anyhow::Result<Hotfix> {
    let (v2_queue, v2_dlq) = v2_queues(stack).await?;
    let v1 = stack.pipeline.clone();
    let mut fixed = v1.clone();
    fixed.release_version = "2".into();
    for step in &mut fixed.steps {
        step.queue = v2_queue.name.clone();
    }
    let mut other = release_two(&v1, &v2_queue.name);
    other.release_version = "3".into();
    let registry = stack.api.registry().clone();
    for def in [&fixed, &other] {
        registry
            .register(&Release::new(def.clone(), Vec::new()))
            .await?;
    }
    let v1_worker = stack.local.worker_binding(
        functions::ORDER_WORKER,
        &Contract::of(&v1),
        Arc::new(BuggyPricing),
    )?;
    let fixed_steps = Recording::new(0);
    let releases = (&fixed, &v2_queue, &v2_dlq);
    start_beside_release_two(stack, vec![v1_worker], releases, fixed_steps.clone())?;

    let ids = stack.submit_orders(6).await?;
    let mut ended = Vec::new();
    for id in &ids {
        ended.push(stack.wait_terminal(*id).await?);
    }
    let (failed, succeeded): (Vec<_>, Vec<_>) =
        ended.into_iter().partition(|r| r.status == Status::Failed);
    assert_eq!(failed.len(), 2, "{failed:#?}");
    assert!(failed
        .iter()
        .all(|r| r.error.as_ref().unwrap().code == "PRICING_BUG" && r.step == 1));
    assert!(succeeded.iter().all(|r| r.status == Status::Succeeded));
    Ok(Hotfix {
        fixed_steps,
        failed,
        succeeded,
    })
}

/// The moved executions ran on release 2's workers alone and succeeded there, their notes and history
/// saying from which release to which; the others ended on release 1, never re-driven.
async fn moved_onto_the_fix(stack: &TestStack, hotfix: &Hotfix) -> anyhow::Result<()> {
    for record in &hotfix.failed {
        let done = stack.wait_terminal(record.id).await?;
        assert_eq!(done.status, Status::Succeeded, "{done:#?}");
        assert_eq!(done.release_version, "2");
        let note = done.redrives.last().unwrap();
        assert_eq!(
            (note.from_release.as_deref(), note.to_release.as_deref()),
            (Some("1"), Some("2"))
        );
        let history = stack.api.history(record.id).await?;
        assert!(
            history.entries.iter().any(|e| matches!(
                &e.what,
                What::Redriven { release: Some(r), .. } if r == "2"
            )),
            "{history:#?}"
        );
    }
    let moved: BTreeSet<Uuid> = hotfix.failed.iter().map(|r| r.id).collect();
    assert_eq!(
        hotfix.fixed_steps.ran(),
        moved,
        "release 2 ran the moved executions alone"
    );
    for record in &hotfix.succeeded {
        let now = stack.api.get(record.id).await?;
        assert_eq!(
            (now.status, now.release_version.as_str()),
            (Status::Succeeded, "1")
        );
        assert!(now.redrives.is_empty());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_executions_move_onto_a_fixed_release_and_succeed_while_the_others_never_notice(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-hotfix", |_| {}).await?);
    let hotfix = run_into_the_pricing_bug(&mut stack).await?;
    let failed = &hotfix.failed;

    // A re-drive as an operator makes it: on the record as it is now (a failed execution's record
    // still moves as its dead-letter envelope is confirmed sent), again if it moved meanwhile.
    let redrive = |id: Uuid, release: &'static str| {
        let api = &stack.api;
        async move {
            for _ in 0..20 {
                let record = api.get(id).await?;
                let request = RedriveRequest {
                    execution_id: id,
                    expected_version: record.version,
                    reason: format!("pricing fixed in release {release}"),
                    release_version: Some(release.into()),
                };
                match api.redrive(request).await {
                    Err(e) if e.code().as_str() == "VERSION_CONFLICT" => continue,
                    outcome => return outcome,
                }
            }
            panic!("execution {id} kept changing under 20 re-drives");
        }
    };
    // Onto release 3: refused with its code, the reasons and the diff; nothing moves.
    let refused = redrive(failed[0].id, "3").await.unwrap_err();
    assert_eq!(refused.code().as_str(), "INCOMPATIBLE_RELEASE");
    let message = refused.to_string();
    assert!(
        message.contains("validate (before it) changed its contract: retry")
            && message.contains("\"to\":\"3\""),
        "{message}"
    );
    let unmoved = stack.api.get(failed[0].id).await?;
    assert_eq!(
        (unmoved.status, unmoved.release_version.as_str()),
        (Status::Failed, "1")
    );
    assert!(unmoved.redrives.is_empty());

    // Onto release 2: both move, run on release 2's workers, and succeed.
    for record in failed {
        let moved = redrive(record.id, "2").await?;
        assert_eq!(moved.status, Status::Queued);
    }
    moved_onto_the_fix(&stack, &hotfix).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_replay_moves_one_bugs_failures_onto_the_fix_after_a_dry_run_and_keeps_a_refused_move(
) -> anyhow::Result<()> {
    let mut stack = on_emulator!(TestStack::new("e2e-bulk-hotfix", |_| {}).await?);
    let hotfix = run_into_the_pricing_bug(&mut stack).await?;
    for record in &hotfix.failed {
        stack.wait_dead_lettered(record.id).await?;
    }
    let dlq = stack.dead_letter_queues()?;
    let replay = |step: &str, onto: &str, dry_run: bool| {
        OperatorRequest::Replay(ReplayRequest {
            filter: ReplayFilter {
                pipeline_id: Some(stack.pipeline.pipeline_id.clone()),
                release_version: Some("1".into()),
                step_id: Some(step.into()),
                error_code: Some("PRICING_BUG".into()),
                ..Default::default()
            },
            dry_run,
            max_messages: 50,
            rate_per_second: Some(5.0),
            reason: format!("pricing fixed in release {onto}"),
            onto_release: Some(onto.into()),
        })
    };
    let run = |request| {
        let (api, dlq) = (&stack.api, &dlq);
        async move {
            match handlers::operator(api, dlq, request).await? {
                OperatorResponse::Replay(report) => anyhow::Ok(report),
                other => anyhow::bail!("unexpected {other:?}"),
            }
        }
    };
    let counts = |r: &ReplayReport| (r.matched, r.replayed, r.failed);
    let failed: BTreeSet<Uuid> = hotfix.failed.iter().map(|r| r.id).collect();
    let unmoved = || async {
        for id in &failed {
            let record = stack.api.get(*id).await?;
            assert_eq!(
                (record.status, record.release_version.as_str()),
                (Status::Failed, "1")
            );
            assert!(record.redrives.is_empty());
        }
        anyhow::Ok(())
    };

    // Another step matches nothing; the dry run lists the two failures and moves nothing.
    let other_step = run(replay("validate", "2", true)).await?;
    assert_eq!(
        (other_step.matched, other_step.replayed),
        (0, 0),
        "{other_step:?}"
    );
    let dry = run(replay("price", "2", true)).await?;
    assert_eq!(
        (dry.examined, dry.matched, dry.replayed),
        (2, 2, 0),
        "{dry:?}"
    );
    assert_eq!(
        dry.executions.iter().copied().collect::<BTreeSet<_>>(),
        failed
    );
    unmoved().await?;

    // Onto release 3: each move refused with its code and the diff, both kept in the DLQ.
    let refused = run(replay("price", "3", false)).await?;
    assert_eq!(counts(&refused), (2, 0, 2), "{refused:?}");
    assert!(refused
        .refused
        .iter()
        .all(|r| r.code == "INCOMPATIBLE_RELEASE"
            && r.message.contains("\"to\":\"3\"")
            && r.execution_id.is_some_and(|id| failed.contains(&id))));
    unmoved().await?;

    // Onto release 2: both move and succeed there; the DLQ is empty after.
    let moved = run(replay("price", "2", false)).await?;
    assert_eq!(counts(&moved), (2, 2, 0), "{moved:?}");
    moved_onto_the_fix(&stack, &hotfix).await?;
    let after = run(replay("price", "2", true)).await?;
    assert_eq!(after.examined, 0, "{after:?}");
    Ok(())
}
