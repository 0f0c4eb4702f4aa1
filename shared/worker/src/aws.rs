//! Wiring of the AWS adapters. Every client is built from the default configuration chain, which reads
//! `AWS_ENDPOINT_URL` and the service-specific `AWS_ENDPOINT_URL_<SERVICE>` (for example
//! `AWS_ENDPOINT_URL_DYNAMODB`): the same code talks to AWS, moto or LocalStack, or to one endpoint for
//! some services and another for the rest.

use std::sync::Arc;

use aws_config::environment::EnvironmentVariableCredentialsProvider;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_sqs::config::SharedCredentialsProvider;
use aws_types::service_config::{LoadServiceConfig, ServiceConfigKey};

use crate::adapters::{S3PayloadStore, SqsSender};
use crate::claims::ClaimCheck;
use crate::config::{PayloadConfig, WorkerConfig};
use crate::domain::contract::Contract;
use crate::envelope::Identity;
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
pub fn custom_endpoint(sdk: &SdkConfig, service_id: &str) -> bool {
    let service_specific = ServiceConfigKey::builder()
        .service_id(service_id)
        .env("AWS_ENDPOINT_URL")
        .profile("endpoint_url")
        .build()
        .ok()
        .and_then(|key| sdk.service_config()?.load_config(key));
    sdk.endpoint_url().is_some() || service_specific.is_some()
}

/// The S3 client of a configuration. With an endpoint URL set (a local emulator, a VPC endpoint),
/// buckets are addressed in the path: `bucket.host` names need DNS that such endpoints lack.
pub fn s3_client(sdk: &SdkConfig) -> aws_sdk_s3::Client {
    let config = aws_sdk_s3::config::Builder::from(sdk)
        .force_path_style(custom_endpoint(sdk, "S3"))
        .build();
    aws_sdk_s3::Client::from_conf(config)
}

/// The claim check of a stack's payload configuration (none without a payload bucket).
pub fn claim_check(s3: &aws_sdk_s3::Client, payloads: &PayloadConfig) -> Option<ClaimCheck> {
    let bucket = payloads.bucket.as_ref()?;
    Some(ClaimCheck::new(
        Arc::new(S3PayloadStore::new(s3.clone())),
        bucket.clone(),
        payloads.threshold_bytes,
    ))
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
    worker_on(
        &aws_sdk_sqs::Client::new(sdk),
        &s3_client(sdk),
        config,
        contract,
        steps,
    )
}

/// A worker on the given clients (SQS, and S3 for claim-checked payloads).
pub fn worker_on(
    sqs: &aws_sdk_sqs::Client,
    s3: &aws_sdk_s3::Client,
    config: &WorkerConfig,
    contract: &Contract,
    steps: Arc<dyn StepFunction>,
) -> Worker {
    let identity = Identity::of(contract, &config.release_version);
    let sqs = sqs.clone();
    let mut worker = Worker::new(identity, Arc::new(SqsSender::new(sqs.clone())), steps)
        .with_visibility(Arc::new(SqsVisibilityExtender::new(sqs)))
        .with_announcements(config.reply_queue_url.clone());
    if let Some(claims) = claim_check(s3, &config.payloads) {
        worker = worker.with_claim_check(claims);
    }
    match &config.request_dlq_url {
        Some(dlq) => worker.with_dead_letter_queue(dlq.clone()),
        None => worker,
    }
}
