//! The Lambda runtime wiring every function binary shares: telemetry, configuration from the
//! environment, the AWS clients built once per container, and the event loop. A function's `main` names
//! its handler and nothing else.

use std::future::Future;
use std::sync::Arc;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{service_fn, Diagnostic, LambdaEvent};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
pub use stepline_worker::lambda::{run_worker, serve_worker, Error};

use crate::aws;
use crate::config::CoordinatorConfig;
use crate::coordinator::{Coordinator, CoordinatorError};
use crate::domain::Timestamp;
use crate::handlers::DeadLetterQueues;

/// Everything a coordinator function needs, built once per container.
pub struct Function {
    pub coordinator: Coordinator,
    /// The coordinator's dead-letter queues (read by the operator function).
    pub dead_letters: DeadLetterQueues,
}

fn function() -> Result<Arc<Function>, Error> {
    stepline_worker::telemetry::init();
    let sdk = aws::lambda_sdk_config();
    let config = CoordinatorConfig::from_env()?;
    Ok(Arc::new(Function {
        coordinator: aws::coordinator(&sdk, &config),
        dead_letters: aws::dead_letter_queues(&aws_sdk_sqs::Client::new(&sdk), &config.queues),
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
/// to stop in time.
pub async fn serve_schedule<H, F, R>(handler: H) -> Result<(), Error>
where
    H: Fn(Arc<Function>, EventBridgeEvent<Value>, Option<Timestamp>) -> F,
    F: Future<Output = Result<R, CoordinatorError>>,
    R: Serialize,
{
    let function = function()?;
    lambda_runtime::run(service_fn(|event: LambdaEvent<EventBridgeEvent<Value>>| {
        let deadline = i64::try_from(event.context.deadline)
            .ok()
            .map(Timestamp::from_millis);
        let output = handler(function.clone(), event.payload, deadline);
        async move { output.await.map_err(diagnostic) }
    }))
    .await
}

/// Serves a directly invoked coordinator function (the operator's).
pub async fn serve_invoke<A, H, F, R>(handler: H) -> Result<(), Error>
where
    A: DeserializeOwned,
    H: Fn(Arc<Function>, A) -> F,
    F: Future<Output = Result<R, CoordinatorError>>,
    R: Serialize,
{
    serve(handler, |result| result.map_err(diagnostic)).await
}

/// A coordinator error as the Lambda runtime reports it: its stable code as the error type.
fn diagnostic(err: CoordinatorError) -> Diagnostic {
    Diagnostic {
        error_type: err.code().to_string(),
        error_message: err.to_string(),
    }
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

/// Serves the HTTP API function (a function URL or an HTTP API, payload format 2.0).
#[cfg(feature = "http")]
pub async fn serve_http() -> Result<(), Error> {
    use lambda_http::Request;
    let function = function()?;
    // What this endpoint serves (template.yaml gives each audience a function URL of its own).
    let served =
        crate::http::Audiences::configured(std::env::var("API_AUDIENCES").ok().as_deref())?;
    lambda_http::run(lambda_http::service_fn(|request: Request| {
        let function = function.clone();
        async move {
            Ok::<_, Error>(crate::http::handle_for(&function.coordinator, served, request).await)
        }
    }))
    .await
}
