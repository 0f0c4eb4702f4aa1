//! The local stack: provisions template.yaml's resources on the emulator `AWS_ENDPOINT_URL` points at
//! (moto or LocalStack) and runs the project's handlers behind emulated Lambda event sources.

pub mod binaries;
pub mod endpoint;
pub mod runner;
pub mod runtime_api;
pub mod testing;

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

use anyhow::Result;
use aws_sdk_sqs::types::Message;
use stepline::aws::Clients;
use stepline::config::WorkerConfig;
use stepline::contract::Contract;
use stepline::domain::PipelineDef;
use stepline::release::Release;
use stepline::worker::{StepFunction, Worker};
use stepline_stage::releases::PipelineCode;

pub use runner::{Binding, Runner, RunnerOptions};
pub use stepline_stage::{
    example_contract_artifact, functions, iam, observe, read_artifact, releases, stack, template,
    workspace_root, Stack, Stage, Template, ORDER_REQUEST_QUEUE,
};

/// A DynamoDB item, by attribute name.
pub type Item = std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>;

/// A provisioned stage with the example pipelines and the local runner at hand.
pub struct LocalStack(Stage);

impl Deref for LocalStack {
    type Target = Stage;

    fn deref(&self) -> &Stage {
        &self.0
    }
}

impl LocalStack {
    /// Provisions the project's template under `stage` (reusing what exists of it as it is).
    pub async fn up(stage: &str) -> Result<Self> {
        Stage::up(stage).await.map(Self)
    }

    /// Finds an already deployed stage (on AWS or an emulator), creating nothing.
    pub async fn find(stage: &str) -> Result<Self> {
        Stage::find(stage).await.map(Self)
    }

    /// Provisions with template parameters overridden (e.g. shorter leases for tests).
    pub async fn up_with(stage: &str, overrides: &BTreeMap<String, String>) -> Result<Self> {
        Stage::up_with(stage, overrides).await.map(Self)
    }

    /// Handlers, workers and the runner built from now on use `clients`.
    pub fn with_clients(self, clients: Clients) -> Self {
        Self(self.0.with_clients(clients))
    }

    /// Handlers and workers built from now on call the services on `clients`; the runner (Lambda's
    /// event sources) and the operator stay on the stage's own.
    pub fn with_function_clients(self, clients: Clients) -> Self {
        Self(self.0.with_function_clients(clients))
    }

    /// Bindings of the claim, launch and completion functions, each with its own coordinator instance
    /// (as separate Lambda functions would have).
    pub fn coordinator_bindings(&self) -> Result<Vec<Binding>> {
        self.coordinator_bindings_with(1)
    }

    /// The coordinator functions' bindings with `completions` completion instances, each a
    /// coordinator of its own (its own cache), taking the reply queue's batches in turn: as Lambda
    /// spreads a queue's batches over the function's warm instances.
    pub fn coordinator_bindings_with(&self, completions: usize) -> Result<Vec<Binding>> {
        let claim = Arc::new(self.coordinator(functions::CLAIM)?);
        let launch = Arc::new(self.coordinator(functions::LAUNCH)?);
        let instances = (0..completions.max(1))
            .map(|_| self.coordinator(functions::COMPLETION).map(Arc::new))
            .collect::<Result<Vec<_>>>()?;
        let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let completion = move || {
            let n = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            instances[n % instances.len()].clone()
        };
        Ok(vec![
            Binding::Schedule {
                function: functions::CLAIM.into(),
                handler: Arc::new(move |event| {
                    let claim = claim.clone();
                    Box::pin(async move {
                        if let Err(e) = stepline::handlers::claim(&claim, event).await {
                            tracing::warn!(code = %e.code(), error = %e, "claim run failed");
                        }
                    })
                }),
            },
            Binding::Sqs {
                function: functions::LAUNCH.into(),
                handler: Arc::new(move |event| {
                    let launch = launch.clone();
                    Box::pin(async move { stepline::handlers::launch(&launch, event).await })
                }),
            },
            Binding::Sqs {
                function: functions::COMPLETION.into(),
                handler: Arc::new(move |event| {
                    let completion = completion();
                    Box::pin(
                        async move { stepline::handlers::completion(&completion, event).await },
                    )
                }),
            },
        ])
    }

