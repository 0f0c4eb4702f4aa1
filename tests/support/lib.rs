//! Support for the end-to-end suite: each test provisions its own stage of template.yaml on the local
//! emulator (so tests run in parallel without sharing queues or tables), registers the example pipeline
//! and runs the real handlers behind the local runner. Waits poll with deadlines.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use stepline::config::CoordinatorConfig;
use stepline::contract::Contract;
use stepline::domain::{Execution, PipelineDef, StepDef, StepError};
use stepline::envelope::{Identity, RequestHeader};
use stepline::handlers::DeadLetterQueues;
use stepline::release::Release;
use stepline::worker::{StepFunction, Worker};
use stepline::{Coordinator, SubmitRequest};
use stepline_local::{
    fresh_stage, functions, Binding, LocalStack, Runner, RunnerOptions, ShiftedClock,
};
use uuid::Uuid;

pub use stepline_local;

/// Evaluates `$provision` (what a test runs on, e.g. `TestStack::running("e2e-x").await?`) once
/// `stepline_local::needs_emulator!` has let the test go on: without the emulator the test returns
/// there, its skip recorded, before anything is provisioned.
#[macro_export]
macro_rules! on_emulator {
    ($provision:expr) => {{
        $crate::stepline_local::needs_emulator!();
        $provision
    }};
}

/// The workspace's function binaries, run under the test-served Lambda Runtime API.
pub mod binaries {
    use std::collections::BTreeMap;

    use anyhow::Result;
    use stepline_local::runtime_api::Function;

    /// Starts a workspace binary (built before the tests) under the test-served Runtime API.
    pub async fn start(binary: &str, env: &BTreeMap<String, String>) -> Result<Function> {
        Function::start(&stepline_local::binaries::path(binary)?, env).await
    }
}

pub struct TestStack {
    pub local: LocalStack,
    /// A coordinator as an operator's tools build it (no sealing keys; calls not checked).
    pub api: Coordinator,
    /// The submit endpoint's function (`ApiFunction`): what `submit` goes through.
    submitter: Coordinator,
    pub pipeline: PipelineDef,
    runner: Option<Runner>,
}

impl TestStack {
    /// Provisions a fresh stage and registers the example pipeline (optionally reshaped by `tune`).
    /// Lifecycle events are off (their outbox writes would blur the version counts tests assert);
    /// `with_lifecycle_events` turns them on.
    pub async fn new(prefix: &str, tune: impl FnOnce(&mut PipelineDef)) -> Result<Self> {
        Self::with_parameters(prefix, &[], tune).await
    }

    pub async fn with_lifecycle_events(
        prefix: &str,
        tune: impl FnOnce(&mut PipelineDef),
    ) -> Result<Self> {
        Self::with_parameters(prefix, &[("LifecycleEvents", "true")], tune).await
    }

    /// A stack with some of the template's parameters overridden.
    pub async fn with_parameters(
        prefix: &str,
        parameters: &[(&str, &str)],
        tune: impl FnOnce(&mut PipelineDef),
    ) -> Result<Self> {
        stepline_local::require_emulator();
        let params = parameters
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let local = LocalStack::up_with(&fresh_stage(prefix), &params).await?;
        let api = local.operator()?;
        let (queue, _) = local.stack.queue("OrderRequestQueue")?;
        let mut pipeline = order_worker::pipeline(queue);
        tune(&mut pipeline);
        let release = Release::new(pipeline.clone(), Vec::new());
        api.register_release(&release).await?;
        let (id, version) = (&pipeline.pipeline_id, &pipeline.release_version);
        api.activate_release(id, version, "test").await?;
        let submitter = local.coordinator("ApiFunction")?;
        Ok(Self {
            local,
            api,
            submitter,
            pipeline,
            runner: None,
        })
    }

    /// A stack of the example pipeline as registered, running the order steps.
    pub async fn running(prefix: &str) -> Result<Self> {
        let mut stack = Self::new(prefix, |_| {}).await?;
        stack.start(Arc::new(order_worker::OrderSteps))?;
        Ok(stack)
    }

    /// validate -> approve (await, `wait_secs`, interaction `manager`) -> price, with the approval notice
    /// on a queue of its own, running the order steps. Returns the stack and the notice queue's URL.
    pub async fn with_approval(prefix: &str, wait_secs: u32) -> Result<(Self, String)> {
        let notices = format!("stepline-{}-approvals", Uuid::new_v4().simple());
        let mut stack = Self::new(prefix, |def| {
            let mut approve = await_step(def, "approve", &notices, vec!["manager".into()]);
            approve.timeout_secs = wait_secs;
            def.steps.insert(1, approve);
            def.steps.truncate(3); // validate, approve, price
        })
        .await?;
        let url = stack.create_queue(&notices).await?.url;
        stack.start(Arc::new(order_worker::OrderSteps))?;
        Ok((stack, url))
    }

