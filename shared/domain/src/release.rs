//! Releases: an immutable, registered deployment of a pipeline contract (its definition bound to the
//! request queues of its own workers, and the digests of its artifacts), and the append-only history of
//! activations (the latest is the active release). New executions pin the active release; running
//! executions keep theirs, whatever is activated later.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::time::Duration;

use crate::time::Timestamp;

use super::contract::Contract;
use super::pipeline::PipelineDef;

/// A deployed piece of a release (a function package, an image, a contract file) and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    pub kind: String,
    pub uri: String,
    /// `sha256:<hex>` of the artifact's bytes.
    pub digest: String,
}

/// A release descriptor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Release {
    pub pipeline_id: String,
    pub release_version: String,
    pub contract_version: String,
    pub step_ids: Vec<String>,
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
    /// The definition this release runs: steps bound to this release's request queues.
    pub definition: PipelineDef,
}

impl Release {
    pub fn new(definition: PipelineDef, artifacts: Vec<Artifact>) -> Self {
        Self {
            pipeline_id: definition.pipeline_id.clone(),
            release_version: definition.release_version.clone(),
            contract_version: Contract::of(&definition).contract_version,
            step_ids: definition.steps.iter().map(|s| s.id.clone()).collect(),
            artifacts,
            definition,
        }
    }

    /// A descriptor is consistent when its ids and contract version are those of its definition.
    pub fn validate(&self) -> Result<(), String> {
        self.definition.validate()?;
        let expected = Release::new(self.definition.clone(), self.artifacts.clone());
        if self.pipeline_id != expected.pipeline_id
            || self.release_version != expected.release_version
        {
            return Err("pipelineId/releaseVersion differ from the definition's".into());
        }
        if self.contract_version != expected.contract_version {
            return Err(format!(
                "contractVersion {} is not the definition's {}",
                self.contract_version, expected.contract_version
            ));
        }
        if self.step_ids != expected.step_ids {
            return Err("stepIds differ from the definition's steps".into());
        }
        Ok(())
    }
}

/// One activation event; the latest (highest sequence) is the active release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Activation {
    pub pipeline_id: String,
    pub release_version: String,
    pub sequence: u64,
    /// Epoch milliseconds.
    pub at: Timestamp,
    pub reason: String,
}

/// `sha256:<hex>` of some bytes.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A difference between what is registered and what is deployed or built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Drift {
    /// The code's contract is not the registered one.
    Contract { registered: String, code: String },
    /// An artifact's bytes no longer hash to the registered digest (or cannot be read).
    Artifact {
        uri: String,
        registered: String,
        actual: Option<String>,
    },
}

/// Compares a registered release with the code's contract and the artifacts' current bytes
/// (`read` returns an artifact's bytes by URI, `None` when it cannot be read).
pub fn drift(
    release: &Release,
    code: &Contract,
    read: impl Fn(&str) -> Option<Vec<u8>>,
) -> Vec<Drift> {
    let mut found = Vec::new();
    if release.contract_version != code.contract_version {
        found.push(Drift::Contract {
            registered: release.contract_version.clone(),
            code: code.contract_version.clone(),
        });
    }
    for artifact in &release.artifacts {
        let actual = read(&artifact.uri).map(|bytes| digest(&bytes));
        if actual.as_deref() != Some(artifact.digest.as_str()) {
            found.push(Drift::Artifact {
                uri: artifact.uri.clone(),
                registered: artifact.digest.clone(),
                actual,
            });
        }
    }
    found
}

/// What changed from one release of a pipeline to another.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseDiff {
    pub pipeline_id: String,
    pub from: String,
    pub to: String,
    pub from_contract: String,
    pub to_contract: String,
    /// Whether the contract changed (steps, kinds, types, retry policies), not only the deployment.
    pub contract_changed: bool,
    pub steps: Vec<StepChange>,
    /// What the change means for the executions pinned to `from`.
    pub pinned: PinnedImpact,
}

/// A step added, removed or changed (by id).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "camelCase")]
pub enum StepChange {
    Added {
        step: String,
        index: usize,
    },
    Removed {
        step: String,
        index: usize,
    },
    Changed {
        step: String,
        fields: Vec<FieldChange>,
    },
}

