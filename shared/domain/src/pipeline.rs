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
    /// `items` array, counts each child's end outside the execution's record, and resumes once every
    /// child is counted, with every child's outcome in item order. Children that fail beyond the
    /// step's tolerance fail the step (the children still running are cancelled).
    FanOut,
}

/// One step: its id, kind, input/output type ids, the SQS request queue its worker reads, its deadline
/// and its retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    /// Fan-out steps have none.
    #[serde(default)]
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
    /// Fan-out steps: how many children may fail (FAILED, CANCELLED, ...) without failing the step.
    /// With a percentage too, the stricter of the two holds; with neither, none may fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerated_failures: Option<u32>,
    /// Fan-out steps: the share of the children (0 to 100) that may fail without failing the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerated_failure_percent: Option<f64>,
    /// Fan-out steps: at most this many children run at once (the first ones start together, then
    /// each child's end starts the next); none: all start at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
}

impl StepDef {
    /// A task step whose worker reads `queue`, with what a definition file leaves out: `json` input
    /// and output types, a 300 s timeout and the default retry policy.
    pub fn task(id: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: StepKind::Task,
            input_type: json_type(),
            output_type: json_type(),
            queue: queue.into(),
            timeout_secs: default_timeout_secs(),
            retry: RetryPolicy::default(),
            interactions: Vec::new(),
            child_pipeline: None,
            tolerated_failures: None,
            tolerated_failure_percent: None,
            max_concurrency: None,
        }
    }

    /// An await step announced on `queue` (interactions: `approval` unless named).
    pub fn await_step(id: impl Into<String>, queue: impl Into<String>) -> Self {
        Self {
            kind: StepKind::Await,
            ..Self::task(id, queue)
        }
    }

    /// A fan-out step running each item as a child execution of `child_pipeline`. Its children are
    /// started through the start queue: it has no request queue of its own unless given one.
    pub fn fan_out(id: impl Into<String>, child_pipeline: impl Into<String>) -> Self {
        Self {
            kind: StepKind::FanOut,
            child_pipeline: Some(child_pipeline.into()),
            ..Self::task(id, "")
        }
    }

    /// The same step under another id.
    pub fn renamed(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// The type ids of the step's input and output.
    pub fn types(mut self, input: impl Into<String>, output: impl Into<String>) -> Self {
        self.input_type = input.into();
        self.output_type = output.into();
        self
    }

    pub fn timeout_secs(mut self, secs: u32) -> Self {
        self.timeout_secs = secs;
        self
    }

    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Adds error codes never retried, whatever the worker says.
    pub fn non_retryable<S: Into<String>>(mut self, codes: impl IntoIterator<Item = S>) -> Self {
        self.retry
            .non_retryable
            .extend(codes.into_iter().map(Into::into));
        self
    }

    /// The interactions an await step waits for.
    pub fn interactions<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.interactions = names.into_iter().map(Into::into).collect();
        self
    }

    /// A fan-out step's tolerance: at most `count` children, and at most `percent` of them, may fail.
    pub fn tolerating(mut self, count: Option<u32>, percent: Option<f64>) -> Self {
        self.tolerated_failures = count;
        self.tolerated_failure_percent = percent;
        self
    }

    /// A fan-out step's children run at most `children` at once.
    pub fn max_concurrency(mut self, children: u32) -> Self {
        self.max_concurrency = Some(children);
        self
    }

    /// How many of a fan-out's `items` children may fail without failing the step.
    pub fn tolerated(&self, items: u32) -> u32 {
        let by_percent = self
            .tolerated_failure_percent
            .map(|p| ((p.clamp(0.0, 100.0) / 100.0) * f64::from(items)).floor() as u32);
        match (self.tolerated_failures, by_percent) {
            (Some(count), Some(share)) => count.min(share),
            (Some(limit), None) | (None, Some(limit)) => limit,
            (None, None) => 0,
        }
    }

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
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
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
    /// `max_attempts` in all, waiting up to `initial_delay_ms` before the first retry and doubling
    /// up to `max_delay_ms`.
    pub fn doubling(max_attempts: u32, initial_delay_ms: u64, max_delay_ms: u64) -> Self {
        Self {
            max_attempts,
            initial_delay_ms,
            multiplier: 2.0,
            max_delay_ms,
            non_retryable: Vec::new(),
        }
    }

    /// Delay before retry number `retry` (1-based), scaled by `jitter` in `[0, 1)` (full jitter).
    pub fn delay_ms(&self, retry: u32, jitter: f64) -> u64 {
        let exp = self
            .multiplier
            .max(1.0)
            .powi(retry.saturating_sub(1) as i32);
        let cap = (self.initial_delay_ms as f64 * exp).min(self.max_delay_ms as f64);
        (cap * jitter.clamp(0.0, 1.0)).round() as u64
    }

    /// What the policy asks for that it will not get. A retry waits on SQS `DelaySeconds`, which
    /// counts whole seconds: each delay is rounded up to the next second (a drawn 300 ms waits 1 s; a
    /// drawn 0 waits none), so delays under a second are not honoured as written.
    pub fn warnings(&self) -> Vec<String> {
        let sub_second = |ms: u64| (1..1000).contains(&ms);
        let mut out = Vec::new();
        for (name, ms) in [
            ("initialDelayMs", self.initial_delay_ms),
            ("maxDelayMs", self.max_delay_ms),
        ] {
            if sub_second(ms) && self.max_attempts > 1 {
                out.push(format!(
                    "{name} {ms} is under a second: retry delays ride on SQS DelaySeconds, whole \
                     seconds, so each drawn delay is rounded up to the next second (up to 1 s here)"
                ));
            }
        }
        out
    }
}

