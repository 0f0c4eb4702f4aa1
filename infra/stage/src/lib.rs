//! A stage of template.yaml on whatever `AWS_ENDPOINT_URL` points at (AWS, moto or LocalStack): the
//! template's resources provisioned or found under a stage name, the coordinator each function builds
//! from its environment, and the release registry commands. Shared by the local stack
//! (`stepline-local`) and the operator CLI (`stepline`); it knows no example pipeline and runs nothing.

pub mod iam;
pub mod observe;
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
    /// The API's three function URLs: submit (and reads), operate, administer.
    pub const API: &str = "ApiFunction";
    pub const OPERATOR_API: &str = "OperatorApiFunction";
    pub const ADMIN_API: &str = "AdminApiFunction";
    pub const ORDER_WORKER: &str = "OrderWorkerFunction";
}

/// The request queue of the order example's worker (where `releases register` points its steps).
pub const ORDER_REQUEST_QUEUE: &str = "OrderRequestQueue";

/// A stage's resources and the SDK configuration that reaches them.
///
/// A stage this process provisioned (`up`, `up_with`: an emulator's, where nothing enforces IAM)
/// checks IAM: the clients of a function ([`Stage::function_clients`], [`Stage::coordinator`]) carry
/// an interceptor that evaluates each request against that function's policies in template.yaml, as
/// AWS would, and fails the calls AWS would deny. Dropping the stage panics with every denial seen
/// (unless the thread panics already), so a test that provoked one fails with the list. A stage found
/// (`find`: the operator CLI, on AWS itself) checks nothing.
pub struct Stage {
    pub sdk: SdkConfig,
    pub stack: Stack,
    /// The clients coordinators are built on (`with_clients` swaps them, e.g. for metered ones). The
    /// operator's: a function's own are these with its IAM check added.
    pub clients: Clients,
    /// The clients functions' calls go out on, when not `clients` (`with_function_clients`).
    network: Option<Clients>,
    iam: Option<iam::StageIam>,
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
        Ok(Self::on(sdk, stack, None))
    }

    /// Reaches a deployed stage by the names its template gives (see [`Stack::by_names`]): the
    /// operator CLI's way in, so that a command makes only the calls it needs.
    pub async fn reach(stage: &str) -> Result<Self> {
        let sdk = stepline::aws::sdk_config().await;
        let clients = Clients::new(&sdk);
        Self::reach_on(stage, sdk, clients).await
    }

    /// [`Stage::reach`] on `clients`. The one lookup it makes: the URLs of the queues the operator's
    /// configuration names (they go into messages: a request's `replyTo`), one `GetQueueUrl` each.
    pub async fn reach_on(stage: &str, sdk: SdkConfig, clients: Clients) -> Result<Self> {
        let template = Template::embedded();
        let mut stack = Stack::by_names(&template, stage)?;
        stack
            .resolve_queues_of(&clients.sqs, &template, functions::REDRIVE)
            .await?;
        Ok(Self::on(sdk, stack, None).with_clients(clients))
    }

    /// Provisions with template parameters overridden (e.g. shorter leases for tests).
    pub async fn up_with(stage: &str, overrides: &BTreeMap<String, String>) -> Result<Self> {
        let sdk = stepline::aws::sdk_config().await;
        let template = Template::load(&Template::default_path())?;
        let stack = Stack::provision_with(&sdk, &template, stage, overrides).await?;
        let iam = iam::StageIam::new(&template, &stack)?;
        Ok(Self::on(sdk, stack, Some(iam)))
    }

    fn on(sdk: SdkConfig, stack: Stack, iam: Option<iam::StageIam>) -> Self {
        let clients = Clients::new(&sdk);
        Self {
            sdk,
            stack,
            clients,
            network: None,
            iam,
        }
    }

    /// Coordinators built from now on use `clients`.
    pub fn with_clients(mut self, clients: Clients) -> Self {
        self.clients = clients;
        self
    }

    /// Functions' (and worker stacks') calls go out on `clients` from now on, while the operator's
    /// and the event sources' stay on [`Stage::clients`]: e.g. through a network that loses
    /// responses, between the functions and the services only.
    pub fn with_function_clients(mut self, clients: Clients) -> Self {
        self.network = Some(clients);
        self
    }

    fn functions_network(&self) -> &Clients {
        self.network.as_ref().unwrap_or(&self.clients)
    }

    /// The clients of `function`: [`Stage::clients`] (or those of `with_function_clients`) with its
    /// IAM check when the stage checks IAM.
    pub fn function_clients(&self, function: &str) -> Result<Clients> {
        let clients = self.functions_network();
        match &self.iam {
            Some(iam) => Ok(iam::checked_clients(clients, &iam.checker(function)?)),
            None => {
                self.stack.function(function)?;
                Ok(clients.clone())
            }
        }
    }

    /// The coordinator as `function` would build it from its environment, on its clients (which
    /// check its IAM policies when the stage does).
    pub fn coordinator(&self, function: &str) -> Result<Coordinator> {
        let config = CoordinatorConfig::from_lookup(self.stack.env_of(function)?)?;
        Ok(stepline::aws::coordinator_on(
            &self.function_clients(function)?,
            &config,
            Arc::new(stepline::ports::SystemClock),
        ))
    }

    /// A coordinator for an operator or a test driver (registering releases, submitting as a
    /// caller, inspecting): it acts with the operator's credentials, not a function's role, so its
    /// calls are not checked. Configured from the environment every function shares (the operator
    /// function's), without the sealing keys: operators' tools never read them. What an operator
    /// sends goes unsealed (its reply's completion reads the record), and a fan-out it re-drives has
    /// its children started by the sweeper.
    pub fn operator(&self) -> Result<Coordinator> {
        let config = CoordinatorConfig {
            seal_key_secret: None,
            ..CoordinatorConfig::from_lookup(self.stack.env_of(functions::REDRIVE)?)?
        };
        Ok(stepline::aws::coordinator_on(
            &self.clients,
            &config,
            Arc::new(stepline::ports::SystemClock),
        ))
    }

    /// The worker stack `stepline init` writes, as if deployed for `request_queue` and its `dlq`
    /// (queues made outside the template) to serve `release`: clients checked against its worker
    /// function's policies, and the worker configuration that stack gives the function.
    pub fn worker_stack(
        &self,
        request_queue: &stack::Physical,
        dlq: &stack::Physical,
        release: &str,
    ) -> Result<(Clients, stepline::config::WorkerConfig)> {
        let iam = self
            .iam
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("a worker stack needs a provisioned stage"))?;
        let worker = iam.worker_stack(request_queue, dlq, release)?;
        let config =
            stepline::config::WorkerConfig::from_lookup(|name| worker.env.get(name).cloned())?;
        Ok((
            iam::checked_clients(self.functions_network(), &worker.checker),
            config,
        ))
    }

    /// Takes `queue` (made outside the template) for a worker stack's request queue: the queue
    /// policy that `stepline init`'s template gives it governs the functions' calls on it. (On a
    /// stage that checks nothing, nothing to do.)
    pub fn adopt_worker_queue(&self, queue: &stack::Physical) -> Result<()> {
        match &self.iam {
            Some(iam) => iam.adopt_worker_queue(queue),
            None => Ok(()),
        }
    }

    /// Takes every queue of the stage's account made outside the template for a worker stack's
    /// request queue, governed by the queue policy of `stepline init`'s template: for a process that
    /// serves workers other processes attach (`stepline-local run`), which cannot adopt them one by
    /// one. (On a stage that checks nothing, nothing to do.)
    pub fn take_outside_queues_as_worker_stacks(&self) -> Result<()> {
        match &self.iam {
            Some(iam) => iam.take_outside_queues_as_worker_stacks(),
            None => Ok(()),
        }
    }

    /// The calls of the functions AWS would deny, so far (none when the stage checks nothing).
    pub fn iam_denials(&self) -> Vec<iam::Denial> {
        self.iam
            .as_ref()
            .map(iam::StageIam::denials)
            .unwrap_or_default()
    }

    /// Takes the denials seen so far (a test that provokes one on purpose takes it, so that dropping
    /// the stage does not fail).
    pub fn take_iam_denials(&self) -> Vec<iam::Denial> {
        self.iam
            .as_ref()
            .map(iam::StageIam::take_denials)
            .unwrap_or_default()
    }

    /// Registers `def` as a release (a no-op if identical) and activates it if its pipeline has no
    /// active release. Which release is active is the operator's choice once there is one: a
    /// restarted runner must not roll it back.
    pub async fn release(&self, def: PipelineDef, artifacts: Vec<Artifact>) -> Result<Release> {
        self.publish(Release::new(def, artifacts)).await
    }

    /// Registers `release`, activating it as [`Stage::release`] does.
    pub async fn publish(&self, release: Release) -> Result<Release> {
        let api = self.operator()?;
        api.release_unless_active(&release, "local stack").await?;
        Ok(release)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let denials = self.iam_denials();
        if !denials.is_empty() && !std::thread::panicking() {
            panic!("stage {}: {}", self.stack.stage, iam::report(&denials));
        }
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

#[cfg(test)]
mod tests {
    use std::panic::AssertUnwindSafe;

    use aws_sdk_dynamodb::error::DisplayErrorContext;
    use aws_sdk_dynamodb::types::AttributeValue;

    use super::*;

    /// A fresh stage on the emulator `AWS_ENDPOINT_URL` points at (`None` without one, unless
    /// `STEPLINE_REQUIRE_EMULATOR` asks for it).
    async fn fresh_stage() -> Option<Stage> {
        if std::env::var_os("AWS_ENDPOINT_URL").is_none() {
            assert!(
                std::env::var_os("STEPLINE_REQUIRE_EMULATOR").is_none(),
                "STEPLINE_REQUIRE_EMULATOR is set but AWS_ENDPOINT_URL is not"
            );
            eprintln!("skipped: no emulator (AWS_ENDPOINT_URL is not set)");
            return None;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let name = format!("iam-{}-{nanos}", std::process::id());
        Some(Stage::up(&name).await.expect("the stage provisions"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn iam_a_function_call_aws_would_deny_fails_and_is_reported_when_the_stage_drops() {
        let Some(stage) = fresh_stage().await else {
            return;
        };
        // Swapped clients (as a benchmark's metered ones) keep the check.
        let clients = Clients::new(&stage.sdk);
        let stage = stage.with_clients(clients);
        let table = |logical: &str| stage.stack.table(logical).unwrap().to_string();
        let put = |clients: &Clients, table: &str, pk: &str| {
            clients
                .dynamodb
                .put_item()
                .table_name(table)
                .item("pk", AttributeValue::S(pk.into()))
                .item("sk", AttributeValue::S("x".into()))
        };
        let (executions, releases) = (table("ExecutionTable"), table("ReleaseTable"));

        // The operator's clients are not checked; a function's allowed call goes through.
        put(&stage.clients, &releases, "pipeline#iam")
            .send()
            .await
            .unwrap();
        let completion = stage.function_clients(functions::COMPLETION).unwrap();
        put(&completion, &executions, "exec#iam")
            .send()
            .await
            .unwrap();
        assert!(stage.iam_denials().is_empty());

        // A worker has no table: the call fails before it is sent, as AWS would refuse it.
        let worker = stage.function_clients(functions::ORDER_WORKER).unwrap();
        let error = put(&worker, &releases, "pipeline#iam")
            .send()
            .await
            .unwrap_err();
        let error = DisplayErrorContext(&error).to_string();
        assert!(
            error.contains("AccessDenied: OrderWorkerFunction"),
            "{error}"
        );
        let denials = stage.take_iam_denials();
        assert_eq!(denials.len(), 1, "{denials:?}");
        assert_eq!(denials[0].action, "dynamodb:PutItem");

        // A stage that saw a denial fails whoever dropped it, with the list.
        put(&worker, &releases, "pipeline#iam")
            .send()
            .await
            .unwrap_err();
        let panic = std::panic::catch_unwind(AssertUnwindSafe(|| drop(stage))).unwrap_err();
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            message.contains("AccessDenied: OrderWorkerFunction"),
            "{message}"
        );
    }
}
