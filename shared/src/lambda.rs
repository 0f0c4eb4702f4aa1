//! The Lambda runtime wiring every function binary shares: telemetry, configuration from the
//! environment, the AWS clients built once per container, and the event loop. A function's `main` names
//! its handler and nothing else.

use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
pub use lambda_runtime::Error;
use lambda_runtime::{service_fn, Diagnostic, LambdaEvent};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::aws::{self, SqsDeadLetterQueues};
use crate::config::{CoordinatorConfig, WorkerConfig};
use crate::coordinator::Coordinator;
use crate::domain::contract::Contract;
use crate::worker::StepFunction;

/// Everything a coordinator function needs, built once per container.
pub struct Function {
    pub coordinator: Coordinator,
    /// The coordinator's dead-letter queues (read by the operator function).
    pub dead_letters: SqsDeadLetterQueues,
}

fn function() -> Result<Arc<Function>, Error> {
    crate::telemetry::init();
    let sdk = aws::lambda_sdk_config();
    let config = CoordinatorConfig::from_env()?;
    Ok(Arc::new(Function {
        coordinator: aws::coordinator(&sdk, &config),
        dead_letters: SqsDeadLetterQueues::new(&aws_sdk_sqs::Client::new(&sdk), &config),
    }))
}

/// Serves an SQS-triggered coordinator function (partial batch responses).
pub async fn serve_sqs<H, F>(handler: H) -> Result<(), Error>
where
    H: Fn(Arc<Function>, SqsEvent) -> F,
    F: Future<Output = SqsBatchResponse>,
{
    serve(handler, Ok::<_, Error>).await
}

/// Serves the claim function (an EventBridge schedule); the handler gets the invocation's deadline
/// (epoch milliseconds) to stop in time.
pub async fn serve_schedule<H, F, R, E>(handler: H) -> Result<(), Error>
where
    H: Fn(Arc<Function>, EventBridgeEvent<Value>, Option<i64>) -> F,
    F: Future<Output = Result<R, E>>,
    R: Serialize,
    E: Into<Diagnostic> + std::fmt::Debug,
{
    let function = function()?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<EventBridgeEvent<Value>>| {
        let deadline = i64::try_from(event.context.deadline).ok();
        handler(function.clone(), event.payload, deadline)
    }))
    .await
}

/// Serves a directly invoked coordinator function (the operator's).
pub async fn serve_invoke<A, H, F, R, E>(handler: H) -> Result<(), Error>
where
    A: DeserializeOwned,
    H: Fn(Arc<Function>, A) -> F,
    F: Future<Output = Result<R, E>>,
    R: Serialize,
    E: Into<Diagnostic> + std::fmt::Debug,
{
    serve(handler, |result| result).await
}

async fn serve<A, H, F, O, R, E>(handler: H, into: fn(O) -> Result<R, E>) -> Result<(), Error>
where
    A: DeserializeOwned,
    H: Fn(Arc<Function>, A) -> F,
    F: Future<Output = O>,
    R: Serialize,
    E: Into<Diagnostic> + std::fmt::Debug,
{
    let function = function()?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<A>| {
        let output = handler(function.clone(), event.payload);
        async move { into(output.await) }
    }))
    .await
}

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

/// Serves the HTTP API function (a function URL or an HTTP API, payload format 2.0).
#[cfg(feature = "http")]
pub async fn serve_http() -> Result<(), Error> {
    use lambda_http::Request;
    let function = function()?;
    // What this endpoint serves (template.yaml gives each audience a function URL of its own).
    let served = match std::env::var("API_AUDIENCES") {
        Ok(text) => crate::http::Audiences::parse(&text)?,
        Err(_) => crate::http::Audiences::ALL,
    };
    lambda_http::run(lambda_http::service_fn(|request: Request| {
        let function = function.clone();
        async move {
            Ok::<_, Error>(crate::http::handle_for(&function.coordinator, served, request).await)
        }
    }))
    .await
}
