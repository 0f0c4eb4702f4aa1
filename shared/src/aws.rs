//! Wiring of the AWS adapters. Every client is built from the default configuration chain, which reads
//! `AWS_ENDPOINT_URL` and the service-specific `AWS_ENDPOINT_URL_<SERVICE>` (for example
//! `AWS_ENDPOINT_URL_DYNAMODB`): the same code talks to AWS, moto or LocalStack, or to one endpoint for
//! some services and another for the rest.

use std::sync::Arc;

use aws_config::environment::EnvironmentVariableCredentialsProvider;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_sqs::config::SharedCredentialsProvider;
use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};

use crate::adapters::{
    DynamoDbExecutionStore, DynamoDbReleaseRegistry, EventBridgePublisher, S3PayloadStore,
    SecretsManagerKeys, SqsDeadLetterQueue, SqsSender,
};
use crate::claims::ClaimCheck;
use crate::config::{CoordinatorConfig, PayloadConfig, WorkerConfig};
use crate::coordinator::{Coordinator, Settings};
use crate::domain::contract::Contract;
use crate::envelope::Identity;
use crate::handlers::DeadLetterQueues;
use crate::ports::{Clock, SystemClock};
use crate::worker::{SqsVisibilityExtender, StepFunction, Worker};

/// The full default chain (profiles, SSO, web identity, IMDS): for tools run by people.
pub async fn sdk_config() -> SdkConfig {
    aws_config::load_defaults(BehaviorVersion::latest()).await
}

/// The configuration of code running in Lambda, which sets the function's credentials and region in
/// the environment: nothing else is looked up (no profile files, SSO, STS or instance metadata), so
/// init is faster and the binary does not carry those clients. `AWS_ENDPOINT_URL` and
/// `AWS_ENDPOINT_URL_<SERVICE>` are honoured as by the default chain.
pub fn lambda_sdk_config() -> SdkConfig {
    let mut builder = SdkConfig::builder()
        .service_config(ServiceEndpointsFromEnv)
        .behavior_version(BehaviorVersion::latest())
        .region(
            env("AWS_REGION")
                .or_else(|| env("AWS_DEFAULT_REGION"))
                .map(Region::new),
        )
        .credentials_provider(SharedCredentialsProvider::new(
            EnvironmentVariableCredentialsProvider::new(),
        ));
    if let Some(endpoint) = env("AWS_ENDPOINT_URL") {
        builder = builder.endpoint_url(endpoint);
    }
    builder.build()
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Service-specific settings from the environment, read as the default chain reads them: the
/// variable named after the service (`AWS_ENDPOINT_URL_DYNAMODB` for service id "DynamoDB"), else the
/// global one.
#[derive(Debug)]
struct ServiceEndpointsFromEnv;

impl LoadServiceConfig for ServiceEndpointsFromEnv {
    fn load_config(&self, key: ServiceConfigKey<'_>) -> Option<String> {
        let service = key.service_id().to_uppercase().replace(' ', "_");
        env(&format!("{}_{service}", key.env())).or_else(|| env(key.env()))
    }
}

/// Whether a configuration sends a service's requests to an endpoint of its own (an emulator, a VPC
/// endpoint) rather than the service's public one.
fn custom_endpoint(sdk: &SdkConfig, service_id: &str) -> bool {
    let service_specific = ServiceConfigKey::builder()
        .service_id(service_id)
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()
        .and_then(|key| sdk.service_config()?.load_config(key));
    sdk.endpoint_url().is_some() || service_specific.is_some()
}

/// The service clients the adapters use. Built from one `SdkConfig`, or by hand (a benchmark adds an
/// interceptor that counts every request).
#[derive(Clone, Debug)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub eventbridge: aws_sdk_eventbridge::Client,
    pub s3: aws_sdk_s3::Client,
    pub secrets: aws_sdk_secretsmanager::Client,
}

impl Clients {
    pub fn new(sdk: &SdkConfig) -> Self {
        Self {
            dynamodb: aws_sdk_dynamodb::Client::new(sdk),
            sqs: aws_sdk_sqs::Client::new(sdk),
            eventbridge: aws_sdk_eventbridge::Client::new(sdk),
            s3: s3_client(sdk),
            secrets: aws_sdk_secretsmanager::Client::new(sdk),
        }
    }

    /// The claim check of a stack's payload configuration (none without a payload bucket).
    pub fn claims(&self, payloads: &PayloadConfig) -> Option<ClaimCheck> {
        let bucket = payloads.bucket.as_ref()?;
        Some(ClaimCheck::new(
            Arc::new(S3PayloadStore::new(self.s3.clone())),
            bucket.clone(),
            payloads.threshold_bytes,
        ))
    }
}

