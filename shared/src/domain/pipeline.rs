//! Pipeline definitions: the ordered steps of a pipeline, where each step's worker listens, and how a
//! failing step is retried. A definition is immutable once registered under its release.

use serde::{Deserialize, Serialize};

/// An ordered list of steps, identified by pipeline id and release version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineDef {
    pub pipeline_id: String,
    pub release_version: String,
    pub steps: Vec<StepDef>,
}

/// What a step is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepKind {
    /// Runs in a worker: a request on its queue, a reply on the coordinator's reply queue.
    #[default]
    Task,
    /// Waits for people or other systems: parks the execution on an await unit whose interactions
    /// are announced on the step's queue and completed through the API or the await-completion queue.
    Await,
    /// Fans out: starts one child execution of `childPipeline` per element of the step input's
    /// `items` array, waits for all of them (each child's end completes one interaction), and resumes
    /// with every child's outcome. A failed child is reported, not fatal to the others.
    FanOut,
}

/// One step: its id, kind, input/output type ids, the SQS request queue its worker reads, its deadline
/// and its retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepDef {
    pub id: String,
    #[serde(default)]
    pub kind: StepKind,
    /// Type id of the step's input (e.g. `orders.Order/1`): part of the contract.
    #[serde(default = "json_type")]
    pub input_type: String,
    #[serde(default = "json_type")]
    pub output_type: String,
    /// Name of the worker's request queue (resolved to a URL through the SQS API, never built by hand).
    pub queue: String,
    /// A launched attempt with no reply after this long is re-sent once, then retried as a new attempt.
    #[serde(default = "default_timeout_secs")]
    pub timeout_secs: u32,
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Await steps: the interactions that must all be completed (default: one, `approval`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interactions: Vec<String>,
    /// Fan-out steps: the pipeline each item runs as a child execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_pipeline: Option<String>,
}

impl StepDef {
    /// Names of an await step's interactions.
    pub fn interaction_names(&self) -> Vec<String> {
        if self.interactions.is_empty() {
            vec!["approval".to_string()]
        } else {
            self.interactions.clone()
        }
    }
}

fn json_type() -> String {
    "json".into()
}

fn default_timeout_secs() -> u32 {
    300
}

/// Exponential backoff with full jitter: the n-th retry waits a uniform random time in
/// `[0, min(max_delay, initial_delay * multiplier^(n-1))]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetryPolicy {
    /// Attempts in total, the first one included (1 means no retry).
    pub max_attempts: u32,
    pub initial_delay_ms: u64,
    pub multiplier: f64,
    pub max_delay_ms: u64,
    /// Error codes never retried, whatever the worker says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub non_retryable: Vec<String>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            initial_delay_ms: 1_000,
            multiplier: 2.0,
            max_delay_ms: 60_000,
            non_retryable: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// Delay before retry number `retry` (1-based), scaled by `jitter` in `[0, 1)` (full jitter).
    pub fn delay_ms(&self, retry: u32, jitter: f64) -> u64 {
        let exp = self
            .multiplier
            .max(1.0)
            .powi(retry.saturating_sub(1) as i32);
        let cap = (self.initial_delay_ms as f64 * exp).min(self.max_delay_ms as f64);
        (cap * jitter.clamp(0.0, 1.0)).round() as u64
    }
}

impl PipelineDef {
    pub fn step(&self, index: u32) -> Option<&StepDef> {
        self.steps.get(index as usize)
    }

    /// Checks what the coordinator relies on: at least one step, unique step ids, sane policies.
    pub fn validate(&self) -> Result<(), String> {
        if self.pipeline_id.is_empty() || self.release_version.is_empty() {
            return Err("pipelineId and releaseVersion must not be empty".into());
        }
        if self.steps.is_empty() {
            return Err("a pipeline needs at least one step".into());
        }
        let mut seen = std::collections::HashSet::new();
        for step in &self.steps {
            if !seen.insert(step.id.as_str()) {
                return Err(format!("duplicate step id {:?}", step.id));
            }
            if step.queue.is_empty() {
                return Err(format!("step {:?} has no queue", step.id));
            }
            if step.retry.max_attempts == 0 {
                return Err(format!(
                    "step {:?}: maxAttempts must be at least 1",
                    step.id
                ));
            }
            if step.timeout_secs == 0 {
                return Err(format!(
                    "step {:?}: timeoutSecs must be at least 1",
                    step.id
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 5,
            initial_delay_ms: 100,
            multiplier: 2.0,
            max_delay_ms: 300,
            non_retryable: Vec::new(),
        };
        assert_eq!(p.delay_ms(1, 1.0), 100);
        assert_eq!(p.delay_ms(2, 1.0), 200);
        assert_eq!(p.delay_ms(3, 1.0), 300);
        assert_eq!(p.delay_ms(9, 1.0), 300);
        assert_eq!(p.delay_ms(2, 0.5), 100);
        assert_eq!(p.delay_ms(2, 0.0), 0);
    }

    #[test]
    fn validation_rejects_duplicate_steps() {
        let step = StepDef {
            id: "a".into(),
            kind: StepKind::Task,
            input_type: "json".into(),
            output_type: "json".into(),
            queue: "q".into(),
            timeout_secs: 1,
            retry: RetryPolicy::default(),
            interactions: Vec::new(),
            child_pipeline: None,
        };
        let def = PipelineDef {
            pipeline_id: "p".into(),
            release_version: "1".into(),
            steps: vec![step.clone(), step],
        };
        assert!(def.validate().unwrap_err().contains("duplicate"));
    }
}
