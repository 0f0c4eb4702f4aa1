//! Releases: an immutable, registered deployment of a pipeline contract (its definition bound to the
//! request queues of its own workers, and the digests of its artifacts), and the append-only history of
//! activations (the latest is the active release). New executions pin the active release; running
//! executions keep theirs, whatever is activated later.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
    pub at: i64,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{RetryPolicy, StepDef};

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
}