/// One field of a step, before and after; `contract`: whether it is part of the contract.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldChange {
    pub field: String,
    pub contract: bool,
    pub from: serde_json::Value,
    pub to: serde_json::Value,
}

/// Executions pinned to a release run its definition to their end, whatever is activated later. They
/// are affected by another release only where the two share a request queue: a worker serves one
/// release, so one release's requests reaching the other's workers are dead-lettered
/// (`IDENTITY_MISMATCH`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PinnedImpact {
    pub affected: bool,
    pub shared_queues: Vec<String>,
    pub explanation: String,
}

/// Fields of a step that are part of its contract (see [`Contract`]).
const CONTRACT_FIELDS: &[&str] = &["kind", "inputType", "outputType", "retry"];

/// Compares two releases of one pipeline.
pub fn diff(from: &Release, to: &Release) -> ReleaseDiff {
    let mut steps = Vec::new();
    let index_in = |release: &Release, id: &str| release.step_ids.iter().position(|s| s == id);
    for (index, step) in from.definition.steps.iter().enumerate() {
        let Some(other) = index_in(to, &step.id).map(|i| &to.definition.steps[i]) else {
            steps.push(StepChange::Removed {
                step: step.id.clone(),
                index,
            });
            continue;
        };
        let fields = field_changes(step, other, index_in(to, &step.id) != Some(index));
        if !fields.is_empty() {
            steps.push(StepChange::Changed {
                step: step.id.clone(),
                fields,
            });
        }
    }
    for (index, step) in to.definition.steps.iter().enumerate() {
        if index_in(from, &step.id).is_none() {
            steps.push(StepChange::Added {
                step: step.id.clone(),
                index,
            });
        }
    }
    let queues = |release: &Release| -> std::collections::BTreeSet<String> {
        release
            .definition
            .steps
            .iter()
            .map(|s| s.queue.clone())
            .filter(|q| !q.is_empty())
            .collect()
    };
    let shared_queues: Vec<String> = queues(from).intersection(&queues(to)).cloned().collect();
    let explanation = if shared_queues.is_empty() {
        format!(
            "executions pinned to release {} keep its definition and its own queues: keep its \
             workers running until they end",
            from.release_version
        )
    } else {
        format!(
            "releases {} and {} share request queues ({}): a worker serves one release, so \
             requests of executions pinned to {} that reach {}'s workers are dead-lettered \
             (IDENTITY_MISMATCH); give each release its own queues, or let {}'s executions end \
             before its workers are replaced",
            from.release_version,
            to.release_version,
            shared_queues.join(", "),
            from.release_version,
            to.release_version,
            from.release_version
        )
    };
    ReleaseDiff {
        pipeline_id: to.pipeline_id.clone(),
        from: from.release_version.clone(),
        to: to.release_version.clone(),
        from_contract: from.contract_version.clone(),
        to_contract: to.contract_version.clone(),
        contract_changed: from.contract_version != to.contract_version,
        steps,
        pinned: PinnedImpact {
            affected: !shared_queues.is_empty(),
            shared_queues,
            explanation,
        },
    }
}

/// The fields of two versions of a step that differ (and its position, when it moved).
/// Why an execution cannot continue on another release from its failed step (see
/// [`continues_on`]): each reason, and the two releases' diff.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Incompatible {
    pub reasons: Vec<String>,
    pub diff: Box<ReleaseDiff>,
}

