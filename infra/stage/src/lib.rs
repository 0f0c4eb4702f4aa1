//! A stage of template.yaml on whatever `AWS_ENDPOINT_URL` points at (AWS, moto or LocalStack): the
//! template's resources provisioned or found under a stage name, the coordinator each function builds
//! from its environment, and the release registry commands. Shared by the local stack
//! (`stepline-local`) and the operator CLI (`stepline`); it knows no example pipeline and runs nothing.

pub mod releases;
pub mod stack;
pub mod template;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use aws_config::SdkConfig;
use aws_sdk_sqs::types::QueueAttributeName;
use stepline::aws::Clients;
use stepline::config::CoordinatorConfig;
use stepline::contract::CONTRACT_FILE;
use stepline::domain::PipelineDef;
use stepline::release::{Artifact, Release};
use stepline::Coordinator;

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

/// The request queue of the order example's worker (where `releases register` points its steps).
pub const ORDER_REQUEST_QUEUE: &str = "OrderRequestQueue";

/// A stage's resources and the SDK configuration that reaches them.
pub struct Stage {
    pub sdk: SdkConfig,
    pub stack: Stack,
    /// The clients coordinators are built on (`with_clients` swaps them, e.g. for metered ones).
    pub clients: Clients,
}

impl Stage {
    /// Provisions the project's template under `stage` (reusing what exists of it as it is).
    pub async fn up(stage: &str) -> Result<Self> {
        Self::up_with(stage, &BTreeMap::new()).await
    }

    /// Finds an already deployed stage (on AWS or an emulator), creating nothing.
    pub async fn find(stage: &str) -> Result<Self> {
        let sdk = stepline::aws::sdk_config().await;
        let stack = Stack::lookup(&sdk, &Template::embedded(), stage).await?;
        Ok(Self::on(sdk, stack))
    }

    /// Provisions with template parameters overridden (e.g. shorter leases for tests).
    pub async fn up_with(stage: &str, overrides: &BTreeMap<String, String>) -> Result<Self> {
        let sdk = stepline::aws::sdk_config().await;
        let template = Template::load(&Template::default_path())?;
        let stack = Stack::provision_with(&sdk, &template, stage, overrides).await?;
        Ok(Self::on(sdk, stack))
    }

    fn on(sdk: SdkConfig, stack: Stack) -> Self {
        let clients = Clients::new(&sdk);
        Self {
            sdk,
            stack,
            clients,
        }
    }

    /// Coordinators built from now on use `clients`.
    pub fn with_clients(mut self, clients: Clients) -> Self {
        self.clients = clients;
        self
    }

    /// The coordinator as `function` would build it from its environment.
    pub fn coordinator(&self, function: &str) -> Result<Coordinator> {
        let config = CoordinatorConfig::from_lookup(self.stack.env_of(function)?)?;
        Ok(stepline::aws::coordinator_on(
            &self.clients,
            &config,
            Arc::new(stepline::ports::SystemClock),
        ))
    }

    /// Registers `def` as a release (a no-op if identical) and activates it if its pipeline has no
    /// active release. Which release is active is the operator's choice once there is one: a
    /// restarted runner must not roll it back.
    pub async fn release(&self, def: PipelineDef, artifacts: Vec<Artifact>) -> Result<Release> {
        self.publish(Release::new(def, artifacts)).await
    }

    /// Registers `release`, activating it as [`Stage::release`] does.
    pub async fn publish(&self, release: Release) -> Result<Release> {
        let api = self.coordinator(functions::REDRIVE)?;
        api.release_unless_active(&release, "local stack").await?;
        Ok(release)
    }
}

impl Stage {
    /// Attributes `names` of a queue of the stage, read on a client of their own (a stage on metered
    /// clients does not count them).
    pub async fn queue_attributes(
        &self,
        logical: &str,
        names: &[QueueAttributeName],
    ) -> Result<HashMap<QueueAttributeName, String>> {
        let (_, url) = self.stack.queue(logical)?;
        stack::queue_attributes(&aws_sdk_sqs::Client::new(&self.sdk), url, names).await
    }
}

/// Workspace root (this crate lives in infra/stage).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `file:` URI of the order example's committed contract (relative to the workspace).
pub fn example_contract_uri() -> String {
    format!("file:examples/order-worker/{CONTRACT_FILE}")
}

/// The order example's committed contract as a release artifact.
pub fn example_contract_artifact() -> Result<Artifact> {
    let uri = example_contract_uri();
    let bytes = read_artifact(&uri).ok_or_else(|| anyhow::anyhow!("cannot read {uri}"))?;
    Ok(Artifact {
        kind: "contract".into(),
        uri,
        digest: stepline::release::digest(&bytes),
    })
}

/// The order example's release `release_version`: `def` (its definition on the stage's request
/// queue) with every step's timeout set, and the committed contract as its artifact.
pub fn example_release(
    mut def: PipelineDef,
    release_version: &str,
    step_timeout_secs: u32,
) -> Result<Release> {
    def.release_version = release_version.to_string();
    for step in &mut def.steps {
        step.timeout_secs = step_timeout_secs;
    }
    Ok(Release::new(def, vec![example_contract_artifact()?]))
}

/// Reads a `file:` artifact (relative to the workspace root, or absolute).
pub fn read_artifact(uri: &str) -> Option<Vec<u8>> {
    let path = uri.strip_prefix("file:")?;
    let path = Path::new(path);
    let path = if path.is_absolute() {
        path.to_path_buf()
    } else {
        workspace_root().join(path)
    };
    std::fs::read(path).ok()
}
