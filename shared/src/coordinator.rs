//! The coordinator service: load a record, `decide`, commit conditionally on the version read, then carry
//! out the decision's actions. The Lambda handlers in `handlers` are thin shells over it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::cache::{byte_budget, json_size, BoundedCache};
use crate::config::CoordinatorConfig;
use crate::domain::{
    self, Action, Context, Decision, Event, Execution, ParentLink, PipelineDef, Rejection, Skip,
    StepKind, Verdict,
};
use crate::envelope::{
    AwaitNotice, DeadLetterEnvelope, Identity, InteractionMessage, LaunchWork, NoticeInteraction,
    RequestEnvelope, RequestHeader, AWAIT_NOTICE_KIND, CANCEL_KIND, DEAD_LETTER_KIND,
    INTERACTION_KIND, REQUEST_KIND,
};
use crate::ports::{
    Backoff, BusEvent, Clock, EventPublisher, ExecutionStore, MessageSender, OutMessage,
    ReleaseRegistry, SendError, StoreError,
};

/// How often a decision is re-made after losing a conditional write before giving up (the message is
/// then retried by its queue, a whole visibility timeout later). Every lost race means another writer
/// committed, so N writers racing on one record are all done within N rounds: this covers a full batch
/// of ten messages on one execution (a parent's children ending together) with the other functions'
/// writes beside it.
const MAX_RACES: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("execution {0} not found")]
    NotFound(Uuid),
    #[error("pipeline {pipeline_id} release {release_version} is not registered")]
    UnknownRelease {
        pipeline_id: String,
        release_version: String,
    },
    #[error("pipeline {0} has no active release")]
    NoActiveRelease(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("gave up after {0} conflicting writes")]
    Contention(u32),
}

impl CoordinatorError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            CoordinatorError::NotFound(_) => "NOT_FOUND",
            CoordinatorError::UnknownRelease { .. } => "UNKNOWN_RELEASE",
            CoordinatorError::NoActiveRelease(_) => "NO_ACTIVE_RELEASE",
            CoordinatorError::Invalid(_) => "INVALID_REQUEST",
            CoordinatorError::Rejected(r) => r.code(),
            CoordinatorError::Store(StoreError::Corrupt(_)) => "CORRUPT_RECORD",
            CoordinatorError::Store(StoreError::Missing(_)) => "NOT_FOUND",
            CoordinatorError::Store(_) => "STORE_UNAVAILABLE",
            CoordinatorError::Contention(_) => "CONTENTION",
        }
    }

    /// Whether the same request may succeed later (the message should be redelivered).
    pub fn is_retryable(&self) -> bool {
        match self {
            CoordinatorError::Store(e) => e.is_retryable(),
            CoordinatorError::Contention(_) => true,
            _ => false,
        }
    }
}

impl From<CoordinatorError> for lambda_runtime::Diagnostic {
    fn from(err: CoordinatorError) -> Self {
        lambda_runtime::Diagnostic {
            error_type: err.code().to_string(),
            error_message: err.to_string(),
        }
    }
}

/// Runtime settings of the coordinator.
#[derive(Debug, Clone)]
pub struct Settings {
    pub launch_queue: String,
    pub reply_queue: String,
    pub execution_dlq: String,
    pub launch_dlq: String,
    pub reply_dlq: String,
    pub await_queue: String,
    /// Where fan-out children are started (none: fan-out steps cannot start children).
    pub start_queue: Option<String>,
    /// The start queue's DLQ.
    pub start_dlq: Option<String>,
    pub lease_ms: i64,
    pub claim_limit: i32,
    /// Identifies this process in lease owners.
    pub instance: String,
}

impl Settings {
    pub fn from_config(config: &CoordinatorConfig) -> Self {
        Self {
            launch_queue: config.launch_queue_url.clone(),
            reply_queue: config.reply_queue_url.clone(),
            execution_dlq: config.execution_dlq_url.clone(),
            launch_dlq: config.launch_dlq_url.clone(),
            reply_dlq: config.reply_dlq_url.clone(),
            await_queue: config.await_queue_url.clone(),
            start_queue: config.start_queue_url.clone(),
            start_dlq: config.start_dlq_url.clone(),
            lease_ms: i64::from(config.lease_seconds) * 1000,
            claim_limit: config.claim_limit,
            instance: Uuid::new_v4().simple().to_string()[..12].to_string(),
        }
    }
}

/// What applying an event did.
#[derive(Debug, Clone)]
pub enum Applied {
    Committed {
        record: Execution,
        actions: Vec<Action>,
        definition: Arc<PipelineDef>,
    },
    Skipped {
        skip: Skip,
        record: Execution,
    },
}

impl Applied {
    pub fn record(&self) -> &Execution {
        match self {
            Applied::Committed { record, .. } | Applied::Skipped { record, .. } => record,
        }
    }
}

