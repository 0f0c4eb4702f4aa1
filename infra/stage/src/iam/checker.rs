//! The SDK interceptor that checks every request of a function's clients, and the stage's IAM: each
//! function's principal, the denials recorded.

use super::*;

/// A call AWS would deny.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Denial {
    pub function: String,
    pub action: String,
    pub resource: String,
    /// The request's service condition keys (e.g. `dynamodb:LeadingKeys`), for the reader.
    pub keys: Vec<(String, Vec<String>)>,
    pub reason: String,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AccessDenied: {} is not authorized to perform {} on {}",
            self.function, self.action, self.resource
        )?;
        for (key, values) in &self.keys {
            write!(f, " [{key}={}]", values.join(","))?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// The distinct denials of `denials`, each with how often it happened, one a line.
pub fn report(denials: &[Denial]) -> String {
    let mut counts: BTreeMap<&Denial, usize> = BTreeMap::new();
    for denial in denials {
        *counts.entry(denial).or_default() += 1;
    }
    let mut out = format!(
        "IAM: {} call(s) that AWS would deny, by template.yaml's policies ({} distinct):",
        denials.len(),
        counts.len()
    );
    for (denial, count) in counts {
        out.push_str(&format!("\n  {count} x {denial}"));
    }
    out
}

// ------------------------------------------------------------------------------------ interceptor

/// The SDK interceptor checking every request of one function's clients.
#[derive(Clone)]
pub struct Checker {
    pub(crate) principal: Arc<Principal>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) denials: Arc<Mutex<Vec<Denial>>>,
    pub(crate) worker_queues: Arc<WorkerQueues>,
}

/// Queues outside the template that stand for worker stacks' request queues (`stepline init`),
/// each governed by the queue policy that stack's template gives it (`RequestQueuePolicy`), resolved
/// for that queue. A queue outside the template that was not adopted has no policy: identity
/// policies alone decide, and the coordinator's grant nothing outside its stack, as on AWS for a
/// queue nobody opened to the coordinator (a mistyped queue, another account's).
///
/// A process that cannot be told which queues were adopted (`stepline-local run` serving workers
/// that other processes attach) may take every queue outside the template, of the account the
/// stage's queues live in, for a worker stack's ([`StageIam::take_outside_queues_as_worker_stacks`]):
/// each then gets that stack's queue policy, resolved for it. Another account's queue never does.
#[derive(Debug, Default)]
pub struct WorkerQueues {
    adopted: Mutex<BTreeMap<String, WorkerQueue>>,
    /// The worker stack every queue of the account stands for, when outside queues are taken for
    /// worker stacks' (resolved for a placeholder queue, re-pointed at each).
    any_in_account: Mutex<Option<WorkerQueue>>,
}

/// A worker stack as deployed for one request queue: its template and what it resolves on.
#[derive(Debug, Clone)]
pub(crate) struct WorkerQueue {
    pub(crate) template: Template,
    pub(crate) stack: Stack,
    pub(crate) imports: BTreeMap<String, String>,
}

impl WorkerQueues {
    /// The queue at `arn` is `queue`'s request queue from now on.
    pub(crate) fn adopt(&self, arn: String, queue: WorkerQueue) {
        self.adopted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(arn, queue);
    }

    /// From now on every queue of the account outside the template stands for a worker stack's,
    /// as `stack` is deployed for it.
    pub(crate) fn take_any_in_account(&self, stack: WorkerQueue) {
        *self
            .any_in_account
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(stack);
    }

    /// The worker stack of the queue at `arn`: adopted, or taken for one as any of the account the
    /// stage's queues live in.
    fn stack_of(&self, arn: &str, catalog: &Catalog) -> Option<WorkerQueue> {
        let adopted = self.adopted.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = adopted.get(arn) {
            return Some(queue.clone());
        }
        if catalog.is_stack_queue(arn) {
            return None;
        }
        let any = self
            .any_in_account
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let parts = arn_parts(arn)?;
        let (account, name) = (parts[4], parts[5]);
        if account != catalog.accounts.home("sqs").account {
            return None;
        }
        let mut queue = any.clone()?;
        let queue_of = |name: String| Physical::Queue {
            url: format!("https://sqs.{}/{account}/{name}", parts[3]),
            arn: format!("arn:{}:sqs:{}:{account}:{name}", parts[1], parts[3]),
            name,
        };
        queue
            .stack
            .parameters
            .insert("RequestQueueName".into(), name.to_string());
        queue
            .stack
            .resources
            .insert("RequestQueue".into(), queue_of(name.to_string()));
        queue.stack.resources.insert(
            "RequestDeadLetterQueue".into(),
            queue_of(format!("{name}-dlq")),
        );
        Some(queue)
    }

