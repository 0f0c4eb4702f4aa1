//! Stepline: a durable pipeline coordinator built from single-shot AWS Lambda handlers.
//!
//! Layers, each importing only from those below it:
//! - [`planted`]: the switches of the deliberate defects the fault campaign must catch (`sim`, feature
//!   `testing`); every other build compiles them off.
//! - [`domain`]: pipeline definitions, contracts, releases, the execution record, the pure state
//!   machine and the catalogue of stable codes. No I/O.
//! - [`ports`]: the narrow interfaces the coordinator uses; [`adapters`]: DynamoDB, SQS, EventBridge
//!   and in-memory implementations of them. [`envelope`]: the wire formats.
//! - [`coordinator`]: load, decide, commit conditionally, carry out the actions: the one path of
//!   every decision.
//! - [`handlers`] (SQS, EventBridge and operator events) and `http` (the HTTP API, feature `http`):
//!   inbound adapters that decode, call the coordinator and encode; [`lambda`]: the Lambda runtime
//!   wiring the function binaries share. [`worker`]: the worker runtime for step code.

pub use stepline_core::{
    cache, claims, config, coordinator, domain, envelope, metrics, planted, ports,
};
pub use stepline_worker::{telemetry, worker};

pub mod adapters;
pub mod aws;
pub mod handlers;
#[cfg(feature = "http")]
pub mod http;
pub mod lambda;
#[cfg(feature = "testing")]
pub mod sim;

pub use aws_lambda_events;
pub use domain::{contract, pipeline_file, release, Code};
pub use stepline_core::coordinator::{
    Applied, ClaimReport, Coordinator, CoordinatorError, ExecutionSummary, HistoryView,
    ListRequest, ListResponse, Settings, SubmitRequest, Submitted,
};
