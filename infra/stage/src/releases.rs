//! Release registry commands shared by `stepline-local` (local stages) and `stepline` (deployed ones).
//! What they know of the pipelines' code comes from the caller ([`PipelineCode`]) and from pipeline
//! files: the local stack links the example pipelines, the operator CLI links none.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use stepline::contract::Contract;
use stepline::domain::PipelineDef;
use stepline::release::{Artifact, Release};
use stepline::CoordinatorError;

use crate::{Stage, ORDER_REQUEST_QUEUE};

#[derive(Subcommand)]
pub enum ReleaseAction {
    /// Register a pipeline file (or, on a local stage, the example pipeline) as a release, without
    /// activating it.
    Register {
        /// The release version (also `--release`).
        #[arg(required_unless_present = "release_flag")]
        release: Option<String>,
        #[arg(long = "release", conflicts_with = "release")]
        release_flag: Option<String>,
        /// The pipeline file (YAML or JSON) to register.
        #[arg(long)]
        file: Option<PathBuf>,
        /// An artifact of the release: `KIND=URI[,sha256=HEX]` (the digest is computed for a local
        /// file when left out).
        #[arg(long = "artifact", value_parser = parse_artifact)]
        artifacts: Vec<Artifact>,
        /// The example pipeline's step timeout (without `--file`).
        #[arg(long, default_value_t = 60)]
        step_timeout_secs: u32,
    },
    /// Registered releases.
    List,
    /// The active release.
    Active,
    /// Activations, oldest first.
    History,
    /// Activate a registered release.
    Activate {
        release: String,
        #[arg(long, default_value = "activated by operator")]
        reason: String,
    },
    /// Activate the release that was active before the current one.
    Rollback {
        #[arg(long, default_value = "rollback")]
        reason: String,
    },
    /// What changed from one registered release to another, and whether executions pinned to the
    /// first are affected.
    Diff { from: String, to: String },
    /// Compare a registered release with the code's contract (or a pipeline file's) and its
    /// artifacts' digests.
    Drift {
        release: String,
        /// The pipeline file the code is built from.
        #[arg(long)]
        file: Option<PathBuf>,
    },
}

/// What the release commands know of the pipelines' code.
pub trait PipelineCode {
    /// The example pipeline `register` registers without a file, its steps on the request queue `queue`.
    fn example(&self, queue: &str) -> Result<PipelineDef>;
    /// The contract of `pipeline` as its code defines it (`None`: no code for it here).
    fn contract(&self, pipeline: &str) -> Result<Option<Contract>>;
}

/// No code but pipeline files: what a tool that links no pipeline knows.
pub struct FilesOnly;

impl PipelineCode for FilesOnly {
    fn example(&self, _queue: &str) -> Result<PipelineDef> {
        bail!("name the pipeline file to register with --file")
    }

    fn contract(&self, _pipeline: &str) -> Result<Option<Contract>> {
        Ok(None)
    }
}

/// Reads a pipeline file as release `release` (errors name the file, the line and the field).
pub fn read_pipeline_file(path: &Path, release: &str) -> Result<PipelineDef> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading pipeline file {}", path.display()))?;
    stepline::pipeline_file::parse(&text, release).map_err(|e| {
        anyhow::anyhow!(
            "{}: {}: {}",
            path.display(),
            stepline::pipeline_file::PipelineFileError::CODE,
            e.to_string()
                .replace('\n', &format!("\n{}: ", path.display()))
        )
    })
}

fn parse_artifact(text: &str) -> Result<Artifact, String> {
    let mut parts = text.split(',');
    let (kind, uri) = parts
        .next()
        .and_then(|first| first.split_once('='))
        .filter(|(kind, uri)| !kind.is_empty() && !uri.is_empty())
        .ok_or_else(|| format!("expected KIND=URI[,sha256=HEX], got {text:?}"))?;
    let mut digest = None;
    for part in parts {
        match part.split_once('=') {
            Some(("sha256", hex))
                if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) =>
            {
                digest = Some(format!("sha256:{}", hex.to_ascii_lowercase()))
            }
            _ => return Err(format!("{part:?}: expected sha256=<64 hex digits>")),
        }
    }
    let digest = match digest {
        Some(digest) => digest,
        None => {
            let bytes = std::fs::read(uri.strip_prefix("file:").unwrap_or(uri)).map_err(|e| {
                format!("{uri}: no sha256= given and the file cannot be read to compute it: {e}")
            })?;
            stepline::release::digest(&bytes)
        }
    };
    Ok(Artifact {
        kind: kind.into(),
        uri: uri.into(),
        digest,
    })
}

