//! Wiring of the AWS adapters. Every client is built from the default configuration chain, which reads
//! `AWS_ENDPOINT_URL`: the same code talks to AWS, moto or LocalStack.

use std::sync::Arc;

use aws_config::{BehaviorVersion, SdkConfig};

use crate::adapters::{
    DynamoDbExecutionStore, DynamoDbReleaseRegistry, EventBridgePublisher, SqsSender,
};
use crate::config::{CoordinatorConfig, WorkerConfig};
use crate::contract::Contract;
use crate::coordinator::{Coordinator, Settings};
use crate::envelope::Identity;
use crate::ports::{Clock, SystemClock};
use crate::worker::{SqsVisibilityExtender, StepFunction, Worker};

pub async fn sdk_config() -> SdkConfig {
    aws_config::load_defaults(BehaviorVersion::latest()).await
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
    let dynamodb = aws_sdk_dynamodb::Client::new(sdk);
    let coordinator = Coordinator::new(
        Arc::new(DynamoDbExecutionStore::new(
            dynamodb.clone(),
            &config.execution_table,
            config.due_shards,
        )),
        Arc::new(DynamoDbReleaseRegistry::new(
            dynamodb,
            &config.release_table,
        )),
        Arc::new(SqsSender::new(aws_sdk_sqs::Client::new(sdk))),
        clock,
        Settings::from_config(config),
    );
    match &config.event_bus {
        Some(bus) => coordinator.with_publisher(Arc::new(EventBridgePublisher::new(
            aws_sdk_eventbridge::Client::new(sdk),
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
    let sqs = aws_sdk_sqs::Client::new(sdk);
    let worker = Worker::new(
        Identity {
            pipeline_id: contract.pipeline_id.clone(),
            contract_version: contract.contract_version.clone(),
            release_version: config.release_version.clone(),
        },
        Arc::new(SqsSender::new(sqs.clone())),
        steps,
    )
    .with_visibility(Arc::new(SqsVisibilityExtender::new(sqs)));
    match &config.request_dlq_url {
        Some(dlq) => worker.with_dead_letter_queue(dlq.clone()),
        None => worker,
    }
}

/// Runs a worker function under the Lambda runtime: release and DLQ from the environment, identity
/// from `contract` (the code it was built from).
pub async fn run_worker(
    contract: Contract,
    steps: Arc<dyn StepFunction>,
) -> Result<(), lambda_runtime::Error> {
    crate::telemetry::init();
    let worker = Arc::new(self::worker(
        &sdk_config().await,
        &WorkerConfig::from_env()?,
        &contract,
        steps,
    ));
    lambda_runtime::run(lambda_runtime::service_fn(
        |event: lambda_runtime::LambdaEvent<aws_lambda_events::event::sqs::SqsEvent>| {
            let worker = worker.clone();
            async move { Ok::<_, lambda_runtime::Error>(worker.handle(event.payload).await) }
        },
    ))
    .await
}
