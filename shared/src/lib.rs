//! Stepline: a durable pipeline coordinator built from single-shot AWS Lambda handlers.
//!
//! - [`domain`]: pipeline definitions, the execution record and the pure state machine.
//! - [`ports`]: the narrow interfaces the handlers use; [`adapters`]: DynamoDB, SQS and in-memory.
//! - [`coordinator`]: load, decide, commit conditionally, act; [`handlers`]: the Lambda entry points.
//! - [`envelope`]: request/reply/launch-work wire formats; [`worker`]: the worker runtime.

pub mod adapters;
pub mod aws;
pub mod cache;
pub mod config;
pub mod contract;
pub mod coordinator;
pub mod domain;
pub mod envelope;
pub mod handlers;
pub mod metrics;
pub mod ports;
pub mod release;
pub mod telemetry;
pub mod worker;

pub use aws_lambda_events;
pub use coordinator::{
    Applied, ClaimReport, Coordinator, CoordinatorError, Settings, SubmitRequest, Submitted,
};
pub mod dlq;
pub mod sim;