    /// A stack whose `price` step fails (with `retryable` errors) until told otherwise, running.
    pub async fn with_failing_pricing(
        prefix: &str,
        retryable: bool,
        tune: impl FnOnce(&mut PipelineDef),
    ) -> Result<(Self, Arc<FlakyPricing>)> {
        let mut stack = Self::new(prefix, tune).await?;
        let steps = FlakyPricing::failing(retryable);
        stack.start(steps.clone())?;
        Ok((stack, steps))
    }

    /// Runs the coordinator functions and the order worker function with `steps`.
    pub fn start(&mut self, steps: Arc<dyn StepFunction>) -> Result<()> {
        let worker = self.local.worker_binding(
            functions::ORDER_WORKER,
            &Contract::of(&self.pipeline),
            steps,
        )?;
        self.start_with(worker)
    }

    /// The identity of the registered example release (what its workers serve).
    pub fn identity(&self) -> Identity {
        Identity {
            pipeline_id: self.pipeline.pipeline_id.clone(),
            contract_version: Contract::of(&self.pipeline).contract_version,
            release_version: self.pipeline.release_version.clone(),
        }
    }

    /// Runs the coordinator functions and the given worker binding.
    pub fn start_with(&mut self, worker: Binding) -> Result<()> {
        let mut bindings = self.local.coordinator_bindings()?;
        bindings.push(worker);
        self.start_bindings(bindings)
    }

    /// Runs the coordinator functions and `worker` as the order worker function.
    pub fn start_worker(&mut self, worker: Arc<Worker>) -> Result<()> {
        self.start_with(Binding::Sqs {
            function: functions::ORDER_WORKER.into(),
            handler: stepline_local::worker_handler(worker),
        })
    }

    /// Runs exactly the given bindings.
    pub fn start_bindings(&mut self, bindings: Vec<Binding>) -> Result<()> {
        self.runner = Some(self.local.run(
            bindings,
            RunnerOptions {
                tick: Duration::from_millis(300),
                pollers: 2,
            },
        )?);
        Ok(())
    }

    pub fn stop(&mut self) {
        self.runner = None;
    }

    /// Submits a sample order as a caller of the submit endpoint does (its function's coordinator).
    pub async fn submit(&self, input: serde_json::Value) -> Result<Uuid> {
        Ok(self
            .submitter
            .submit(SubmitRequest {
                pipeline_id: self.pipeline.pipeline_id.clone(),
                tenant: "test".into(),
                input,
                ..Default::default()
            })
            .await?
            .execution)
    }

    /// Submits a sample order under an idempotency key, retrying a failed submit (its response may
    /// have been lost) with the same key, as a caller would, for up to 30 s.
    pub async fn submit_keyed(&self, input: serde_json::Value, key: &str) -> Result<Uuid> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let submitted = self
                .submitter
                .submit(SubmitRequest {
                    pipeline_id: self.pipeline.pipeline_id.clone(),
                    tenant: "test".into(),
                    input: input.clone(),
                    idempotency_key: Some(key.to_string()),
                    ..Default::default()
                })
                .await;
            match submitted {
                Ok(submitted) => return Ok(submitted.execution),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The functions' calls (handlers', workers' and the submit endpoint's) go out on `clients`
    /// from now on; the operator's, the event sources' and the checks' stay on the emulator's.
    pub fn with_function_clients(self, clients: stepline::aws::Clients) -> Result<Self> {
        let local = self.local.with_function_clients(clients);
        let submitter = local.coordinator("ApiFunction")?;
        Ok(Self {
            local,
            submitter,
            ..self
        })
    }

    /// Submits `count` sample orders, 25 at a time.
    pub async fn submit_orders(&self, count: usize) -> Result<Vec<Uuid>> {
        let mut ids = Vec::with_capacity(count);
        for chunk in (0..count).collect::<Vec<_>>().chunks(25) {
            let submits = chunk
                .iter()
                .map(|n| self.submit(order_worker::sample_order(*n)));
            for id in futures_util::future::join_all(submits).await {
                ids.push(id?);
            }
        }
        Ok(ids)
    }

    /// The environment a function of the template runs with here: its own variables and the
    /// emulator's endpoint and credentials.
    pub fn function_env(
        &self,
        function: &str,
    ) -> Result<std::collections::BTreeMap<String, String>> {
        let mut env = self.local.stack.function(function)?.env.clone();
        for (key, value) in std::env::vars() {
            if key.starts_with("AWS_") {
                env.insert(key, value);
            }
        }
        env.insert("RUST_LOG".into(), "warn".into());
        Ok(env)
    }

