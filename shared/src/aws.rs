//! Wiring of the AWS adapters. Every client is built from the default configuration chain, which reads
//! `AWS_ENDPOINT_URL` and the service-specific `AWS_ENDPOINT_URL_<SERVICE>` (for example
//! `AWS_ENDPOINT_URL_DYNAMODB`): the same code talks to AWS, moto or LocalStack, or to one endpoint for
//! some services and another for the rest. The configuration and the worker's clients come from the
//! worker crate (`stepline_worker::aws`), which links SQS and S3 only.

use std::sync::Arc;

use crate::adapters::{
    DynamoDbExecutionStore, DynamoDbReleaseRegistry, EventBridgePublisher, SecretsManagerKeys,
    SqsDeadLetterQueue, SqsSender,
};
use crate::claims::ClaimCheck;
use crate::config::{CoordinatorConfig, PayloadConfig, Queues, WorkerConfig};
use crate::coordinator::{Coordinator, Settings};
use crate::domain::contract::Contract;
use crate::handlers::DeadLetterQueues;
use crate::ports::{Clock, SystemClock};
use crate::worker::{StepFunction, Worker};
use aws_config::SdkConfig;
pub use stepline_worker::aws::{custom_endpoint, lambda_sdk_config, s3_client, sdk_config};

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
        stepline_worker::aws::claim_check(&self.s3, payloads)
    }
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
            .with_due_granularity(std::time::Duration::from_secs(u64::from(
                config.due_granularity_seconds,
            ))),
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
pub use stepline_worker::aws::worker;

/// A worker on the given clients (SQS, and S3 for claim-checked payloads).
pub fn worker_on(
    clients: &Clients,
    config: &WorkerConfig,
    contract: &Contract,
    steps: Arc<dyn StepFunction>,
) -> Worker {
    stepline_worker::aws::worker_on(&clients.sqs, &clients.s3, config, contract, steps)
}

/// The coordinator's dead-letter queues on SQS, as the operator function reads them.
pub fn dead_letter_queues(sqs: &aws_sdk_sqs::Client, queues: &Queues) -> DeadLetterQueues {
    DeadLetterQueues::of(queues, |url| SqsDeadLetterQueue::new(sqs.clone(), url))
}
