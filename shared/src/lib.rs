//! Stepline: a durable pipeline coordinator built from single-shot AWS Lambda handlers. This crate is
//! the coordinator on AWS; the layers below it are crates of their own, re-exported here under the
//! module names they have always had:
//! - [`domain`] (`stepline-domain`): pipeline definitions, contracts, releases, the execution record,
//!   the pure state machine, the catalogue of stable codes and [`planted`], the switches of the
//!   deliberate defects the fault campaign must catch (only the `testing` build can turn one on). No I/O.
//! - [`ports`], [`envelope`], [`claims`], [`coordinator`] (`stepline-core`): the narrow interfaces, the
//!   wire formats, claim checks, and load · decide · commit · carry out, the one path of every decision.
//!   No AWS.
//! - [`worker`] (`stepline-worker`): the worker runtime for step code, on SQS and S3.
//!
//! Here: [`adapters`] (DynamoDB, EventBridge, Secrets Manager; SQS, S3 and in-memory re-exported),
//! [`aws`] (the coordinator built on them), [`handlers`] (SQS, EventBridge and operator events) and
//! `http` (the HTTP API, feature `http`): inbound adapters that decode, call the coordinator and
//! encode; [`lambda`]: the Lambda runtime wiring the function binaries share.

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

pub use aws_lambda_events;
pub use domain::{contract, pipeline_file, release, Code};
pub use stepline_core::coordinator::{
    Applied, ClaimReport, Coordinator, CoordinatorError, ExecutionSummary, HistoryView,
    ListRequest, ListResponse, Settings, SubmitRequest, Submitted,
};