impl PipelineDef {
    pub fn new(
        pipeline_id: impl Into<String>,
        release_version: impl Into<String>,
        steps: impl IntoIterator<Item = StepDef>,
    ) -> Self {
        Self {
            pipeline_id: pipeline_id.into(),
            release_version: release_version.into(),
            steps: steps.into_iter().collect(),
        }
    }

    /// What the definition asks for that it will not get, step by step (see
    /// [`RetryPolicy::warnings`]): not errors, but worth saying when it is validated.
    pub fn warnings(&self) -> Vec<String> {
        self.steps
            .iter()
            .flat_map(|step| {
                step.retry
                    .warnings()
                    .into_iter()
                    .map(move |w| format!("step {}: {w}", step.id))
            })
            .collect()
    }

    pub fn step(&self, index: u32) -> Option<&StepDef> {
        self.steps.get(index as usize)
    }

    /// Checks what the coordinator relies on: at least one step, unique step ids, sane policies.
    pub fn validate(&self) -> Result<(), String> {
        match self.problems().into_iter().next() {
            None => Ok(()),
            Some(problem) => Err(problem.to_string()),
        }
    }

    /// Everything wrong with the definition, each naming the field (`steps[1].retry.maxAttempts`).
    pub fn problems(&self) -> Vec<Problem> {
        let mut found = Vec::new();
        let mut problem = |step: Option<usize>, field: &'static str, message: String| {
            found.push(Problem {
                step,
                field,
                message,
            })
        };
        if self.pipeline_id.is_empty() {
            problem(None, "pipelineId", "must not be empty".into());
        }
        if self.release_version.is_empty() {
            problem(None, "releaseVersion", "must not be empty".into());
        }
        if self.steps.is_empty() {
            problem(None, "steps", "a pipeline needs at least one step".into());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, step) in self.steps.iter().enumerate() {
            let at = Some(i);
            if step.id.is_empty() {
                problem(at, "id", "a step needs an id".into());
            } else if !seen.insert(step.id.as_str()) {
                problem(at, "id", format!("duplicate step id {:?}", step.id));
            }
            // A fan-out step starts child executions (through the start queue): no worker of its own.
            if step.kind == StepKind::FanOut {
                if step.child_pipeline.as_deref().is_none_or(str::is_empty) {
                    problem(
                        at,
                        "childPipeline",
                        format!("fan-out step {:?} names no child pipeline", step.id),
                    );
                }
            } else if step.queue.is_empty() {
                problem(at, "queue", format!("step {:?} has no queue", step.id));
            }
            if step
                .tolerated_failure_percent
                .is_some_and(|p| !(0.0..=100.0).contains(&p))
            {
                problem(
                    at,
                    "toleratedFailurePercent",
                    "must be between 0 and 100".into(),
                );
            }
            if step.max_concurrency == Some(0) {
                problem(at, "maxConcurrency", "must be at least 1".into());
            }
            if step.retry.max_attempts == 0 {
                problem(at, "retry.maxAttempts", "must be at least 1".into());
            }
            if !(step.retry.multiplier.is_finite() && step.retry.multiplier >= 1.0) {
                problem(at, "retry.multiplier", "must be at least 1".into());
            }
            if step.retry.initial_delay_ms > step.retry.max_delay_ms {
                problem(
                    at,
                    "retry.initialDelayMs",
                    "must not exceed retry.maxDelayMs".into(),
                );
            }
            if step.timeout_secs == 0 {
                problem(at, "timeoutSecs", "must be at least 1".into());
            }
            if step.kind != StepKind::Await && !step.interactions.is_empty() {
                problem(
                    at,
                    "interactions",
                    "only await steps have interactions".into(),
                );
            }
            if step.kind != StepKind::FanOut
                && (step.child_pipeline.is_some()
                    || step.tolerated_failures.is_some()
                    || step.tolerated_failure_percent.is_some()
                    || step.max_concurrency.is_some())
            {
                problem(
                    at,
                    "kind",
                    "childPipeline, toleratedFailures, toleratedFailurePercent and maxConcurrency \
                     are for fan-out steps"
                        .into(),
                );
            }
        }
        found
    }
}

/// One thing wrong with a definition: the step (by position) and the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub step: Option<usize>,
    /// The field, as a definition file names it (`retry.maxAttempts`).
    pub field: &'static str,
    pub message: String,
}