/// The S3 client of a configuration. With an endpoint URL set (a local emulator, a VPC endpoint),
/// buckets are addressed in the path: `bucket.host` names need DNS that such endpoints lack.
pub fn s3_client(sdk: &SdkConfig) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(sdk)
        .force_path_style(custom_endpoint(sdk, "S3"))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The coordinator on DynamoDB and SQS.
pub fn coordinator(sdk: &SdkConfig, config: &CoordinatorConfig) -> Coordinator {
    coordinator_with_clock(sdk, config, Arc::new(SystemClock))
}

/// The coordinator on DynamoDB and SQS with a given clock (tests move time forward with it).
pub fn coordinator_with_clock(
    sdk: &SdkConfig,
    config: &CoordinatorConfig,
    clock: Arc<dyn Clock>,
) -> Coordinator {
    coordinator_on(&Clients::new(sdk), config, clock)
}

/// The coordinator on the given clients.
pub fn coordinator_on(
    clients: &Clients,
    config: &CoordinatorConfig,
    clock: Arc<dyn Clock>,
) -> Coordinator {
    let dynamodb = clients.dynamodb.clone();
    // The fan-out ledger lives in the execution table.
    let store = Arc::new(
        DynamoDbExecutionStore::new(dynamodb.clone(), &config.execution_table, config.due_shards)
            .with_due_granularity(i64::from(config.due_granularity_seconds) * 1000),
    );
    let mut coordinator = Coordinator::new(
        store.clone(),
        Arc::new(DynamoDbReleaseRegistry::new(
            dynamodb,
            &config.release_table,
        )),
        Arc::new(SqsSender::new(clients.sqs.clone())),
        clock,
        Settings::from_config(config),
    )
    .with_ledger(store);
    if let Some(claims) = clients.claims(&config.payloads) {
        coordinator = coordinator.with_claim_check(claims);
    }
    if let Some(secret) = &config.seal_key_secret {
        coordinator = coordinator.with_keys(Arc::new(SecretsManagerKeys::new(
            clients.secrets.clone(),
            secret,
        )));
    }
    match &config.event_bus {
        Some(bus) => coordinator.with_publisher(Arc::new(EventBridgePublisher::new(
            clients.eventbridge.clone(),
            bus,
        ))),
        None => coordinator,
    }
}

/// A worker of `contract` (the code it was built from) for the configured release, replying through
/// SQS, extending its messages' visibility during long steps, and dead-lettering requests it cannot
/// handle (when `REQUEST_DLQ_URL` is set).
pub fn worker(
    sdk: &SdkConfig,
    config: &WorkerConfig,
    contract: &Contract,
    steps: Arc<dyn StepFunction>,
) -> Worker {
    worker_on(&Clients::new(sdk), config, contract, steps)
}

/// A worker on the given clients (SQS, and S3 for claim-checked payloads).
pub fn worker_on(
    clients: &Clients,
    config: &WorkerConfig,
    contract: &Contract,
    steps: Arc<dyn StepFunction>,
) -> Worker {
    let identity = Identity::of(contract, &config.release_version);
    let sqs = clients.sqs.clone();
    let mut worker = Worker::new(identity, Arc::new(SqsSender::new(sqs.clone())), steps)
        .with_visibility(Arc::new(SqsVisibilityExtender::new(sqs)))
        .with_announcements(config.reply_queue_url.clone());
    if let Some(claims) = clients.claims(&config.payloads) {
        worker = worker.with_claim_check(claims);
    }
    match &config.request_dlq_url {
        Some(dlq) => worker.with_dead_letter_queue(dlq.clone()),
        None => worker,
    }
}

/// The coordinator's dead-letter queues on SQS, as the operator function reads them.
pub struct SqsDeadLetterQueues {
    execution: SqsDeadLetterQueue,
    launch: SqsDeadLetterQueue,
    reply: SqsDeadLetterQueue,
    start: Option<SqsDeadLetterQueue>,
}

impl SqsDeadLetterQueues {
    pub fn new(sqs: &aws_sdk_sqs::Client, config: &CoordinatorConfig) -> Self {
        let queue = |url: &str| SqsDeadLetterQueue::new(sqs.clone(), url);
        Self {
            execution: queue(&config.execution_dlq_url),
            launch: queue(&config.launch_dlq_url),
            reply: queue(&config.reply_dlq_url),
            start: config.start_dlq_url.as_deref().map(queue),
        }
    }

    pub fn refs(&self) -> DeadLetterQueues<'_> {
        DeadLetterQueues {
            execution: &self.execution,
            launch: &self.launch,
            reply: &self.reply,
            start: self.start.as_ref().map(|q| q as _),
        }
    }
}