    /// Binding of a worker function built for `contract`, running `steps`, with the release and DLQ
    /// from its environment.
    pub fn worker_binding(
        &self,
        function: &str,
        contract: &Contract,
        steps: Arc<dyn StepFunction>,
    ) -> Result<Binding> {
        let config = WorkerConfig::from_lookup(self.stack.env_of(function)?)?;
        // The function's own clients: its calls are checked against its IAM policies.
        let worker = Arc::new(stepline::aws::worker_on(
            &self.function_clients(function)?,
            &config,
            contract,
            steps,
        ));
        Ok(Binding::Sqs {
            function: function.to_string(),
            handler: worker_handler(worker),
        })
    }

    /// Runs the coordinator functions and the worker functions `workers` (function, contract, steps).
    pub fn run_workers(
        &self,
        workers: Vec<(&str, Contract, Arc<dyn StepFunction>)>,
    ) -> Result<Runner> {
        self.run_workers_with(workers, RunnerOptions::default())
    }

    /// [`LocalStack::run_workers`] with other runner options: more pollers where a test holds more
    /// invocations open at once than the default allows (Lambda scales its pollers out).
    pub fn run_workers_with(
        &self,
        workers: Vec<(&str, Contract, Arc<dyn StepFunction>)>,
        options: RunnerOptions,
    ) -> Result<Runner> {
        let mut bindings = self.coordinator_bindings()?;
        for (function, contract, steps) in workers {
            bindings.push(self.worker_binding(function, &contract, steps)?);
        }
        self.run(bindings, options)
    }

    /// Releases the restaurant example on its request and approval queues (approvals wait 120 s).
    pub async fn release_restaurant(&self) -> Result<Release> {
        let (requests, _) = self.stack.queue("RestaurantRequestQueue")?;
        let (approvals, _) = self.stack.queue("RestaurantApprovalQueue")?;
        let def = restaurant_approval::pipeline(requests, approvals, 120);
        self.release(def, Vec::new()).await
    }

    /// Releases the example pipeline on `queue` (its worker's request queue) as `release_version`,
    /// with the committed contract file as its artifact, as [`Stage::release`] does.
    pub async fn release_example(
        &self,
        queue: &str,
        release_version: &str,
        step_timeout_secs: u32,
    ) -> Result<Release> {
        let release = stepline_stage::example_release(
            order_worker::pipeline(queue),
            release_version,
            step_timeout_secs,
        )?;
        self.publish(release).await
    }
}