/// Whether an execution of release `from` that stopped at step index `step` can continue on release
/// `to` from that step (a hotfix): the same pipeline; every step before it at the same place with
/// its contract unchanged (kind, types, retry policy: what they produced stays what it was); the
/// step itself at the same place, of the same kind, taking the same input type; and every step
/// after it still there.
pub fn continues_on(from: &Release, to: &Release, step: usize) -> Result<(), Incompatible> {
    let mut reasons = Vec::new();
    if from.pipeline_id != to.pipeline_id {
        reasons.push(format!(
            "release {} is of pipeline {}, not {}",
            to.release_version, to.pipeline_id, from.pipeline_id
        ));
    }
    let (before, after) = (&from.definition.steps, &to.definition.steps);
    for (index, old) in before.iter().enumerate() {
        let new = after.get(index).filter(|new| new.id == old.id);
        if index < step {
            match new {
                None => reasons.push(format!("step {} (before it) is not at its place", old.id)),
                Some(new) => {
                    let changed: Vec<String> = field_changes(old, new, false)
                        .into_iter()
                        .filter(|f| f.contract)
                        .map(|f| f.field)
                        .collect();
                    if !changed.is_empty() {
                        reasons.push(format!(
                            "step {} (before it) changed its contract: {}",
                            old.id,
                            changed.join(", ")
                        ));
                    }
                }
            }
        } else if index == step {
            match new {
                None => reasons.push(format!("step {} is not at its place", old.id)),
                Some(new) if new.kind != old.kind || new.input_type != old.input_type => reasons
                    .push(format!(
                        "step {} changed its kind or input type: it must take what the steps \
                         before it produced",
                        old.id
                    )),
                Some(_) => {}
            }
        } else if !after.iter().any(|new| new.id == old.id) {
            reasons.push(format!("step {} (after it) is gone", old.id));
        }
    }
    if step >= before.len() {
        reasons.push(format!(
            "release {} has no step {step}",
            from.release_version
        ));
    }
    match reasons.is_empty() {
        true => Ok(()),
        false => Err(Incompatible {
            reasons,
            diff: Box::new(diff(from, to)),
        }),
    }
}

fn field_changes(
    from: &super::pipeline::StepDef,
    to: &super::pipeline::StepDef,
    moved: bool,
) -> Vec<FieldChange> {
    let object = |step| match serde_json::to_value(step) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    };
    let (before, after) = (object(from), object(to));
    let mut names: Vec<&String> = before.keys().chain(after.keys()).collect();
    names.sort();
    names.dedup();
    let mut fields: Vec<FieldChange> = names
        .into_iter()
        .filter(|name| before.get(*name) != after.get(*name))
        .map(|name| FieldChange {
            field: name.clone(),
            contract: CONTRACT_FIELDS.contains(&name.as_str()),
            from: before.get(name).cloned().unwrap_or_default(),
            to: after.get(name).cloned().unwrap_or_default(),
        })
        .collect();
    if moved {
        fields.push(FieldChange {
            field: "position".into(),
            contract: true,
            from: serde_json::Value::Null,
            to: serde_json::Value::Null,
        });
    }
    fields
}

/// What a worker says of itself: serving, or draining (taking no more requests, e.g. shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkerState {
    Healthy,
    Draining,
}

/// What the coordinator makes of a worker: `Stale` once it has not announced itself for
/// [`STALE_AFTER`] (presumed gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WorkerHealth {
    Healthy,
    Stale,
    Draining,
}

/// How often a running worker announces itself (at its start, then at most this often).
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(5 * 60);
/// A worker not heard of for this long is stale: three announcements missed.
pub const STALE_AFTER: Duration = Duration::from_secs(3 * 5 * 60);

/// A worker as the registry last heard of it (one item per worker, the newest announcement).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerRecord {
    pub worker_id: String,
    pub pipeline_id: String,
    pub contract_version: String,
    pub release_version: String,
    /// The request queue it reads.
    pub queue: String,
    pub state: WorkerState,
    /// When the coordinator received its latest announcement (epoch ms).
    pub seen_at: Timestamp,
}

impl WorkerRecord {
    pub fn health(&self, now: Timestamp) -> WorkerHealth {
        match self.state {
            _ if now.since(self.seen_at) > STALE_AFTER => WorkerHealth::Stale,
            WorkerState::Draining => WorkerHealth::Draining,
            WorkerState::Healthy => WorkerHealth::Healthy,
        }
    }
}