impl Problem {
    /// The field's path in a definition: `steps[1].retry.maxAttempts`, `pipelineId`.
    pub fn path(&self) -> String {
        match self.step {
            Some(i) => format!("steps[{i}].{}", self.field),
            None => self.field.to_string(),
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path(), self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fan_out_tolerates_the_stricter_of_its_count_and_share() {
        let step = |count, percent| StepDef::fan_out("f", "c").tolerating(count, percent);
        assert_eq!(step(None, None).tolerated(1000), 0);
        assert_eq!(step(Some(3), None).tolerated(1000), 3);
        assert_eq!(step(None, Some(10.0)).tolerated(1000), 100);
        assert_eq!(step(None, Some(10.0)).tolerated(9), 0, "rounded down");
        assert_eq!(step(Some(3), Some(10.0)).tolerated(1000), 3);
        assert_eq!(step(Some(300), Some(10.0)).tolerated(1000), 100);
        assert_eq!(step(None, Some(100.0)).tolerated(7), 7);
        let def = |percent| PipelineDef::new("p", "1", [step(None, Some(percent))]);
        assert!(def(100.5).validate().is_err());
        assert!(def(-1.0).validate().is_err());
        assert_eq!(def(50.0).validate(), Ok(()));
    }

    #[test]
    fn sub_second_delays_are_said_to_be_rounded_up_to_whole_seconds() {
        let policy = |initial, max| RetryPolicy::doubling(3, initial, max);
        assert!(policy(1_000, 60_000).warnings().is_empty());
        assert!(
            policy(0, 0).warnings().is_empty(),
            "no delay at all is honoured"
        );
        assert!(
            RetryPolicy::doubling(1, 300, 300).warnings().is_empty(),
            "no retry"
        );
        let warned = policy(300, 60_000).warnings();
        assert_eq!(warned.len(), 1);
        assert!(
            warned[0].starts_with("initialDelayMs 300 is under a second"),
            "{warned:?}"
        );
        assert_eq!(policy(300, 500).warnings().len(), 2);
        let mut def =
            PipelineDef::new("p", "1", [StepDef::task("a", "q"), StepDef::task("b", "q")]);
        def.steps[1].retry = policy(250, 60_000);
        let warnings = def.warnings();
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].starts_with("step b: initialDelayMs 250"),
            "{warnings:?}"
        );
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::doubling(5, 100, 300);
        assert_eq!(p.delay_ms(1, 1.0), 100);
        assert_eq!(p.delay_ms(2, 1.0), 200);
        assert_eq!(p.delay_ms(3, 1.0), 300);
        assert_eq!(p.delay_ms(9, 1.0), 300);
        assert_eq!(p.delay_ms(2, 0.5), 100);
        assert_eq!(p.delay_ms(2, 0.0), 0);
    }

    #[test]
    fn validation_rejects_duplicate_steps() {
        let step = StepDef::task("a", "q").timeout_secs(1);
        let def = PipelineDef::new("p", "1", [step.clone(), step]);
        assert!(def.validate().unwrap_err().contains("duplicate"));
    }

    #[test]
    fn a_fan_out_step_needs_a_child_pipeline_not_a_queue() {
        let fan_out = |child: &str| {
            let first = StepDef::task("a", "q").timeout_secs(1);
            PipelineDef::new("p", "1", [first, StepDef::fan_out("b", child)])
        };
        assert_eq!(fan_out("children").validate(), Ok(()));
        assert!(fan_out("")
            .validate()
            .unwrap_err()
            .contains("child pipeline"));
        let no_queue = PipelineDef::new("p", "1", [StepDef::task("a", "").timeout_secs(1)]);
        assert!(no_queue.validate().unwrap_err().contains("no queue"));
    }

    #[test]
    fn built_steps_are_what_a_definition_file_reads() {
        let read = |text: &str| serde_json::from_str::<StepDef>(text).expect("a step");
        assert_eq!(
            StepDef::task("a", "q"),
            read(r#"{"id": "a", "queue": "q"}"#)
        );
        assert_eq!(
            StepDef::await_step("b", "q").interactions(["chef"]),
            read(r#"{"id": "b", "kind": "await", "queue": "q", "interactions": ["chef"]}"#)
        );
        assert_eq!(
            StepDef::fan_out("c", "child").types("in/1", "out/1"),
            read(
                r#"{"id": "c", "kind": "fanOut", "queue": "", "childPipeline": "child",
                    "inputType": "in/1", "outputType": "out/1"}"#
            )
        );
        let retried = StepDef::task("d", "q")
            .timeout_secs(9)
            .retry(RetryPolicy::doubling(4, 100, 800))
            .non_retryable(["BAD"]);
        assert_eq!(
            retried,
            read(
                r#"{"id": "d", "queue": "q", "timeoutSecs": 9, "retry": {"maxAttempts": 4,
                    "initialDelayMs": 100, "multiplier": 2.0, "maxDelayMs": 800,
                    "nonRetryable": ["BAD"]}}"#
            )
        );
    }
}
