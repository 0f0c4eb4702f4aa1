//! The local stack: provisions template.yaml's resources on the emulator `AWS_ENDPOINT_URL` points at
//! (moto or LocalStack) and runs the project's handlers behind emulated Lambda event sources.

pub mod runner;
pub mod stack;
pub mod template;

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use aws_config::SdkConfig;
use stepline::config::{CoordinatorConfig, WorkerConfig};
use stepline::worker::StepFunction;
use stepline::Coordinator;

pub use runner::{Binding, Runner, RunnerOptions};
pub use stack::Stack;
pub use template::Template;

/// Names of the template's functions.
pub mod functions {
    pub const CLAIM: &str = "ClaimFunction";
    pub const LAUNCH: &str = "LaunchFunction";
    pub const COMPLETION: &str = "CompletionFunction";
    pub const REDRIVE: &str = "RedriveFunction";
    pub const ORDER_WORKER: &str = "OrderWorkerFunction";
}

/// A provisioned stack and the SDK configuration that reaches it.
pub struct LocalStack {
    pub sdk: SdkConfig,
    pub stack: Stack,
}

impl LocalStack {
    /// Provisions the project's template under `stage`.
    pub async fn up(stage: &str) -> Result<Self> {
        Self::up_with(stage, &BTreeMap::new()).await
    }

    /// Provisions with template parameters overridden (e.g. shorter leases for tests).
    pub async fn up_with(stage: &str, overrides: &BTreeMap<String, String>) -> Result<Self> {
        let sdk = stepline::aws::sdk_config().await;
        let template = Template::load(&Template::default_path())?;
        let stack = Stack::provision_with(&sdk, &template, stage, overrides).await?;
        Ok(Self { sdk, stack })
    }

    /// The coordinator as `function` would build it from its environment.
    pub fn coordinator(&self, function: &str) -> Result<Coordinator> {
        let config = CoordinatorConfig::from_lookup(self.stack.env_of(function)?)?;
        Ok(stepline::aws::coordinator(&self.sdk, &config))
    }

    /// Bindings of the claim, launch and completion functions, each with its own coordinator instance
    /// (as separate Lambda functions would have).
    pub fn coordinator_bindings(&self) -> Result<Vec<Binding>> {
        let claim = Arc::new(self.coordinator(functions::CLAIM)?);
        let launch = Arc::new(self.coordinator(functions::LAUNCH)?);
        let completion = Arc::new(self.coordinator(functions::COMPLETION)?);
        Ok(vec![
            Binding::Schedule {
                function: functions::CLAIM.into(),
                handler: Arc::new(move |event| {
                    let claim = claim.clone();
                    Box::pin(async move {
                        if let Err(e) = stepline::handlers::claim(&claim, event).await {
                            tracing::warn!(code = e.code(), error = %e, "claim run failed");
                        }
                    })
                }),
            },
            Binding::Sqs {
                function: functions::LAUNCH.into(),
                handler: Arc::new(move |event| {
                    let launch = launch.clone();
                    Box::pin(async move { stepline::handlers::launch(&launch, event).await })
                }),
            },
            Binding::Sqs {
                function: functions::COMPLETION.into(),
                handler: Arc::new(move |event| {
                    let completion = completion.clone();
                    Box::pin(
                        async move { stepline::handlers::completion(&completion, event).await },
                    )
                }),
            },
        ])
    }

    /// Binding of a worker function running `steps`, with the identity from its environment.
    pub fn worker_binding(&self, function: &str, steps: Arc<dyn StepFunction>) -> Result<Binding> {
        let config = WorkerConfig::from_lookup(self.stack.env_of(function)?)?;
        let worker = Arc::new(stepline::aws::worker(&self.sdk, &config, steps));
        Ok(Binding::Sqs {
            function: function.to_string(),
            handler: Arc::new(move |event| {
                let worker = worker.clone();
                Box::pin(async move { worker.handle(event).await })
            }),
        })
    }

    /// Starts the runner for `bindings`.
    pub fn run(&self, bindings: Vec<Binding>, options: RunnerOptions) -> Result<Runner> {
        Runner::start(
            aws_sdk_sqs::Client::new(&self.sdk),
            &self.stack,
            bindings,
            options,
        )
    }
}

/// A fresh stage name (lowercase, as the template's Stage pattern requires).
pub fn fresh_stage(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}