    /// A coordinator of `function` (its IAM policies checked) whose clock runs `offset` ahead (to
    /// make leases and deadlines expire).
    pub fn coordinator_at(&self, function: &str, offset: Duration) -> Result<Coordinator> {
        let config = CoordinatorConfig::from_lookup(self.local.stack.env_of(function)?)?;
        Ok(stepline::aws::coordinator_on(
            &self.local.function_clients(function)?,
            &config,
            Arc::new(ShiftedClock(offset)),
        ))
    }

    /// Polls the execution until `done` holds, or fails after `timeout` with the last record seen.
    pub async fn wait_for(
        &self,
        id: Uuid,
        timeout: Duration,
        done: impl Fn(&Execution) -> bool,
    ) -> Result<Execution> {
        let deadline = Instant::now() + timeout;
        loop {
            let record = self.api.get(id).await?;
            if done(&record) {
                return Ok(record);
            }
            if Instant::now() > deadline {
                bail!("condition not reached within {timeout:?}; last record: {record:#?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the execution has ended and its dead-letter envelope is sent (one more write).
    pub async fn wait_dead_lettered(&self, id: Uuid) -> Result<Execution> {
        self.wait_for(id, Duration::from_secs(60), |r| {
            r.status.is_terminal() && r.dead_letter.as_ref().is_some_and(|d| d.sent)
        })
        .await
    }

    pub async fn wait_terminal(&self, id: Uuid) -> Result<Execution> {
        self.wait_for(id, Duration::from_secs(60), |r| r.status.is_terminal())
            .await
    }

    /// A worker of the registered release running `steps`, configured from the order worker
    /// function's environment (its dead-letter queue and payload bucket).
    pub fn worker(&self, steps: Arc<dyn StepFunction>) -> Result<Worker> {
        let env = self.local.stack.env_of(functions::ORDER_WORKER)?;
        let config = stepline::config::WorkerConfig::from_lookup(env)?;
        Ok(stepline::aws::worker_on(
            &self.local.function_clients(functions::ORDER_WORKER)?,
            &config,
            &Contract::of(&self.pipeline),
            steps,
        ))
    }

    /// The claim check the coordinator functions use (the stack's payload bucket).
    pub fn claims(&self) -> Result<stepline::claims::ClaimCheck> {
        let env = self.local.stack.env_of(functions::REDRIVE)?;
        let config = CoordinatorConfig::from_lookup(env)?;
        self.local
            .clients
            .claims(&config.payloads)
            .context("the stack has a payload bucket")
    }

    /// Whether the payload bucket holds `value` claim-checked for execution `id` (under its content
    /// address, as the coordinator stores it).
    pub async fn holds_payload(&self, id: Uuid, value: &Value) -> Result<bool> {
        use sha2::Digest;
        let claims = self.claims()?;
        let bytes = serde_json::to_vec(value)?;
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        let reference = stepline::domain::payload::PayloadRef {
            bucket: claims.bucket().into(),
            key: stepline::claims::ClaimCheck::key(id, &sha256),
            size: bytes.len() as u64,
            sha256,
        };
        match claims.fetch(&reference).await {
            Ok(_) => Ok(true),
            Err(stepline::claims::ClaimError::Unresolvable(_)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The reasons of every message in the reply DLQ, once it holds `count` (sorted; received, so
    /// hidden from the next call for the queue's visibility timeout).
    pub async fn dead_letter_reasons(&self, count: u64) -> Result<Vec<String>> {
        wait_until(Duration::from_secs(30), || async {
            Ok(self.queue_depth("ReplyDeadLetterQueue").await? == count)
        })
        .await?;
        let (_, dlq) = self.local.stack.queue("ReplyDeadLetterQueue")?;
        let mut reasons = Vec::new();
        while reasons.len() < count as usize {
            for m in stepline_local::receive(&self.sqs(), dlq).await? {
                let attrs = m.message_attributes.unwrap_or_default();
                reasons.push(
                    attrs
                        .get(stepline::envelope::REASON_ATTRIBUTE)
                        .and_then(|a| a.string_value.clone())
                        .unwrap_or_default(),
                );
            }
        }
        reasons.sort();
        Ok(reasons)
    }

    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        aws_sdk_sqs::Client::new(&self.local.sdk)
    }

    /// Sends `body` to a queue (by URL), as anyone allowed to send to it may.
    pub async fn send_message(&self, url: &str, body: impl Into<String>) -> Result<()> {
        self.sqs()
            .send_message()
            .queue_url(url)
            .message_body(body)
            .send()
            .await?;
        Ok(())
    }

    /// Sends `body` to a queue of the stack, as anyone allowed to send to it may.
    pub async fn send_to(&self, logical: &str, body: impl Into<String>) -> Result<()> {
        let (_, url) = self.local.stack.queue(logical)?;
        self.send_message(url, body).await
    }

    /// Visible plus in-flight messages of a queue of the stack.
    pub async fn queue_depth(&self, logical: &str) -> Result<u64> {
        self.local.queue_depth(logical).await
    }

    /// Asserts that a queue of the stack holds no message, visible or in flight (`why`: what that
    /// shows).
    pub async fn assert_empty(&self, logical: &str, why: &str) -> Result<()> {
        assert_eq!(self.queue_depth(logical).await?, 0, "{why}");
        Ok(())
    }

    /// Polls until a queue of the stack is empty (everything received and deleted).
    pub async fn wait_drained(&self, logical: &str, timeout: Duration) -> Result<()> {
        wait_until(timeout, || async {
            Ok(self.queue_depth(logical).await? == 0)
        })
        .await
    }

    /// Polls a queue (by URL) until messages arrive; returns them with their attributes (not deleted).
    pub async fn receive_from(
        &self,
        url: &str,
        timeout: Duration,
    ) -> Result<Vec<aws_sdk_sqs::types::Message>> {
        let deadline = Instant::now() + timeout;
        loop {
            let messages = stepline_local::receive(&self.sqs(), url).await?;
            if !messages.is_empty() {
                return Ok(messages);
            }
            if Instant::now() > deadline {
                bail!("no message on {url} within {timeout:?}");
            }
        }
    }

    /// Receives every message currently visible on a queue of the stack (and deletes them).
    pub async fn take_all(&self, logical: &str) -> Result<Vec<String>> {
        self.local.take_all(logical).await
    }
}

/// A queue a test created beside the stack (e.g. a second release's request queue).
pub struct ExtraQueue {
    pub name: String,
    pub url: String,
    pub arn: String,
}

impl TestStack {
    /// Creates a queue outside the template as a worker stack makes its request queue: the queue
    /// policy of `stepline init`'s template governs it (the coordinator's roles may send to it, no
    /// one else).
    pub async fn create_queue(&self, name: &str) -> Result<ExtraQueue> {
        let queue = self.create_private_queue(name).await?;
        self.local
            .adopt_worker_queue(&stepline_local::stack::Physical::Queue {
                name: queue.name.clone(),
                url: queue.url.clone(),
                arn: queue.arn.clone(),
            })?;
        Ok(queue)
    }

    /// Creates a queue outside the template with no queue policy (a worker stack's DLQ, a
    /// subscriber's queue): only identity policies decide who may use it.
    pub async fn create_private_queue(&self, name: &str) -> Result<ExtraQueue> {
        let (url, arn) = stepline_local::stack::create_plain_queue(&self.sqs(), name).await?;
        Ok(ExtraQueue {
            name: name.into(),
            url,
            arn,
        })
    }
}

impl TestStack {
    /// The DLQs the operator function reads, as its configuration names them.
    pub fn dead_letter_queues(&self) -> Result<DeadLetterQueues> {
        let env = self.local.stack.env_of(functions::REDRIVE)?;
        let config = stepline::config::CoordinatorConfig::from_lookup(env)?;
        Ok(stepline::aws::dead_letter_queues(
            &self.sqs(),
            &config.queues,
        ))
    }
}

/// An await step with the settings of the pipeline's first step, announced on `queue`, waiting on
/// `interactions`.
pub fn await_step(def: &PipelineDef, id: &str, queue: &str, interactions: Vec<String>) -> StepDef {
    let first = &def.steps[0];
    StepDef::await_step(id, queue)
        .types(first.input_type.clone(), first.output_type.clone())
        .timeout_secs(first.timeout_secs)
        .retry(first.retry.clone())
        .interactions(interactions)
}

/// The order steps with `price` failing (with `retryable` errors) while `failing` is set.
pub struct FlakyPricing {
    pub failing: AtomicBool,
    pub retryable: bool,
    /// The launch ids `price` ran for, in order.
    pub price_launches: std::sync::Mutex<Vec<uuid::Uuid>>,
}

impl FlakyPricing {
    /// Failing from the start.
    pub fn failing(retryable: bool) -> Arc<Self> {
        Arc::new(Self {
            failing: AtomicBool::new(true),
            retryable,
            price_launches: Default::default(),
        })
    }

    pub fn price_runs(&self) -> usize {
        self.price_launches().len()
    }

    pub fn price_launches(&self) -> Vec<uuid::Uuid> {
        self.price_launches.lock().expect("launches").clone()
    }
}

#[async_trait::async_trait]
impl StepFunction for FlakyPricing {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        if request.step_id == "price" {
            self.price_launches
                .lock()
                .expect("launches")
                .push(request.launch_id);
            if self.failing.load(Ordering::SeqCst) {
                return Err(StepError::new(
                    "PRICING_DOWN",
                    "pricing service unavailable",
                    self.retryable,
                ));
            }
        }
        order_worker::OrderSteps.run(request, input).await
    }
}

/// Polls an async condition until it holds or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut condition: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("condition not reached within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
