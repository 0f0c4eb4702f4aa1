//! Serving a worker: on Lambda from its SQS event source, anywhere else by polling its request queue.

use std::sync::Arc;

use aws_lambda_events::event::sqs::SqsEvent;
pub use lambda_runtime::Error;
use lambda_runtime::{service_fn, LambdaEvent};

use crate::aws;
use crate::config::WorkerConfig;
use crate::domain::contract::Contract;
use crate::worker::StepFunction;

/// Runs a worker function: release and DLQ from the environment, identity from `contract` (the code
/// it was built from).
pub async fn run_worker(contract: Contract, steps: Arc<dyn StepFunction>) -> Result<(), Error> {
    crate::telemetry::init();
    let worker = Arc::new(aws::worker(
        &aws::lambda_sdk_config(),
        &WorkerConfig::from_env()?,
        &contract,
        steps,
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let worker = worker.clone();
        async move { Ok::<_, Error>(worker.handle(event.payload).await) }
    }))
    .await
}

/// Serves a worker where it runs: on Lambda, the requests of its SQS event source; anywhere else (a
/// container, a laptop against an emulator) it polls `REQUEST_QUEUE_URL` as an event source mapping
/// would, until interrupted.
pub async fn serve_worker(contract: Contract, steps: Arc<dyn StepFunction>) -> Result<(), Error> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        return run_worker(contract, steps).await;
    }
    crate::telemetry::init();
    let queue_url = std::env::var("REQUEST_QUEUE_URL")
        .map_err(|_| "REQUEST_QUEUE_URL: the request queue to poll (not running on Lambda)")?;
    let sdk = aws::sdk_config().await;
    let queue_name = queue_url.rsplit('/').next().unwrap_or_default().to_string();
    let worker = Arc::new(
        aws::worker(&sdk, &WorkerConfig::from_env()?, &contract, steps).reading(&queue_name),
    );
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let queue_arn = sqs
        .get_queue_attributes()
        .queue_url(&queue_url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes
        .and_then(|mut a| a.remove(&aws_sdk_sqs::types::QueueAttributeName::QueueArn))
        .unwrap_or_default();
    let source = crate::adapters::sqs::EventSource {
        name: queue_url.clone(),
        queue_url,
        queue_arn,
        batch_size: 10,
        wait_secs: 20,
    };
    tracing::info!(identity = %worker.identity(), queue = %source.queue_url, "worker polling");
    let poll = crate::adapters::sqs::poll_event_source(&sqs, &source, |event| {
        let worker = worker.clone();
        async move { worker.handle(event).await }
    });
    // Announced at start (when it knows the reply queue) and now and then while idle.
    let announcing = async {
        loop {
            worker.announce_if_due().await;
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        }
    };
    let poll = async {
        tokio::select! {
            () = poll => {}
            () = announcing => {}
        }
    };
    let stopped = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        std::io::Result::Ok(())
    };
    tokio::select! {
        () = poll => Ok(()),
        stopped = stopped => {
            stopped?;
            // Told to stop: no more requests are taken; the coordinator hears it drains.
            worker.drain().await;
            Ok(())
        }
    }
}