/// The example pipelines' contracts, each with the file it is committed as (relative to the workspace).
pub fn example_contracts() -> [(&'static str, Contract); 4] {
    [
        (
            "examples/order-worker/pipeline-contract.json",
            order_worker::contract(),
        ),
        (
            "examples/restaurant-approval/pipeline-contract.json",
            restaurant_approval::contract(),
        ),
        (
            "examples/csv-payments/pipeline-contract.json",
            csv_payments::batch_contract(),
        ),
        (
            "examples/csv-payments/payment-contract.json",
            csv_payments::payment_contract(),
        ),
    ]
}

/// The release commands on the example pipelines' code, linked into this crate.
pub struct ExampleCode;

impl PipelineCode for ExampleCode {
    fn example(&self, queue: &str) -> Result<PipelineDef> {
        Ok(order_worker::pipeline(queue))
    }

    fn contract(&self, pipeline: &str) -> Result<Option<Contract>> {
        Ok(example_contracts()
            .into_iter()
            .map(|(_, contract)| contract)
            .find(|c| c.pipeline_id == pipeline))
    }
}

/// The handler of a worker.
pub fn worker_handler(worker: Arc<Worker>) -> runner::SqsHandler {
    Arc::new(move |event| {
        let worker = worker.clone();
        Box::pin(async move { worker.handle(event).await })
    })
}

impl LocalStack {
    /// Visible, in-flight and delayed messages of a queue of the stack.
    pub async fn queue_depth(&self, logical: &str) -> Result<u64> {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let attrs = self
            .queue_attributes(
                logical,
                &[
                    A::ApproximateNumberOfMessages,
                    A::ApproximateNumberOfMessagesNotVisible,
                    A::ApproximateNumberOfMessagesDelayed,
                ],
            )
            .await?;
        Ok(attrs.values().filter_map(|v| v.parse::<u64>().ok()).sum())
    }

    /// Receives and deletes every visible message of a queue of the stack; returns their bodies.
    pub async fn take_all(&self, logical: &str) -> Result<Vec<String>> {
        use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
        let (_, url) = self.stack.queue(logical)?;
        let sqs = aws_sdk_sqs::Client::new(&self.sdk);
        let mut bodies = Vec::new();
        loop {
            let messages = receive(&sqs, url).await?;
            if messages.is_empty() {
                return Ok(bodies);
            }
            let entries = messages
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .set_receipt_handle(m.receipt_handle.clone())
                        .build()
                })
                .collect::<Result<Vec<_>, _>>()?;
            sqs.delete_message_batch()
                .queue_url(url)
                .set_entries(Some(entries))
                .send()
                .await?;
            bodies.extend(messages.into_iter().map(|m| m.body.unwrap_or_default()));
        }
    }

    /// Writes an execution item no claim can decode, due long ago in shard `shard` of `shards` (what a
    /// corrupt record looks like to the sweeper), and returns its id.
    pub async fn put_undecodable_due_item(&self, shard: u32, shards: u32) -> Result<uuid::Uuid> {
        use aws_sdk_dynamodb::types::AttributeValue;
        let id = loop {
            let id = uuid::Uuid::new_v4();
            if stepline::adapters::dynamodb::due_shard(id, shards) == shard {
                break id;
            }
        };
        self.clients
            .dynamodb
            .put_item()
            .table_name(self.stack.table("ExecutionTable")?)
            .item("pk", AttributeValue::S(format!("exec#{id}")))
            .item("dueShard", AttributeValue::S(format!("s{shard}")))
            .item("dueAt", AttributeValue::N("1000".into()))
            .item("status", AttributeValue::S("GARBLED".into()))
            .send()
            .await?;
        Ok(id)
    }

    /// The raw item of execution `id`, as the sweeper reads it (decodable or not).
    pub async fn execution_item(&self, id: uuid::Uuid) -> Result<Option<Item>> {
        use aws_sdk_dynamodb::types::AttributeValue;
        Ok(self
            .clients
            .dynamodb
            .get_item()
            .table_name(self.stack.table("ExecutionTable")?)
            .key("pk", AttributeValue::S(format!("exec#{id}")))
            .send()
            .await?
            .item)
    }

    /// Starts the runner for `bindings`.
    pub fn run(&self, bindings: Vec<Binding>, options: RunnerOptions) -> Result<Runner> {
        Runner::start(self.clients.sqs.clone(), &self.stack, bindings, options)
    }
}

/// A StartExecution event as the bus's start rule delivers it to the start queue (`detail`:
/// `{"pipelineId", "tenant", "input", "releaseVersion"?}`).
pub fn start_event(event_id: &str, detail: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "version": "0",
        "id": event_id,
        "detail-type": stepline::handlers::START_DETAIL_TYPE,
        "source": "stepline.local",
        "account": "123456789012",
        "time": "2026-12-02T00:00:00Z",
        "region": "us-east-1",
        "resources": [],
        "detail": detail,
    })
}

/// The wall clock moved ahead by a fixed span (leases and deadlines expire without waiting for them).
pub struct ShiftedClock(pub std::time::Duration);

impl stepline::ports::Clock for ShiftedClock {
    fn now(&self) -> stepline::domain::Timestamp {
        stepline::ports::SystemClock.now() + self.0
    }

    fn token(&self) -> uuid::Uuid {
        stepline::ports::SystemClock.token()
    }

    fn jitter(&self) -> f64 {
        stepline::ports::SystemClock.jitter()
    }
}

/// One long poll (1 s) of a queue, by URL: up to 10 messages with their attributes, left on the queue.
pub async fn receive(sqs: &aws_sdk_sqs::Client, url: &str) -> Result<Vec<Message>> {
    Ok(sqs
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .message_attribute_names("All")
        .wait_time_seconds(1)
        .send()
        .await?
        .messages
        .unwrap_or_default())
}

/// Refuses to run against real AWS by accident: what provisions a stage for a test needs
/// `AWS_ENDPOINT_URL` (infra/test.sh sets it). Tests check first with [`needs_emulator!`], which skips
/// them when it is unset.
pub fn require_emulator() {
    assert!(
        std::env::var_os("AWS_ENDPOINT_URL").is_some(),
        "AWS_ENDPOINT_URL is not set: run the suite through infra/test.sh (it starts the emulator)"
    );
}

/// A fresh stage name (lowercase, as the template's Stage pattern requires).
pub fn fresh_stage(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}