/// Runs a release command against `stage`'s registry, printing JSON. `pipeline` may be left out
/// when `register --file` names the file.
pub async fn run(
    stage: &Stage,
    code: &dyn PipelineCode,
    pipeline: Option<&str>,
    action: ReleaseAction,
) -> Result<()> {
    let api = stage.operator()?;
    let registry = api.registry();
    let json = |v: &dyn erased::Json| println!("{}", v.pretty());
    let named = || pipeline.context("name the pipeline with --pipeline");
    match action {
        ReleaseAction::Register {
            release,
            release_flag,
            file,
            artifacts,
            step_timeout_secs,
        } => {
            let release = release.or(release_flag).context("name the release")?;
            let descriptor = match &file {
                Some(path) => {
                    let definition = read_pipeline_file(path, &release)?;
                    if let Some(named) = pipeline.filter(|p| *p != definition.pipeline_id) {
                        bail!(
                            "{} defines pipeline {}, not {named}",
                            path.display(),
                            definition.pipeline_id
                        );
                    }
                    Release::new(definition, artifacts)
                }
                None => {
                    let (queue, _) = stage.stack.queue(ORDER_REQUEST_QUEUE)?;
                    let mut descriptor =
                        crate::example_release(code.example(queue)?, &release, step_timeout_secs)?;
                    descriptor.artifacts.extend(artifacts);
                    descriptor
                }
            };
            let outcome = api
                .register_release(&descriptor)
                .await
                .map_err(|e| match e {
                    CoordinatorError::ReleaseConflict { .. } => anyhow::anyhow!(
                        "release {} is registered with other content: releases are immutable",
                        descriptor.release_version
                    ),
                    other => other.into(),
                })?;
            eprintln!("{outcome:?}");
            json(&descriptor);
        }
        ReleaseAction::List => json(&registry.list(named()?).await?),
        ReleaseAction::Active => json(&registry.active(named()?).await?),
        ReleaseAction::History => json(&registry.history(named()?).await?),
        ReleaseAction::Activate { release, reason } => {
            let pipeline = named()?;
            json(&api.activate_release(pipeline, &release, &reason).await?);
            for warning in api.release_warnings(pipeline, &release).await? {
                eprintln!("warning: {warning}");
            }
        }
        ReleaseAction::Rollback { reason } => {
            json(&api.roll_back_release(named()?, &reason).await?)
        }
        ReleaseAction::Diff { from, to } => {
            let pipeline = named()?;
            let get = |release: String| async move {
                registry
                    .get(pipeline, &release)
                    .await?
                    .with_context(|| format!("release {release} of {pipeline} is not registered"))
            };
            let (from, to) = (get(from).await?, get(to).await?);
            json(&stepline::release::diff(&from, &to));
        }
        ReleaseAction::Drift { release, file } => {
            let pipeline = match (&file, pipeline) {
                (_, Some(p)) => p.to_string(),
                (Some(path), None) => read_pipeline_file(path, "")?.pipeline_id,
                (None, None) => bail!("name the pipeline with --pipeline or --file"),
            };
            let Some(registered) = registry.get(&pipeline, &release).await? else {
                bail!("release {release} of {pipeline} is not registered");
            };
            let code = match &file {
                Some(path) => Some(stepline::contract::Contract::of(&read_pipeline_file(
                    path, &release,
                )?)),
                None => code.contract(&pipeline)?,
            };
            let Some(code) = code else {
                bail!("drift needs the code's contract: name its pipeline file with --file");
            };
            let drift = stepline::release::drift(&registered, &code, crate::read_artifact);
            json(&drift);
            if !drift.is_empty() {
                bail!("release {release} drifted");
            }
        }
    }
    Ok(())
}

/// JSON printing of the registry's answers.
mod erased {
    pub trait Json {
        fn pretty(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn pretty(&self) -> String {
            serde_json::to_string_pretty(self).unwrap_or_default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_artifact;

    #[test]
    fn an_artifact_is_kind_uri_and_digest_given_or_computed() {
        let hex = "ab".repeat(32);
        let given = parse_artifact(&format!("lambda=s3://b/k.zip,sha256={hex}")).unwrap();
        assert_eq!(
            (given.kind.as_str(), given.uri.as_str(), given.digest),
            ("lambda", "s3://b/k.zip", format!("sha256:{hex}"))
        );
        let file = std::env::temp_dir().join(format!("artifact-{}", std::process::id()));
        std::fs::write(&file, b"bytes").unwrap();
        let computed = parse_artifact(&format!("contract=file:{}", file.display())).unwrap();
        assert_eq!(computed.digest, stepline::release::digest(b"bytes"));
        for bad in [
            "lambda",
            "=s3://x",
            "lambda=s3://b/k.zip,sha256=12",
            "lambda=/no/such/file",
        ] {
            assert!(parse_artifact(bad).is_err(), "{bad}");
        }
    }
}
