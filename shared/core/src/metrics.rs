//! Metrics in CloudWatch Embedded Metric Format: one JSON log line per metric, which CloudWatch Logs
//! turns into metrics without any API call (so metrics cost no latency on the hot path). Written only
//! inside Lambda (where `AWS_LAMBDA_FUNCTION_NAME` is set), to stdout.

use std::io::Write;

use serde_json::{json, Value};

use crate::domain::Timestamp;

pub const NAMESPACE: &str = "Stepline";

/// A metric of the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// A step's outcome was applied as a success.
    StepsCompleted,
    /// Milliseconds from a step's launch to its applied outcome.
    StepLatency,
    /// A failed attempt was scheduled for retry.
    Retries,
    /// An execution's dead-letter envelope, or a poison message, went to a DLQ.
    DeadLetters,
    /// Due executions whose claim failed for good were pushed back in the due index (not per
    /// pipeline: the item may not even decode).
    ClaimsDeferred,
    /// Lifecycle events dropped from an outbox that could not be published.
    EventsDropped,
}

impl Metric {
    fn name(self) -> &'static str {
        match self {
            Metric::StepsCompleted => "StepsCompleted",
            Metric::StepLatency => "StepLatency",
            Metric::Retries => "Retries",
            Metric::DeadLetters => "DeadLetters",
            Metric::ClaimsDeferred => "ClaimsDeferred",
            Metric::EventsDropped => "EventsDropped",
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Metric::StepLatency => "Milliseconds",
            _ => "Count",
        }
    }
}

/// The EMF document of one metric value for a pipeline; with no pipeline, the metric has no
/// dimension (what the template's alarms watch).
pub fn document(metric: Metric, value: f64, pipeline: &str, at: Timestamp) -> Value {
    let dimensions = if pipeline.is_empty() {
        json!([[]])
    } else {
        json!([["Pipeline"]])
    };
    let mut doc = json!({
        "_aws": {
            "Timestamp": at,
            "CloudWatchMetrics": [{
                "Namespace": NAMESPACE,
                "Dimensions": dimensions,
                "Metrics": [{"Name": metric.name(), "Unit": metric.unit()}],
            }],
        },
        metric.name(): value,
    });
    if !pipeline.is_empty() {
        doc["Pipeline"] = json!(pipeline);
    }
    doc
}

/// Emits a metric (inside Lambda only).
pub fn emit(metric: Metric, value: f64, pipeline: &str, at: Timestamp) {
    if std::env::var_os("AWS_LAMBDA_FUNCTION_NAME").is_none() {
        return;
    }
    let line = document(metric, value, pipeline, at).to_string();
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_follow_the_embedded_metric_format() {
        let doc = document(
            Metric::StepLatency,
            42.0,
            "orders",
            Timestamp::from_millis(1_700_000_000_000),
        );
        assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_000_i64);
        let directive = &doc["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(directive["Namespace"], "Stepline");
        assert_eq!(directive["Dimensions"], json!([["Pipeline"]]));
        assert_eq!(
            directive["Metrics"][0],
            json!({"Name": "StepLatency", "Unit": "Milliseconds"})
        );
        // Every dimension and metric the directive names is a member of the document.
        assert_eq!(doc["Pipeline"], "orders");
        assert_eq!(doc["StepLatency"], 42.0);
    }

    #[test]
    fn a_metric_without_pipeline_has_no_dimension() {
        let doc = document(Metric::EventsDropped, 3.0, "", Timestamp::from_millis(1));
        assert_eq!(
            doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"],
            json!([[]])
        );
        assert!(doc.get("Pipeline").is_none());
        assert_eq!(doc["EventsDropped"], 3.0);
    }
}
