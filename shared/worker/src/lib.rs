//! The runtime a Stepline worker links: step code served from its SQS request queue (on Lambda, or by
//! polling anywhere else), replies and heartbeats sent to the reply queue each request names, large
//! payloads claim-checked on S3. It carries the wire formats and the ports it uses from
//! `stepline-core`, and no coordinator client: no DynamoDB, no EventBridge.
//!
//! A worker's `main` is one call:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # struct Steps;
//! # #[async_trait::async_trait]
//! # impl stepline_worker::StepFunction for Steps {
//! #     async fn run(&self, _: &stepline_worker::envelope::RequestHeader, input: serde_json::Value)
//! #         -> Result<serde_json::Value, stepline_worker::domain::StepError> { Ok(input) }
//! # }
//! # const PIPELINE: &str = "";
//! # async fn main_() -> Result<(), stepline_worker::lambda::Error> {
//! let contract = stepline_worker::pipeline_file::contract(PIPELINE)?;
//! stepline_worker::lambda::serve_worker(contract, Arc::new(Steps)).await
//! # }
//! ```

pub use stepline_core::{
    cache, claims, config, contract, domain, envelope, pipeline_file, planted, ports, release,
};

pub mod adapters {
    //! The ports a worker needs, on SQS and S3 (and, re-exported, their in-memory forms).
    pub mod s3;
    pub mod sqs;

    pub use s3::S3PayloadStore;
    pub use sqs::{SqsDeadLetterQueue, SqsSender};
    pub use stepline_core::adapters::*;
}
pub mod aws;
pub mod lambda;
pub mod telemetry;
pub mod worker;

pub use worker::{StepFunction, Worker};