/// Whether a release's workers are all draining: some worker of it announced it drains recently and
/// none serves it. Submissions pinned to it are then refused. (No worker heard of, or only stale ones:
/// not known to be draining.)
pub fn all_draining(workers: &[WorkerRecord], release_version: &str, now: Timestamp) -> bool {
    let health: Vec<WorkerHealth> = workers
        .iter()
        .filter(|w| w.release_version == release_version)
        .map(|w| w.health(now))
        .collect();
    health.contains(&WorkerHealth::Draining) && !health.contains(&WorkerHealth::Healthy)
}

/// Whether a live (healthy) worker serves the release.
pub fn served(workers: &[WorkerRecord], release_version: &str, now: Timestamp) -> bool {
    workers
        .iter()
        .any(|w| w.release_version == release_version && w.health(now) == WorkerHealth::Healthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RetryPolicy, StepDef};

    fn def(attempts: u32) -> PipelineDef {
        let retry = RetryPolicy {
            max_attempts: attempts,
            ..RetryPolicy::default()
        };
        let step = StepDef::task("a", "q").timeout_secs(5).retry(retry);
        PipelineDef::new("p", "1", [step])
    }

    #[test]
    fn a_new_release_is_consistent_and_a_tampered_one_is_not() {
        let release = Release::new(def(5), Vec::new());
        assert_eq!(release.step_ids, ["a"]);
        assert!(release.validate().is_ok());
        let mut tampered = release.clone();
        tampered.definition.steps[0].retry.max_attempts = 9;
        assert!(tampered.validate().unwrap_err().contains("contractVersion"));
    }

    #[test]
    fn drift_reports_contract_and_artifact_differences() {
        let artifact = Artifact {
            kind: "contract".into(),
            uri: "file:x".into(),
            digest: digest(b"v1"),
        };
        let release = Release::new(def(5), vec![artifact]);
        let same = Contract::of(&def(5));
        assert!(drift(&release, &same, |_| Some(b"v1".to_vec())).is_empty());

        let found = drift(&release, &Contract::of(&def(7)), |_| Some(b"v2".to_vec()));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            matches!(&found[0], Drift::Contract { code, .. } if *code == Contract::of(&def(7)).contract_version)
        );
        assert!(
            matches!(&found[1], Drift::Artifact { actual: Some(d), .. } if *d == digest(b"v2"))
        );

        let unreadable = drift(&release, &same, |_| None);
        assert!(matches!(
            &unreadable[0],
            Drift::Artifact { actual: None, .. }
        ));
    }

    #[test]
    fn a_diff_tells_contract_from_deployment_and_shared_queues() {
        let release = |version: &str, attempts: u32, queue: &str, extra: bool| {
            let mut steps = vec![
                StepDef::task("a", queue)
                    .timeout_secs(5)
                    .retry(RetryPolicy {
                        max_attempts: attempts,
                        ..RetryPolicy::default()
                    }),
                StepDef::task("b", queue),
            ];
            if extra {
                steps.push(StepDef::task("c", queue));
            }
            Release::new(PipelineDef::new("p", version, steps), Vec::new())
        };
        let same_contract = diff(&release("1", 3, "q1", false), &release("2", 3, "q2", false));
        assert!(!same_contract.contract_changed);
        assert!(!same_contract.pinned.affected);
        assert_eq!(same_contract.steps.len(), 2, "both queues moved");
        assert!(same_contract.steps.iter().all(|c| matches!(c,
            StepChange::Changed { fields, .. } if fields.len() == 1 && fields[0].field == "queue" && !fields[0].contract)));

        let changed = diff(&release("1", 3, "q", false), &release("2", 5, "q", true));
        assert!(changed.contract_changed);
        assert!(changed.pinned.affected);
        assert_eq!(changed.pinned.shared_queues, ["q"]);
        assert_eq!(
            changed.steps,
            [
                StepChange::Changed {
                    step: "a".into(),
                    fields: vec![FieldChange {
                        field: "retry".into(),
                        contract: true,
                        from: serde_json::to_value(RetryPolicy::default()).unwrap(),
                        to: serde_json::to_value(RetryPolicy {
                            max_attempts: 5,
                            ..RetryPolicy::default()
                        })
                        .unwrap(),
                    }],
                },
                StepChange::Added {
                    step: "c".into(),
                    index: 2
                },
            ]
        );
        let removed = diff(&release("2", 3, "q", true), &release("3", 3, "q3", false));
        assert!(removed.steps.contains(&StepChange::Removed {
            step: "c".into(),
            index: 2
        }));
    }

    #[test]
    fn a_release_is_draining_when_its_recent_workers_all_drain() {
        let worker = |id: &str, release: &str, state, seen_at| WorkerRecord {
            worker_id: id.into(),
            pipeline_id: "p".into(),
            contract_version: "sha256:00".into(),
            release_version: release.into(),
            queue: "q".into(),
            state,
            seen_at,
        };
        let now = Timestamp::EPOCH + STALE_AFTER * 10;
        let old = now - STALE_AFTER - Duration::from_millis(1);
        let draining = worker("a", "1", WorkerState::Draining, now);
        assert_eq!(draining.health(now), WorkerHealth::Draining);
        assert_eq!(
            worker("b", "1", WorkerState::Healthy, old).health(now),
            WorkerHealth::Stale
        );
        assert!(
            !all_draining(&[], "1", now),
            "no worker heard of: not known to drain"
        );
        assert!(all_draining(std::slice::from_ref(&draining), "1", now));
        assert!(
            !all_draining(std::slice::from_ref(&draining), "2", now),
            "another release's"
        );
        let serving = worker("b", "1", WorkerState::Healthy, now);
        assert!(!all_draining(
            &[draining.clone(), serving.clone()],
            "1",
            now
        ));
        assert!(served(&[serving], "1", now));
        let gone = worker("c", "1", WorkerState::Draining, old);
        assert!(
            !all_draining(std::slice::from_ref(&gone), "1", now),
            "a stale one is gone"
        );
        assert!(!served(&[gone, draining], "1", now));
    }

    /// A three-step pipeline's release `version`, its steps changed by `change`.
    fn shop(version: &str, change: impl FnOnce(&mut Vec<StepDef>)) -> Release {
        let mut steps = vec![
            StepDef::task("check", "q").types("order/1", "checked/1"),
            StepDef::task("price", "q").types("checked/1", "priced/1"),
            StepDef::task("ship", "q"),
        ];
        change(&mut steps);
        Release::new(PipelineDef::new("shop", version, steps), Vec::new())
    }

    #[test]
    fn a_release_continues_an_execution_only_where_it_keeps_what_came_before() {
        let one = shop("1", |_| {});
        // A fix of the failed step itself (its retry policy, its code behind the same queue), and a
        // step added after it: continues.
        let fixed = shop("2", |steps| {
            steps[1].retry.max_attempts = 9;
            steps.push(StepDef::task("notify", "q"));
        });
        assert_eq!(continues_on(&one, &fixed, 1), Ok(()));

        let refused = |to: &Release, step: usize| {
            let refused = continues_on(&one, to, step).expect_err("incompatible");
            assert_eq!(
                refused.diff.to, to.release_version,
                "the diff comes with it"
            );
            refused.reasons.join("; ")
        };
        // A step before it changed what it produces.
        let before = shop("3", |steps| steps[0].output_type = "checked/2".into());
        assert!(refused(&before, 1).contains("check (before it) changed its contract"));
        // The failed step takes another input.
        let input = shop("4", |steps| steps[1].input_type = "checked/2".into());
        assert!(refused(&input, 1).contains("price changed its kind or input type"));
        // A step after it is gone; the steps moved.
        let gone = shop("5", |steps| {
            steps.pop();
        });
        assert!(refused(&gone, 1).contains("ship (after it) is gone"));
        let moved = shop("6", |steps| steps.swap(0, 1));
        assert!(refused(&moved, 1).contains("is not at its place"));
        // Another pipeline.
        let mut other = shop("7", |_| {});
        other.pipeline_id = "other".into();
        assert!(refused(&other, 1).contains("of pipeline other"));
        // From the first step, what came before is nothing: only the step and those after count.
        assert_eq!(continues_on(&one, &before, 0), Ok(()));
    }
}