/// A new execution's request.
#[derive(Debug, Clone, Default)]
pub struct SubmitRequest {
    pub pipeline_id: String,
    /// Defaults to the pipeline's active release.
    pub release_version: Option<String>,
    pub tenant: String,
    pub input: Value,
    /// Submitting the same key again (same tenant) returns the first execution.
    pub idempotency_key: Option<String>,
    /// For a fan-out child: the parent interaction it completes when it ends.
    pub parent: Option<ParentLink>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Submitted {
    pub execution: Uuid,
    pub duplicate: bool,
    pub version: u64,
}

/// Namespace of execution ids derived from idempotency keys.
const IDEMPOTENCY_NAMESPACE: Uuid = Uuid::from_u128(0x3b0e_91c4_55d2_4f0a_9c7e_1a2b_8d6f_40e1);

pub struct Coordinator {
    store: Arc<dyn ExecutionStore>,
    registry: Arc<dyn ReleaseRegistry>,
    sender: Arc<dyn MessageSender>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    definitions: Mutex<HashMap<(String, String), Arc<PipelineDef>>>,
    publisher: Option<Arc<dyn EventPublisher>>,
    /// Records this process committed last (bounded): the hot path decides on them without a read.
    recent: Mutex<RecentRecords>,
}

/// Records a process committed, oldest evicted first, bounded by count and by bytes (a share of the
/// function's memory: records carry step outputs until the next step consumed them).
struct RecentRecords(BoundedCache<Uuid, Execution>);

/// How many committed records a process keeps for the hot path, at most.
const RECENT_CAPACITY: usize = 1024;

impl Default for RecentRecords {
    fn default() -> Self {
        Self(BoundedCache::new(RECENT_CAPACITY, byte_budget()))
    }
}

impl RecentRecords {
    fn remember(&mut self, record: &Execution) {
        self.0.insert(record.id, record.clone(), json_size(record));
    }

    fn get(&self, id: &Uuid) -> Option<&Execution> {
        self.0.get(id)
    }
}

impl Coordinator {
    pub fn new(
        store: Arc<dyn ExecutionStore>,
        registry: Arc<dyn ReleaseRegistry>,
        sender: Arc<dyn MessageSender>,
        clock: Arc<dyn Clock>,
        settings: Settings,
    ) -> Self {
        Self {
            store,
            registry,
            sender,
            clock,
            settings,
            definitions: Mutex::new(HashMap::new()),
            publisher: None,
            recent: Mutex::new(RecentRecords::default()),
        }
    }

    /// Turns lifecycle events on: recorded in each commit's outbox, published after it.
    pub fn with_publisher(mut self, publisher: Arc<dyn EventPublisher>) -> Self {
        self.publisher = Some(publisher);
        self
    }

    pub fn store(&self) -> &Arc<dyn ExecutionStore> {
        &self.store
    }

    pub fn registry(&self) -> &Arc<dyn ReleaseRegistry> {
        &self.registry
    }

