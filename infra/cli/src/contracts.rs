//! The pipelines' code as the operator CLI knows it: the contracts committed under `examples/` (a test
//! of each example keeps its committed file equal to its code), read as data, so that the CLI links no
//! pipeline.

use std::path::Path;

use anyhow::{bail, Context, Result};
use stepline::contract::{Contract, ContractStep};
use stepline::domain::{PipelineDef, StepDef};
use stepline_stage::releases::PipelineCode;

/// The committed contract files under the workspace's `examples/`.
pub struct CommittedContracts;

impl PipelineCode for CommittedContracts {
    fn example(&self, queue: &str) -> Result<PipelineDef> {
        let uri = stepline_stage::example_contract_uri();
        let bytes = stepline_stage::read_artifact(&uri)
            .with_context(|| format!("cannot read the example's contract {uri}"))?;
        let contract = consistent(serde_json::from_slice(&bytes)?, &uri)?;
        Ok(definition(&contract, queue))
    }

    fn contract(&self, pipeline: &str) -> Result<Option<Contract>> {
        let examples = stepline_stage::workspace_root().join("examples");
        for file in json_files(&examples)? {
            let text = std::fs::read_to_string(&file)?;
            let Ok(contract) = serde_json::from_str::<Contract>(&text) else {
                continue;
            };
            if contract.pipeline_id == pipeline {
                return consistent(contract, &file.display().to_string()).map(Some);
            }
        }
        Ok(None)
    }
}

/// The `*.json` files one level below each directory of `root`.
fn json_files(root: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for dir in std::fs::read_dir(root).with_context(|| format!("reading {}", root.display()))? {
        let dir = dir?.path();
        if !dir.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&dir)? {
            let file = file?.path();
            if file.extension().is_some_and(|e| e == "json") {
                files.push(file);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// A contract whose recorded version is the one its content hashes to.
fn consistent(contract: Contract, source: &str) -> Result<Contract> {
    if !contract.is_consistent() {
        bail!("{source}: its contractVersion is not the hash of its content");
    }
    Ok(contract)
}

/// The definition of a contract's pipeline with every step on `queue` (timeouts and the release
/// version are the release's).
fn definition(contract: &Contract, queue: &str) -> PipelineDef {
    let step = |step: &ContractStep| StepDef {
        kind: step.kind,
        ..StepDef::task(step.id.clone(), queue)
            .types(step.input_type.clone(), step.output_type.clone())
            .timeout_secs(0)
            .retry(step.retry.clone())
    };
    PipelineDef::new(
        contract.pipeline_id.clone(),
        "",
        contract.steps.iter().map(step),
    )
}