    /// The queue policies, as they cover `role_arn`, of the worker stacks' queues `requests` name.
    pub(crate) fn documents(
        &self,
        requests: &[Request],
        catalog: &Catalog,
        role_arn: &str,
    ) -> Result<Vec<ResourceDocument>> {
        let named: BTreeSet<&String> = requests
            .iter()
            .filter(|r| r.action.starts_with("sqs:"))
            .map(|r| &r.resource)
            .collect();
        let mut out = Vec::new();
        for queue in named
            .into_iter()
            .filter_map(|arn| self.stack_of(arn, catalog))
        {
            let functions = functions_of(&queue.template);
            let lookup = PolicyLookup {
                stack: &queue.stack,
                accounts: &catalog.accounts,
                functions: &functions,
                imports: &queue.imports,
            };
            out.extend(resource_documents(
                &queue.template,
                &lookup,
                catalog,
                role_arn,
            )?);
        }
        Ok(out)
    }
}

/// The roles a worker stack's request queue policy lets send to it, as the worker stack template
/// (`stepline init`) imports them: `${CoordinatorStack}-<Name>RoleArn` is function `<Name>Function`.
pub fn worker_queue_senders() -> Vec<String> {
    let template = include_str!("../../../cli/templates/template.yaml");
    template
        .split("${CoordinatorStack}-")
        .skip(1)
        .filter_map(|rest| {
            let name = rest.split('"').next()?.strip_suffix("RoleArn")?;
            Some(format!("{name}Function"))
        })
        .fold(Vec::new(), |mut senders, sender| {
            if !senders.contains(&sender) {
                senders.push(sender);
            }
            senders
        })
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Checker({})", self.principal.function)
    }
}

/// An allowed read of an object the function could not list: if S3 answers 404, AWS would answer
/// 403 (without s3:ListBucket on the bucket, S3 does not tell whether a key exists).
#[derive(Debug, Clone)]
pub(crate) struct ReadWithoutList(pub(crate) Denial);

impl Storable for ReadWithoutList {
    type Storer = StoreReplace<Self>;
}

impl Checker {
    pub fn new(
        principal: Arc<Principal>,
        catalog: Arc<Catalog>,
        denials: Arc<Mutex<Vec<Denial>>>,
    ) -> Self {
        Self {
            principal,
            catalog,
            denials,
            worker_queues: Arc::default(),
        }
    }

    /// This checker, taking queues outside the template for worker stacks' (see [`WorkerQueues`]).
    pub fn with_worker_queues(mut self, worker_queues: Arc<WorkerQueues>) -> Self {
        self.worker_queues = worker_queues;
        self
    }

    pub(crate) fn denial(&self, request: Option<&Request>, reason: String) -> Denial {
        Denial {
            function: self.principal.function.clone(),
            action: request.map_or_else(|| "?".into(), |r| r.action.clone()),
            resource: request.map_or_else(|| "?".into(), |r| r.resource.clone()),
            keys: request.map_or_else(Vec::new, |r| r.context.service_keys()),
            reason,
        }
    }

    /// Decides a call: `Err` with the denial when AWS would deny it; `Ok(Some)` for an object read
    /// whose 404 AWS would turn into a 403.
    pub fn check(&self, call: &HttpCall) -> Result<Option<Denial>, Denial> {
        let requests = requests_of(call, &self.catalog)
            .map_err(|why| self.denial(None, format!("unrecognised call: {why}")))?;
        if requests.is_empty() {
            return Err(self.denial(None, "unrecognised call: it names nothing".into()));
        }
        let attached = self
            .worker_queues
            .documents(&requests, &self.catalog, &self.principal.role_arn)
            .map_err(|e| self.denial(None, format!("a worker stack's queue policy: {e:#}")))?;
        let with_attached;
        let principal = if attached.is_empty() {
            &*self.principal
        } else {
            with_attached = self
                .principal
                .with_resources(attached)
                .map_err(|e| self.denial(None, format!("attached policies: {e:#}")))?;
            &with_attached
        };
        for request in &requests {
            match evaluate(principal, request) {
                Ok(Decision::Allowed) => {}
                Ok(decision) => return Err(self.denial(Some(request), decision.reason())),
                Err(e) => return Err(self.denial(Some(request), format!("cannot evaluate: {e}"))),
            }
        }
        let read = requests.iter().find(|r| r.action == "s3:GetObject");
        Ok(read.and_then(|read| {
            let (bucket, _) = read.resource.split_once('/')?;
            let list = Request::new("s3:ListBucket", bucket, requests_base(read));
            match evaluate(principal, &list) {
                Ok(Decision::Allowed) => None,
                _ => Some(self.denial(
                    Some(read),
                    format!(
                        "the object does not exist, and without s3:ListBucket on {bucket} AWS answers \
                         403 AccessDenied, not 404 NoSuchKey"
                    ),
                )),
            }
        }))
    }

