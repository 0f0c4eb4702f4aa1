//! The {{name}} pipeline's steps.
//!
//! On Lambda (SQS event source) it serves the requests of its event source; run anywhere else it polls
//! `REQUEST_QUEUE_URL`. Environment: `RELEASE_VERSION` (the release it serves), `REQUEST_DLQ_URL`,
//! `PAYLOAD_BUCKET`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline_worker::domain::StepError;
use stepline_worker::envelope::RequestHeader;
use stepline_worker::StepFunction;

/// The pipeline file this worker is built for: its contract is the worker's identity.
const PIPELINE: &str = include_str!("../pipeline.yaml");

struct Steps;

#[async_trait]
impl StepFunction for Steps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_id.as_str() {
            // Refuses what cannot be processed; a non-retryable code ends the execution FAILED.
            "check" => {
                let id = input["id"]
                    .as_str()
                    .filter(|id| !id.is_empty())
                    .ok_or_else(|| StepError::new("INVALID_INPUT", "the input needs an id", false))?;
                Ok(json!({"id": id, "checked": true}))
            }
            // Runs once per launch: redeliveries of the same launch are answered from memory.
            "process" => Ok(json!({"id": input["id"], "checked": input["checked"],
                "processed": true, "attempt": request.attempt})),
            other => Err(StepError::new(
                "UNKNOWN_STEP",
                format!("this worker has no step {other:?}"),
                false,
            )),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), stepline_worker::lambda::Error> {
    let contract = stepline_worker::pipeline_file::contract(PIPELINE)?;
    stepline_worker::lambda::serve_worker(contract, Arc::new(Steps)).await
}