    pub fn sender(&self) -> &Arc<dyn MessageSender> {
        &self.sender
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn context(&self, role: &str) -> Context {
        Context {
            now: self.clock.now_ms(),
            jitter: self.clock.jitter(),
            token: self.clock.token(),
            owner: format!("{role}:{}", self.settings.instance),
            lease_ms: self.settings.lease_ms,
            lifecycle: self.publisher.is_some(),
        }
    }

    /// A pinned definition; immutable once registered, so cached for the life of the process.
    pub async fn definition(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Arc<PipelineDef>, CoordinatorError> {
        let key = (pipeline_id.to_string(), release_version.to_string());
        if let Some(def) = self.definitions.lock().expect("definitions").get(&key) {
            return Ok(def.clone());
        }
        let def = self
            .registry
            .get(pipeline_id, release_version)
            .await?
            .ok_or_else(|| CoordinatorError::UnknownRelease {
                pipeline_id: pipeline_id.to_string(),
                release_version: release_version.to_string(),
            })?
            .definition;
        let def = Arc::new(def);
        self.definitions
            .lock()
            .expect("definitions")
            .insert(key, def.clone());
        Ok(def)
    }

    pub async fn get(&self, id: Uuid) -> Result<Execution, CoordinatorError> {
        self.store
            .get(id)
            .await?
            .ok_or(CoordinatorError::NotFound(id))
    }

    /// Load, decide, commit on the version read; on a lost race, decide again on the fresh record.
    pub async fn apply(
        &self,
        id: Uuid,
        event: &Event,
        role: &str,
    ) -> Result<Applied, CoordinatorError> {
        self.apply_from(id, None, event, role).await
    }

    /// `apply`, starting from `fresh` when the caller just read it.
    async fn apply_from(
        &self,
        id: Uuid,
        mut fresh: Option<Execution>,
        event: &Event,
        role: &str,
    ) -> Result<Applied, CoordinatorError> {
        for _ in 0..MAX_RACES {
            let record = match fresh.take() {
                Some(record) => record,
                None => self.get(id).await?,
            };
            let definition = self
                .definition(&record.pipeline_id, &record.release_version)
                .await?;
            let ctx = self.context(role);
            match domain::decide(&record, &definition, &ctx, event) {
                Decision::Commit {
                    record: next,
                    actions,
                } => match self.commit(&next, record.version).await? {
                    Written::Committed => {
                        observe(&record, &next, &actions);
                        self.recent.lock().expect("recent").remember(&next);
                        return Ok(Applied::Committed {
                            record: *next,
                            actions,
                            definition,
                        });
                    }
                    Written::Lost(current) => fresh = Some(*current),
                },
                Decision::Skip(skip) => return Ok(Applied::Skipped { skip, record }),
                Decision::Reject(rejection) => return Err(rejection.into()),
            }
        }
        Err(CoordinatorError::Contention(MAX_RACES))
    }

    /// A conditional write of `next` over version `expected`. A failed condition is read back: a record
    /// carrying this write's id is this write, applied although its response was lost (the SDK's retry
    /// then met its own version); anything else lost the race to another writer.
    async fn commit(&self, next: &Execution, expected: u64) -> Result<Written, CoordinatorError> {
        match self.store.replace(next, expected).await {
            Ok(()) => Ok(Written::Committed),
            Err(StoreError::Conflict) => {
                let current = self.get(next.id).await?;
                if current.version == next.version && current.write_id == next.write_id {
                    tracing::info!(execution_id = %next.id, version = next.version, "own write recognised after a lost response");
                    Ok(Written::Committed)
                } else {
                    Ok(Written::Lost(Box::new(current)))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `apply` for the hot path (a worker's reply): when this process committed the record last, decide
    /// on that copy and write conditionally on its version, with no read first (one sequential call
    /// fewer). Only a commit is trusted that way: the condition proves the copy was current. A lost
    /// race, or any decision not to write, falls back to `apply` on a fresh read.
    pub async fn apply_hot(
        &self,
        id: Uuid,
        event: &Event,
        role: &str,
    ) -> Result<Applied, CoordinatorError> {
        let cached = self.recent.lock().expect("recent").get(&id).cloned();
        if let Some(record) = cached {
            let definition = self
                .definition(&record.pipeline_id, &record.release_version)
                .await?;
            let ctx = self.context(role);
            if let Decision::Commit {
                record: next,
                actions,
            } = domain::decide(&record, &definition, &ctx, event)
            {
                match self.commit(&next, record.version).await? {
                    Written::Committed => {
                        observe(&record, &next, &actions);
                        self.recent.lock().expect("recent").remember(&next);
                        return Ok(Applied::Committed {
                            record: *next,
                            actions,
                            definition,
                        });
                    }
                    Written::Lost(current) => {
                        return self.apply_from(id, Some(*current), event, role).await
                    }
                }
            }
        }
        self.apply(id, event, role).await
    }

    /// Starts a new execution pinned to the requested (or active) release and enqueues its first launch.
    pub async fn submit(&self, request: SubmitRequest) -> Result<Submitted, CoordinatorError> {
        if request.pipeline_id.is_empty() || request.tenant.is_empty() {
            return Err(CoordinatorError::Invalid(
                "pipelineId and tenant are required".into(),
            ));
        }
        let release = match request.release_version {
            Some(release) => release,
            None => {
                self.registry
                    .active(&request.pipeline_id)
                    .await?
                    .ok_or_else(|| CoordinatorError::NoActiveRelease(request.pipeline_id.clone()))?
                    .release_version
            }
        };
        let definition = self.definition(&request.pipeline_id, &release).await?;
        let id = match &request.idempotency_key {
            Some(key) => Uuid::new_v5(
                &IDEMPOTENCY_NAMESPACE,
                format!("{}/{}/{key}", request.tenant, request.pipeline_id).as_bytes(),
            ),
            None => self.clock.token(),
        };
        let ctx = self.context("submit");
        let (mut record, actions) = domain::start_launched(
            id,
            &request.tenant,
            &definition,
            request.input,
            request.idempotency_key,
            &ctx,
        );
        record.parent = request.parent;
        match self.store.create(&record).await {
            Ok(()) => {}
            Err(StoreError::Conflict) => {
                let existing = self.get(id).await?;
                if existing.version != record.version || existing.write_id != record.write_id {
                    // Submitted before. If nothing happened since, its first request may not have
                    // gone out (the first submitter may have died before sending): send it again,
                    // under the same launch id.
                    let again = domain::creation_actions(&existing);
                    if !again.is_empty() {
                        let definition = self
                            .definition(&existing.pipeline_id, &existing.release_version)
                            .await?;
                        let mut outbox = Outbox::default();
                        self.stage(&mut outbox, &existing, &definition, &again, 0);
                        self.flush(outbox).await;
                    }
                    return Ok(Submitted {
                        execution: id,
                        duplicate: true,
                        version: existing.version,
                    });
                }
                // Our own create, whose response was lost: carry on as if it had answered.
            }
            Err(e) => return Err(e.into()),
        }
        self.recent.lock().expect("recent").remember(&record);
        tracing::info!(execution_id = %id, pipeline = %record.pipeline_id, release = %release, "execution submitted");
        let mut outbox = Outbox::default();
        self.stage(&mut outbox, &record, &definition, &actions, 0);
        self.flush(outbox).await;
        Ok(Submitted {
            execution: id,
            duplicate: false,
            version: record.version,
        })
    }

    /// Turns a committed decision's actions into messages.
    pub fn stage(
        &self,
        outbox: &mut Outbox,
        record: &Execution,
        definition: &PipelineDef,
        actions: &[Action],
        source: usize,
    ) {
        for action in actions {
            match action {
                Action::EnqueueLaunch {
                    generation,
                    token,
                    delay_secs,
                } => {
                    let work = LaunchWork {
                        execution_id: record.id,
                        generation: *generation,
                        token: *token,
                    };
                    outbox.push(
                        &self.settings.launch_queue,
                        source,
                        OutMessage::delayed(
                            serde_json::to_string(&work).expect("launch work serializes"),
                            *delay_secs,
                        ),
                        None,
                    );
                }
                Action::SendRequest {
                    step,
                    attempt,
                    launch_id,
                    deadline,
                } => {
                    let (Some(step_def), Some(input)) =
                        (definition.step(*step), record.step_input(*step))
                    else {
                        tracing::error!(execution_id = %record.id, step, "request without step definition or input");
                        continue;
                    };
                    let header = self.request_header(
                        record,
                        &step_def.id,
                        *step,
                        *attempt,
                        *launch_id,
                        *deadline,
                    );
                    tracing::info!(
                        execution_id = %record.id, tenant = %record.tenant, step = %step_def.id,
                        attempt, launch_id = %launch_id, "step launched"
                    );
                    let envelope = RequestEnvelope {
                        header,
                        payload: input.value(),
                    };
                    outbox.push(
                        &step_def.queue,
                        source,
                        OutMessage::new(
                            serde_json::to_string(&envelope).expect("request serializes"),
                        ),
                        None,
                    );
                }
                Action::NotifyCancel { step, launch_id } => {
                    let Some(step_def) = definition.step(*step) else {
                        continue;
                    };
                    let mut header = self.request_header(
                        record,
                        &step_def.id,
                        *step,
                        record.attempt,
                        *launch_id,
                        record.updated_at,
                    );
                    header.kind = CANCEL_KIND.to_string();
                    let envelope = RequestEnvelope {
                        header,
                        payload: &Value::Null,
                    };
                    outbox.push(
                        &step_def.queue,
                        source,
                        OutMessage::new(
                            serde_json::to_string(&envelope).expect("notice serializes"),
                        ),
                        None,
                    );
                }
                Action::SendAwaitNotice { unit } => {
                    let (Some(await_unit), Some(step_def)) =
                        (record.await_unit.as_ref(), definition.step(record.step))
                    else {
                        tracing::error!(execution_id = %record.id, "await notice without an await unit");
                        continue;
                    };
                    if step_def.kind == StepKind::FanOut {
                        self.stage_children(outbox, record, step_def, await_unit, source);
                        continue;
                    }
                    let notice = AwaitNotice {
                        kind: AWAIT_NOTICE_KIND.to_string(),
                        execution_id: record.id,
                        tenant: record.tenant.clone(),
                        pipeline_id: record.pipeline_id.clone(),
                        release_version: record.release_version.clone(),
                        step_id: step_def.id.clone(),
                        step_index: record.step,
                        await_unit_id: *unit,
                        deadline: await_unit.deadline,
                        interactions: await_unit
                            .interactions
                            .iter()
                            .map(|i| NoticeInteraction {
                                id: i.id.clone(),
                                idempotency_key: i.idempotency_key.clone(),
                                token: i.token.clone(),
                            })
                            .collect(),
                        input: record
                            .step_input(record.step)
                            .map(|p| p.value().clone())
                            .unwrap_or_default(),
                        complete_to: self.settings.await_queue.clone(),
                    };
                    tracing::info!(execution_id = %record.id, step = %step_def.id, await_unit = %unit, "await requested");
                    outbox.push(
                        &step_def.queue,
                        source,
                        OutMessage::new(serde_json::to_string(&notice).expect("notice serializes")),
                        Some((record.id, Event::AwaitNoticeSent { unit: *unit })),
                    );
                }
                Action::NotifyParent => {
                    let Some(parent) = &record.parent else {
                        continue;
                    };
                    let message = InteractionMessage {
                        kind: INTERACTION_KIND.to_string(),
                        execution_id: parent.execution_id,
                        interaction: parent.interaction.clone(),
                        token: parent.token.clone(),
                        verdict: Verdict::Approved,
                        payload: serde_json::json!({
                            "executionId": record.id,
                            "status": record.status,
                            "result": record.result.as_ref().map(|r| r.value().clone()),
                            "error": record.error,
                        }),
                    };
                    outbox.push(
                        &parent.complete_to,
                        source,
                        OutMessage::new(
                            serde_json::to_string(&message).expect("message serializes"),
                        ),
                        Some((record.id, Event::ParentNotified)),
                    );
                }
                Action::PublishEvents => {
                    let events = record
                        .events
                        .iter()
                        .map(|e| BusEvent {
                            detail_type: format!("{:?}", e.kind),
                            detail: serde_json::json!({
                                "eventId": format!("{}/{}", record.id, e.seq),
                                "executionId": record.id,
                                "seq": e.seq,
                                "tenant": record.tenant,
                                "pipelineId": record.pipeline_id,
                                "releaseVersion": record.release_version,
                                "step": e.step,
                                "stepId": e.step.and_then(|k| definition.step(k)).map(|s| s.id.clone()),
                                "code": e.code,
                                "at": e.at,
                            }),
                        })
                        .collect::<Vec<_>>();
                    if let Some(last) = record.events.last() {
                        outbox.events.push((record.id, last.seq, events));
                    }
                }
                Action::SendDeadLetter { id } => {
                    let envelope = DeadLetterEnvelope {
                        kind: DEAD_LETTER_KIND.to_string(),
                        dead_letter_id: *id,
                        execution_id: record.id,
                        tenant: record.tenant.clone(),
                        pipeline_id: record.pipeline_id.clone(),
                        release_version: record.release_version.clone(),
                        status: record.status,
                        step_index: record.step,
                        step_id: definition
                            .step(record.step)
                            .map(|s| s.id.clone())
                            .unwrap_or_default(),
                        attempt: record.attempt,
                        error: record.error.clone(),
                        failed_at: record.updated_at,
                        version: record.version,
                    };
                    tracing::warn!(
                        execution_id = %record.id, tenant = %record.tenant, step = record.step,
                        attempt = record.attempt, code = record.error.as_ref().map(|e| e.code.as_str()).unwrap_or(""),
                        "execution dead-lettered"
                    );
                    outbox.push(
                        &self.settings.execution_dlq,
                        source,
                        OutMessage::new(
                            serde_json::to_string(&envelope).expect("envelope serializes"),
                        ),
                        Some((record.id, Event::DeadLetterSent { id: *id })),
                    );
                }
            }
        }
    }

    /// A fan-out step's children: one StartExecution message per item on the start queue, each with
    /// the interaction it completes. Started idempotently (the message id names parent, step, attempt
    /// and item), so re-sending them after a crash starts nothing twice.
    fn stage_children(
        &self,
        outbox: &mut Outbox,
        record: &Execution,
        step_def: &crate::domain::StepDef,
        await_unit: &crate::domain::AwaitUnit,
        source: usize,
    ) {
        let (Some(start_queue), Some(child)) =
            (&self.settings.start_queue, &step_def.child_pipeline)
        else {
            tracing::error!(execution_id = %record.id, step = %step_def.id, "fan-out without a start queue or child pipeline");
            return;
        };
        let items = record
            .step_input(record.step)
            .and_then(|p| p.value().get("items").and_then(Value::as_array).cloned())
            .unwrap_or_default();
        let count = await_unit.interactions.len();
        for (i, (item, interaction)) in items.iter().zip(&await_unit.interactions).enumerate() {
            let event = serde_json::json!({
                "id": format!("{}/{}", await_unit.id, interaction.id),
                "detail-type": crate::handlers::START_DETAIL_TYPE,
                "source": "stepline",
                "detail": {
                    "pipelineId": child,
                    "tenant": record.tenant,
                    "input": item,
                    "parent": ParentLink {
                        execution_id: record.id,
                        interaction: interaction.id.clone(),
                        token: interaction.token.clone(),
                        complete_to: self.settings.await_queue.clone(),
                    },
                },
            });
            // Marked sent once the last one went out and none of this execution's sends failed.
            let then = (i + 1 == count).then_some((
                record.id,
                Event::AwaitNoticeSent {
                    unit: await_unit.id,
                },
            ));
            outbox.push(
                start_queue,
                source,
                OutMessage::new(event.to_string()),
                then,
            );
        }
        tracing::info!(execution_id = %record.id, step = %step_def.id, children = count, "fan-out started");
    }

    fn request_header(
        &self,
        record: &Execution,
        step_id: &str,
        step: u32,
        attempt: u32,
        launch_id: Uuid,
        deadline: i64,
    ) -> RequestHeader {
        RequestHeader {
            kind: REQUEST_KIND.to_string(),
            identity: Identity {
                pipeline_id: record.pipeline_id.clone(),
                contract_version: record.contract_version.clone(),
                release_version: record.release_version.clone(),
            },
            tenant: record.tenant.clone(),
            execution_id: record.id,
            step_id: step_id.to_string(),
            step_index: step,
            attempt,
            launch_id,
            reply_to: self.settings.reply_queue.clone(),
            deadline,
            reply_token: if record.secret.is_empty() {
                String::new()
            } else {
                domain::reply_token(&record.secret, launch_id)
            },
        }
    }

    /// Sends everything staged, batched per queue, then applies the follow-up event of each message
    /// that went out. A send that fails after its commit is recovered by the sweeper: the committed
    /// record is due at its lease expiry, step deadline or dead-letter check. Returns the failures.
    pub async fn flush(&self, outbox: Outbox) -> Vec<(usize, SendError)> {
        let mut failures = Vec::new();
        let mut follow_ups = Vec::new();
        if let Some(publisher) = &self.publisher {
            let all: Vec<BusEvent> = outbox
                .events
                .iter()
                .flat_map(|(_, _, events)| events.iter().cloned())
                .collect();
            if !all.is_empty() {
                let mut results = publisher.publish(&all).await.into_iter();
                for (execution, through, events) in &outbox.events {
                    // Consume every event's result, so the next execution's line up.
                    let mut ok = true;
                    for _ in events {
                        ok &= results.next().is_some_and(|r| r.is_ok());
                    }
                    if ok {
                        follow_ups.push((*execution, Event::EventsPublished { through: *through }));
                    } else {
                        tracing::warn!(execution_id = %execution, "lifecycle events not published; the sweeper will retry");
                    }
                }
            }
        }
        for (queue, entries) in outbox.by_queue {
            let messages: Vec<OutMessage> = entries.iter().map(|e| e.message.clone()).collect();
            let results = self.sender.send(&queue, &messages).await;
            for (entry, result) in entries.into_iter().zip(results) {
                match result {
                    Ok(()) => follow_ups.extend(entry.then),
                    Err(e) => {
                        tracing::warn!(error = %e, "send failed after commit; the sweeper will recover it");
                        failures.push((entry.source, e));
                    }
                }
            }
        }
        // An await notice may span several messages (a fan-out's children): confirm it only when no
        // send of this flush failed; otherwise the sweeper sends it all again (idempotently).
        if !failures.is_empty() {
            follow_ups.retain(|(_, event)| !matches!(event, Event::AwaitNoticeSent { .. }));
        }
        for (id, event) in follow_ups {
            if let Err(e) = self.apply(id, &event, "outbox").await {
                tracing::warn!(execution_id = %id, code = e.code(), error = %e, "follow-up not recorded; the sweeper will repeat it");
            }
        }
        failures
    }

    /// Applies an event and carries out its actions at once (single-message paths: redrive, cancel).
    pub async fn apply_and_dispatch(
        &self,
        id: Uuid,
        event: &Event,
        role: &str,
    ) -> Result<Applied, CoordinatorError> {
        let applied = self.apply(id, event, role).await?;
        if let Applied::Committed {
            record,
            actions,
            definition,
        } = &applied
        {
            let mut outbox = Outbox::default();
            self.stage(&mut outbox, record, definition, actions, 0);
            self.flush(outbox).await;
        }
        Ok(applied)
    }

    /// One sweep of the due index. Shards are swept from a random one on, page by page (following
    /// `LastEvaluatedKey`), claiming each page's executions a few at a time and sending their launch
    /// work before the next page: a sweep cut short (a failing Query, the invocation's `deadline`,
    /// epoch milliseconds) leaves everything it claimed sent, and the next sweep starts elsewhere, so
    /// every shard gets its turn under any backlog. An execution whose claim cannot succeed is pushed
    /// back in the index with a growing delay instead of holding the head of its shard. A window of
    /// the shards beyond the configured count is swept too, so entries written before the count was
    /// lowered are found and moved (any write puts an entry in its current shard).
    pub async fn claim_due(&self, deadline: Option<i64>) -> Result<ClaimReport, CoordinatorError> {
        let now = self.clock.now_ms();
        let shards = self.store.shards().max(1);
        let first = ((self.clock.jitter() * f64::from(shards)) as u32).min(shards - 1);
        let order = (0..shards)
            .map(|k| (first + k) % shards)
            .chain(stray_shards(shards, now));
        let mut report = ClaimReport::default();
        // The longest page so far: a page is not started unless twice that much time is left.
        let mut longest_page = 0;
        'shards: for shard in order {
            let mut after = None;
            loop {
                let started = self.clock.now_ms();
                let needed = SWEEP_MARGIN_MS.max(2 * longest_page);
                if deadline.is_some_and(|d| started + needed >= d) {
                    report.stopped_early = true;
                    break 'shards;
                }
                let page = match self
                    .store
                    .due(shard, now, self.settings.claim_limit, after)
                    .await
                {
                    Ok(page) => page,
                    Err(e) => {
                        report.failed_queries += 1;
                        tracing::warn!(shard, error = %e, "due-index query failed; the next sweep retries");
                        continue 'shards;
                    }
                };
                report.pages += 1;
                report.due += page.ids.len();
                if shard >= shards {
                    report.stray += page.ids.len();
                }
                self.claim_page(&page.ids, now, &mut report).await;
                longest_page = longest_page.max(self.clock.now_ms() - started);
                match page.next {
                    Some(cursor) => after = Some(cursor),
                    None => break,
                }
            }
        }
        if report.deferred > 0 {
            crate::metrics::emit(
                crate::metrics::Metric::ClaimsDeferred,
                report.deferred as f64,
                "",
                now,
            );
        }
        Ok(report)
    }

    /// Claims one page of due executions (bounded concurrency) and sends what the claims staged.
    async fn claim_page(&self, ids: &[Uuid], now: i64, report: &mut ClaimReport) {
        use futures_util::stream::{self, StreamExt};
        let results: Vec<(Uuid, Result<Applied, CoordinatorError>)> =
            stream::iter(ids.iter().copied())
                .map(|id| async move { (id, self.apply(id, &Event::Claim, "claim").await) })
                .buffer_unordered(CLAIM_CONCURRENCY)
                .collect()
                .await;
        let mut outbox = Outbox::default();
        for (id, result) in results {
            match result {
                Ok(Applied::Committed {
                    record,
                    actions,
                    definition,
                }) => {
                    report.claimed += 1;
                    tracing::info!(execution_id = %id, generation = record.generation, "lease taken");
                    self.stage(&mut outbox, &record, &definition, &actions, 0);
                }
                Ok(Applied::Skipped { .. }) => report.skipped += 1,
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(execution_id = %id, code = e.code(), error = %e, "claim failed");
                    // A transient failure is retried by the next sweep where it stands; one that
                    // will fail again (corrupt item, unknown release, ...) makes way for the rest.
                    if !e.is_retryable() {
                        match self.store.defer(id, now, CLAIM_BACKOFF).await {
                            Ok(Some(until)) => {
                                report.deferred += 1;
                                tracing::error!(execution_id = %id, code = e.code(), until, "claim keeps failing: pushed back in the due index");
                            }
                            Ok(None) => {}
                            Err(e) => {
                                tracing::warn!(execution_id = %id, error = %e, "claim failure not deferred")
                            }
                        }
                    }
                }
            }
        }
        self.flush(outbox).await;
    }
}

/// Claims of one page made at once: enough to hide the store's latency, few enough to stay far from
/// a partition's write limit and the function's memory.
const CLAIM_CONCURRENCY: usize = 16;
/// A sweep starts no page with less than this (or twice its longest page so far) left before its
/// invocation's deadline: every page it starts is claimed and sent in time.
const SWEEP_MARGIN_MS: i64 = 1_500;
/// Failing claims are pushed back 30 s, doubling per failure, up to an hour.
const CLAIM_BACKOFF: Backoff = Backoff {
    base_ms: 30_000,
    max_ms: 3_600_000,
};
/// The largest shard count the template allows: entries may sit in any shard below it.
pub const MAX_DUE_SHARDS: u32 = 1024;
/// Shards beyond the configured count swept per sweep: the ones just above it (where a lowered count
/// leaves its entries), and as many more rotating through the rest.
const STRAY_SHARDS_PER_SWEEP: u32 = 16;

/// The shards at or above `shards` this sweep visits: the `STRAY_SHARDS_PER_SWEEP` just above, every
/// sweep, and a window of as many beyond those that moves on every minute, so the whole range up to
/// `MAX_DUE_SHARDS` is covered within `MAX_DUE_SHARDS / STRAY_SHARDS_PER_SWEEP` minutes. An empty
/// Query costs half a read unit.
fn stray_shards(shards: u32, now: i64) -> impl Iterator<Item = u32> {
    let near_end = shards
        .saturating_add(STRAY_SHARDS_PER_SWEEP)
        .min(MAX_DUE_SHARDS);
    let far = MAX_DUE_SHARDS.saturating_sub(near_end);
    let window = STRAY_SHARDS_PER_SWEEP.min(far);
    let offset = if far == 0 {
        0
    } else {
        ((now / 60_000) as u64 * u64::from(window) % u64::from(far)) as u32
    };
    (shards..near_end).chain((0..window).map(move |k| near_end + (offset + k) % far))
}

#[cfg(test)]
mod stray_tests {
    use super::*;

    #[test]
    fn stray_shards_cover_the_whole_range_above_the_count() {
        for shards in [1, 4, 16, 1000] {
            let mut seen = std::collections::BTreeSet::new();
            for minute in 0..(i64::from(MAX_DUE_SHARDS) / i64::from(STRAY_SHARDS_PER_SWEEP) + 1) {
                let visited: Vec<u32> = stray_shards(shards, minute * 60_000).collect();
                assert!(visited.iter().all(|s| *s >= shards && *s < MAX_DUE_SHARDS));
                assert!(visited.len() <= 2 * STRAY_SHARDS_PER_SWEEP as usize);
                seen.extend(visited);
            }
            assert_eq!(
                seen.len() as u32,
                MAX_DUE_SHARDS - shards,
                "shards {shards}"
            );
        }
        assert_eq!(stray_shards(MAX_DUE_SHARDS, 0).count(), 0);
    }
}

/// Metrics of a committed transition (Embedded Metric Format log lines, inside Lambda).
fn observe(before: &Execution, after: &Execution, actions: &[Action]) {
    use crate::metrics::{emit, Metric};
    let pipeline = after.pipeline_id.as_str();
    let at = after.updated_at;
    let completed = after
        .steps
        .iter()
        .enumerate()
        .filter(|(k, s)| {
            s.status == domain::StepStatus::Succeeded
                && before.steps.get(*k).map(|b| b.status) != Some(domain::StepStatus::Succeeded)
        })
        .count();
    if completed > 0 {
        emit(Metric::StepsCompleted, completed as f64, pipeline, at);
        // The record's previous write launched the step (or recorded its last heartbeat).
        emit(
            Metric::StepLatency,
            (after.updated_at - before.updated_at).max(0) as f64,
            pipeline,
            at,
        );
    }
    if after.status == domain::Status::WaitRetry && before.status != domain::Status::WaitRetry {
        emit(Metric::Retries, 1.0, pipeline, at);
    }
    let dead = actions
        .iter()
        .filter(|a| matches!(a, Action::SendDeadLetter { .. }))
        .count();
    if dead > 0 {
        emit(Metric::DeadLetters, dead as f64, pipeline, at);
    }
    // The sweeper gave up on an outbox (its decision noted the drop in this very write).
    let dropped_now = after
        .incidents
        .last()
        .is_some_and(|i| i.code == domain::machine::EVENTS_DROPPED && i.at == after.updated_at);
    if dropped_now && !before.events.is_empty() && after.events.is_empty() {
        let dropped = before.events.len() as f64;
        emit(Metric::EventsDropped, dropped, pipeline, at);
        emit(Metric::EventsDropped, dropped, "", at);
    }
}

/// How a conditional write ended.
enum Written {
    Committed,
    /// Another writer got there first: the record as it is now.
    Lost(Box<Execution>),
}

/// What a claim run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClaimReport {
    pub due: usize,
    pub claimed: usize,
    pub skipped: usize,
    pub failed: usize,
    /// Failed claims pushed back in the due index.
    pub deferred: usize,
    /// Due entries found in shards beyond the configured count.
    pub stray: usize,
    /// Pages of the due index read.
    pub pages: usize,
    pub failed_queries: usize,
    /// The sweep stopped before its invocation's deadline with shards left.
    pub stopped_early: bool,
}

/// Messages staged during a batch, grouped by destination queue so each queue gets `SendMessageBatch`es.
#[derive(Debug, Default)]
pub struct Outbox {
    by_queue: BTreeMap<String, Vec<Staged>>,
    /// Lifecycle events to publish: (execution, last sequence, events).
    events: Vec<(Uuid, u64, Vec<BusEvent>)>,
}

#[derive(Debug)]
struct Staged {
    /// Index of the message (of the batch being handled) whose decision staged this one.
    source: usize,
    message: OutMessage,
    /// Event to apply once the message is sent.
    then: Option<(Uuid, Event)>,
}

impl Outbox {
    pub fn push(
        &mut self,
        queue: &str,
        source: usize,
        message: OutMessage,
        then: Option<(Uuid, Event)>,
    ) {
        self.by_queue
            .entry(queue.to_string())
            .or_default()
            .push(Staged {
                source,
                message,
                then,
            });
    }

    pub fn is_empty(&self) -> bool {
        self.by_queue.is_empty() && self.events.is_empty()
    }
}
