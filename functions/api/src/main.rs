//! API function (Lambda function URL, IAM auth; payload format 2.0): the HTTP API of `api::handle`
//! (executions, interactions, releases). Only wiring: the routes live in the library.

use std::sync::Arc;

use lambda_http::{service_fn, Error, Request};
use stepline::config::CoordinatorConfig;

#[tokio::main]
async fn main() -> Result<(), Error> {
    stepline::telemetry::init();
    let coordinator = Arc::new(stepline::aws::coordinator(
        &stepline::aws::lambda_sdk_config(),
        &CoordinatorConfig::from_env()?,
    ));
    lambda_http::run(service_fn(|request: Request| {
        let coordinator = coordinator.clone();
        async move { Ok::<_, Error>(api::handle(&coordinator, request).await) }
    }))
    .await
}