    pub(crate) fn record(&self, denial: Denial) -> BoxError {
        tracing::error!(
            function = %denial.function,
            action = %denial.action,
            resource = %denial.resource,
            keys = ?denial.keys,
            reason = %denial.reason,
            "IAM: AWS would deny this call"
        );
        let message = denial.to_string();
        self.denials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(denial);
        message.into()
    }
}

/// The global keys of a request (for a derived request on the same call).
pub(crate) fn requests_base(request: &Request) -> Context {
    let mut context = request.context.clone();
    context.values.retain(|k, _| k.starts_with("aws:"));
    context.modelled.retain(|k| k.starts_with("aws:"));
    context
}

impl crate::observe::Observer for Checker {
    fn name(&self) -> &'static str {
        "stepline-iam-check"
    }

    fn request(&self, call: HttpCall, bag: &mut ConfigBag) -> Result<(), BoxError> {
        match self.check(&call) {
            Ok(read) => {
                bag.interceptor_state()
                    .store_or_unset(read.map(ReadWithoutList));
                Ok(())
            }
            Err(denial) => Err(self.record(denial)),
        }
    }

    fn response(&self, status: u16, bag: &mut ConfigBag) -> Result<(), BoxError> {
        if status == 404 {
            if let Some(ReadWithoutList(denial)) = bag.load::<ReadWithoutList>() {
                return Err(self.record(denial.clone()));
            }
        }
        Ok(())
    }
}

/// `clients`, each with `checker` on every request (after the interceptors they carry already).
pub fn checked_clients(clients: &Clients, checker: &Checker) -> Clients {
    crate::observe::observed_clients(clients, checker.clone())
}

// ---------------------------------------------------------------------------------------- a stage

/// IAM checking of a stage: each function's principal, what requests name, and the denials seen.
#[derive(Debug)]
pub struct StageIam {
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) principals: BTreeMap<String, Arc<Principal>>,
    pub(crate) denials: Arc<Mutex<Vec<Denial>>>,
    pub(crate) worker_queues: Arc<WorkerQueues>,
    pub(crate) template: Template,
    pub(crate) stack: Stack,
}

/// A worker stack as `stepline init` writes it, deployed beside a stage.
pub struct WorkerStack {
    /// What checks its worker function's calls.
    pub checker: Checker,
    /// The environment that stack gives its worker function.
    pub env: BTreeMap<String, String>,
}

impl StageIam {
    /// Every function's policies of `template`, resolved on `stack` (an error names what cannot be).
    pub fn new(template: &Template, stack: &Stack) -> Result<Self> {
        let accounts = Accounts::of_stack(stack)?;
        let catalog = Arc::new(Catalog::new(template, stack, accounts)?);
        let mut principals = BTreeMap::new();
        for (logical, kind, _) in template.resources() {
            if kind == "AWS::Serverless::Function" {
                let principal = Principal::of_function(template, stack, &catalog, &logical)
                    .with_context(|| format!("IAM policies of {logical}"))?;
                principals.insert(logical, Arc::new(principal));
            }
        }
        Ok(Self {
            catalog,
            principals,
            denials: Arc::default(),
            worker_queues: Arc::default(),
            template: template.clone(),
            stack: stack.clone(),
        })
    }

    /// The worker stack `stepline init` writes, as if deployed for `request_queue` and its `dlq`
    /// (queues made outside the template), serving `release` of this stage's coordinator: its worker
    /// function's policies (the coordinator's exports imported) with the stack's and this stage's
    /// resource policies (the payload bucket's), and the environment it gives that function.
    pub fn worker_stack(
        &self,
        request_queue: &Physical,
        dlq: &Physical,
        release: &str,
    ) -> Result<WorkerStack> {
        let queue = self.worker_queue(request_queue, dlq, release)?;
        let (template, stack, imports) = (&queue.template, &queue.stack, &queue.imports);
        self.adopt(request_queue, queue.clone())?;
        let accounts = &self.catalog.accounts;
        let function = "WorkerFunction";
        let principal =
            Principal::of_function_importing(template, stack, &self.catalog, function, imports)
                .context("the worker stack's function")?;
        // The coordinator stack's resource policies (the payload bucket's) govern the worker too.
        let functions = functions_of(&self.template);
        let none = BTreeMap::new();
        let lookup = PolicyLookup {
            stack: &self.stack,
            accounts,
            functions: &functions,
            imports: &none,
        };
        let stage_policies =
            resource_documents(&self.template, &lookup, &self.catalog, &principal.role_arn)?;
        let principal = principal.with_resources(stage_policies)?;
        let functions = functions_of(template);
        let lookup = PolicyLookup {
            stack,
            accounts,
            functions: &functions,
            imports,
        };
        let variables = template.root["Resources"][function]["Properties"]["Environment"]
            ["Variables"]
            .as_mapping()
            .cloned()
            .unwrap_or_default();
        let mut env = BTreeMap::new();
        for (key, value) in &variables {
            let key = scalar(key).ok_or_else(|| anyhow!("a variable's name: {key:?}"))?;
            let value = resolve(value, &lookup).with_context(|| format!("{function} {key}"))?;
            env.insert(key, value);
        }
        Ok(WorkerStack {
            checker: Checker::new(
                Arc::new(principal),
                self.catalog.clone(),
                self.denials.clone(),
            )
            .with_worker_queues(self.worker_queues.clone()),
            env,
        })
    }

