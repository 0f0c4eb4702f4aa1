//! Release registry commands shared by `stepline-local` (local stages) and `stepline` (deployed ones).

use anyhow::{bail, Result};
use clap::Subcommand;
use stepline::contract::Contract;

use crate::{functions, LocalStack};

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

/// The contract of an example pipeline built into these tools (for drift reports).
pub fn example_contract(pipeline: &str) -> Option<Contract> {
    match pipeline {
        order_worker::PIPELINE_ID => Some(order_worker::contract()),
        restaurant_approval::PIPELINE_ID => Some(restaurant_approval::contract()),
        csv_payments::BATCH_PIPELINE => Some(csv_payments::batch_contract()),
        csv_payments::PAYMENT_PIPELINE => Some(csv_payments::payment_contract()),
        _ => None,
    }
}

/// Runs a release command against `local`'s registry, printing JSON.
pub async fn run(local: &LocalStack, pipeline: &str, action: ReleaseAction) -> Result<()> {
    let api = local.coordinator(functions::REDRIVE)?;
    let registry = api.registry();
    let json = |v: &dyn erased::Json| println!("{}", v.pretty());
    match action {
        ReleaseAction::Register {
            release,
            step_timeout_secs,
        } => {
            let (queue, _) = local.stack.queue("OrderRequestQueue")?;
            let mut def = order_worker::pipeline(queue);
            def.release_version = release;
            for step in &mut def.steps {
                step.timeout_secs = step_timeout_secs;
            }
            let descriptor =
                stepline::release::Release::new(def, vec![crate::example_contract_artifact()?]);
            let outcome = registry.register(&descriptor).await.map_err(|e| match e {
                stepline::ports::StoreError::Conflict => anyhow::anyhow!(
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
            let Some(code) = example_contract(pipeline) else {
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
