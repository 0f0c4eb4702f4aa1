//! Release registry commands shared by `stepline-local` (local stages) and `stepline` (deployed ones).
//! What they know of the pipelines' code comes from the caller ([`PipelineCode`]): the local stack
//! links the example pipelines, the operator CLI reads their committed contracts.

use anyhow::{bail, Result};
use clap::Subcommand;
use stepline::contract::Contract;
use stepline::domain::PipelineDef;
use stepline::CoordinatorError;

use crate::{functions, Stage, ORDER_REQUEST_QUEUE};

#[derive(Subcommand)]
pub enum ReleaseAction {
    /// Register the example pipeline as a release (on the stage's request queue), without activating it.
    Register {
        release: String,
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
    /// Compare a registered release with the code's contract and its artifacts' digests.
    Drift { release: String },
}

/// What the release commands know of the pipelines' code.
pub trait PipelineCode {
    /// The example pipeline `register` registers, its steps on the request queue `queue`.
    fn example(&self, queue: &str) -> Result<PipelineDef>;
    /// The contract of `pipeline` as its code defines it (`None`: no code for it here).
    fn contract(&self, pipeline: &str) -> Result<Option<Contract>>;
}

/// Runs a release command against `stage`'s registry, printing JSON.
pub async fn run(
    stage: &Stage,
    code: &dyn PipelineCode,
    pipeline: &str,
    action: ReleaseAction,
) -> Result<()> {
    let api = stage.coordinator(functions::REDRIVE)?;
    let registry = api.registry();
    let json = |v: &dyn erased::Json| println!("{}", v.pretty());
    match action {
        ReleaseAction::Register {
            release,
            step_timeout_secs,
        } => {
            let (queue, _) = stage.stack.queue(ORDER_REQUEST_QUEUE)?;
            let descriptor =
                crate::example_release(code.example(queue)?, &release, step_timeout_secs)?;
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
        ReleaseAction::List => json(&registry.list(pipeline).await?),
        ReleaseAction::Active => json(&registry.active(pipeline).await?),
        ReleaseAction::History => json(&registry.history(pipeline).await?),
        ReleaseAction::Activate { release, reason } => {
            json(&api.activate_release(pipeline, &release, &reason).await?)
        }
        ReleaseAction::Rollback { reason } => {
            json(&api.roll_back_release(pipeline, &reason).await?)
        }
        ReleaseAction::Drift { release } => {
            let Some(registered) = registry.get(pipeline, &release).await? else {
                bail!("release {release} of {pipeline} is not registered");
            };
            let Some(code) = code.contract(pipeline)? else {
                bail!("this tool has no code for pipeline {pipeline}: drift needs the code's contract");
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