    /// Takes `request_queue` (made outside the template) for the request queue of a worker stack
    /// that `stepline init` wrote, serving release 1: from now on the queue policy that stack gives
    /// it governs calls on it. A queue outside the template that was not adopted has no policy.
    pub fn adopt_worker_queue(&self, request_queue: &Physical) -> Result<()> {
        let Physical::Queue { name, url, arn } = request_queue else {
            bail!("a worker stack's request queue is a queue: {request_queue:?}");
        };
        let dlq = Physical::Queue {
            name: format!("{name}-dlq"),
            url: format!("{url}-dlq"),
            arn: format!("{arn}-dlq"),
        };
        let queue = self.worker_queue(request_queue, &dlq, "1")?;
        self.adopt(request_queue, queue)
    }

    /// Takes every queue of the stage's account outside the template for a worker stack's request
    /// queue (see [`WorkerQueues`]): for a process that serves workers it is not told of.
    pub fn take_outside_queues_as_worker_stacks(&self) -> Result<()> {
        let account = &self.catalog.accounts.home("sqs").account;
        let placeholder = |name: &str| Physical::Queue {
            url: format!("https://sqs.local/{account}/{name}"),
            arn: format!("arn:aws:sqs:local:{account}:{name}"),
            name: name.into(),
        };
        let queue = self.worker_queue(
            &placeholder("worker-requests"),
            &placeholder("worker-requests-dlq"),
            "1",
        )?;
        self.worker_queues.take_any_in_account(queue);
        Ok(())
    }

    fn adopt(&self, request_queue: &Physical, queue: WorkerQueue) -> Result<()> {
        let Physical::Queue { url, .. } = request_queue else {
            bail!("a worker stack's request queue is a queue: {request_queue:?}");
        };
        // Keyed as requests name it (their queue URL read by the catalog).
        let arn = self.catalog.queue_arn(url).map_err(|e| anyhow!(e))?;
        self.worker_queues.adopt(arn, queue);
        Ok(())
    }

    /// The worker stack `stepline init` writes, as deployed for `request_queue` and `dlq` to serve
    /// `release` of this stage's coordinator: its template, its resources and the coordinator's
    /// exports it imports.
    fn worker_queue(
        &self,
        request_queue: &Physical,
        dlq: &Physical,
        release: &str,
    ) -> Result<WorkerQueue> {
        let Physical::Queue { name, .. } = request_queue else {
            bail!("a worker stack's request queue is a queue: {request_queue:?}");
        };
        let template = worker_stack_template("worker")?;
        let coordinator = self
            .stack
            .parameter("AWS::StackName")
            .ok_or_else(|| anyhow!("the stage has no stack name"))?;
        let parameters = BTreeMap::from([
            ("CoordinatorStack".to_string(), coordinator),
            ("ReleaseVersion".to_string(), release.to_string()),
            ("RequestQueueName".to_string(), name.clone()),
            ("OperatorRoleArn".to_string(), "none".to_string()),
        ]);
        let stack = Stack {
            stage: self.stack.stage.clone(),
            parameters,
            resources: BTreeMap::from([
                ("RequestQueue".to_string(), request_queue.clone()),
                ("RequestDeadLetterQueue".to_string(), dlq.clone()),
            ]),
            functions: BTreeMap::new(),
        };
        let imports = exports_of(&self.template, &self.stack, &self.catalog.accounts);
        Ok(WorkerQueue {
            template,
            stack,
            imports,
        })
    }

    /// The interceptor for `function`'s clients.
    pub fn checker(&self, function: &str) -> Result<Checker> {
        let principal = self
            .principals
            .get(function)
            .ok_or_else(|| anyhow!("the template has no function {function}"))?;
        Ok(Checker::new(
            principal.clone(),
            self.catalog.clone(),
            self.denials.clone(),
        )
        .with_worker_queues(self.worker_queues.clone()))
    }

    pub fn denials(&self) -> Vec<Denial> {
        self.denials
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn take_denials(&self) -> Vec<Denial> {
        std::mem::take(&mut *self.denials.lock().unwrap_or_else(|e| e.into_inner()))
    }
}
