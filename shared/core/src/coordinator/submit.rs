//! Submitting an execution: the release it is pinned to, its id (idempotent on its key, or a fan-out
//! child's), its parent link checked, its record created and its first request staged.

use super::*;

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

/// Submissions of one `submit_many` decided at a time.
const SUBMIT_CONCURRENCY: usize = 16;

impl Coordinator {
    /// Starts a new execution pinned to the requested (or active) release and enqueues its first launch.
    pub async fn submit(&self, request: SubmitRequest) -> Result<Submitted, CoordinatorError> {
        let mut results = self.submit_many(vec![request]).await;
        results.pop().expect("one result per request")
    }

    /// Submits many executions at once, each on its own (its own idempotency key, its own result,
    /// in order): the first requests of all of them go out together, batched per queue. One that is
    /// refused loses none of the others.
    pub async fn submit_many(
        &self,
        requests: Vec<SubmitRequest>,
    ) -> Vec<Result<Submitted, CoordinatorError>> {
        use futures_util::stream::{self, StreamExt};
        let keys = self.seal_keys().await;
        let keys = &keys;
        // Decided and committed a few at a time, each into its own outbox, merged in order.
        let decided: Vec<_> = stream::iter(requests.into_iter().enumerate())
            .map(|(index, request)| async move {
                let mut outbox = Outbox::sealing_with(keys.clone());
                let result = self.submit_into(&mut outbox, index, request).await;
                (result, outbox)
            })
            .buffered(SUBMIT_CONCURRENCY)
            .collect()
            .await;
        let mut outbox = Outbox::sealing_with(keys.clone());
        let mut results = Vec::with_capacity(decided.len());
        for (result, staged) in decided {
            results.push(result);
            outbox.extend(staged);
        }
        self.flush(outbox).await;
        results
    }

    /// `submit`, staging the first request (or the request of a duplicate that may not have gone
    /// out) in `outbox`.
    pub(super) async fn submit_into(
        &self,
        outbox: &mut Outbox,
        source: usize,
        request: SubmitRequest,
    ) -> Result<Submitted, CoordinatorError> {
        if request.pipeline_id.is_empty() || request.tenant.is_empty() {
            return Err(CoordinatorError::Invalid(
                "pipelineId and tenant are required".into(),
            ));
        }
        let release = match request.release_version.clone() {
            Some(release) => release,
            None => {
                self.registry
                    .active(&request.pipeline_id)
                    .await?
                    .ok_or_else(|| CoordinatorError::NoActiveRelease(request.pipeline_id.clone()))?
                    .release_version
            }
        };
        let pinned = self.pinned(&request.pipeline_id, &release).await?;
        let request = self.checked_parent(request).await?;
        // A fan-out's child is started whatever its workers announce: its parent waits for it.
        if request.parent.is_none() {
            self.refuse_draining(&request.pipeline_id, &release).await?;
        }
        let definition = &pinned.definition;
        let id = match (&request.parent, &request.idempotency_key) {
            // A fan-out child: its id names parent, step and item, in a namespace of its own.
            (Some(link), _) => domain::fan_out_child_id(
                &request.tenant,
                &request.pipeline_id,
                link.execution_id,
                link.step,
                &link.interaction,
            ),
            (None, Some(key)) => domain::idempotent_id(&request.tenant, &request.pipeline_id, key),
            (None, None) => self.clock.token(),
        };
        let ctx = self.context(Role::Submit);
        let new = NewExecution {
            id,
            tenant: &request.tenant,
            definition,
            contract_version: pinned.contract_version.clone(),
            input: self.claim_checked(id, request.input).await?,
            idempotency_key: request.idempotency_key,
        };
        let (mut record, actions) = domain::start_launched(new, &ctx);
        let parent_link = request.parent.clone();
        record.parent = request.parent;
        match self.store.create(&record).await {
            Ok(()) => {}
            Err(StoreError::Conflict) => {
                let existing = self.get(id).await?;
                if existing.version != record.version || existing.write_id != record.write_id {
                    // Submitted before. If nothing happened since, its first request may not have
                    // gone out (the first submitter may have died before sending): send it again,
                    // under the same launch id, at most once per window.
                    let again = domain::creation_actions(&existing);
                    if !again.is_empty() && self.resend_due(id) {
                        let definition = self
                            .definition(&existing.pipeline_id, &existing.release_version)
                            .await?;
                        self.stage(outbox, &existing, &definition, &again, source);
                    }
                    // A fan-out child its parent starts again (the step's next attempt): the same
                    // child. It answers the new attempt: if it failed it runs again, if it ended
                    // otherwise it tells the parent again, if it runs it answers when it ends.
                    let mut version = existing.version;
                    if let Some(link) = &parent_link {
                        let rejoin = Event::Rejoin {
                            token: link.token.clone(),
                            unit: link.unit,
                        };
                        let applied = self
                            .decide_into(outbox, source, id, &rejoin, Role::FanOut, (false, false))
                            .await?;
                        version = applied.record.version;
                    }
                    return Ok(Submitted {
                        execution: id,
                        duplicate: true,
                        version,
                    });
                }
                // Our own create, whose response was lost: carry on as if it had answered.
            }
            Err(e) => return Err(e.into()),
        }
        self.recent.lock().expect("recent").remember(&record);
        tracing::info!(execution_id = %id, pipeline = %record.pipeline_id, release = %release, "execution submitted");
        self.stage(outbox, &record, definition, &actions, source);
        Ok(Submitted {
            execution: id,
            duplicate: false,
            version: record.version,
        })
    }

    /// `request` with its parent link only if the coordinator made it (a fan-out's child start);
    /// anyone else's link is stripped, and the execution starts as a parentless one. Without the key
    /// to check it, the start waits (a retryable error).
    ///
    /// The link's signature proves it on the spot. A start that waited in its queue across two key
    /// rotations carries a signature no key in use verifies any more; its link is then proven from
    /// the parent's record instead (`proven_by_parent`), so a child is never cut off from the
    /// parent that waits for it.
    async fn checked_parent(
        &self,
        mut request: SubmitRequest,
    ) -> Result<SubmitRequest, CoordinatorError> {
        let Some(link) = &request.parent else {
            return Ok(request);
        };
        let signed = |keys: &SealKeys| {
            keys.all()
                .any(|key| link.is_signed(key, &request.tenant, &request.pipeline_id))
        };
        let Some(keys) = self.seal_keys().await else {
            return Err(StoreError::Unavailable(
                "the coordinator's key, to check a parent link".into(),
            )
            .into());
        };
        // Signed under a key rotated in since this process loaded its keys: checked on fresh ones.
        let signed = signed(&keys)
            || self
                .keys_newer_than(KEYS_RECHECKED)
                .await
                .is_some_and(|keys| signed(&keys));
        if !signed && !self.proven_by_parent(link, &request).await? {
            tracing::warn!(parent = %link.execution_id, pipeline = %request.pipeline_id, "a start event's parent link is not the coordinator's: stripped");
            request.parent = None;
        }
        Ok(request)
    }

    /// Whether this process may re-send `id`'s first request now (it has not in the last
    /// [`RESEND_WINDOW`]), noting that it does.
    fn resend_due(&self, id: Uuid) -> bool {
        let now = self.clock.now();
        let mut resent = self.resent.lock().expect("resent");
        if resent
            .get(&id)
            .is_some_and(|at| now.since(*at) < RESEND_WINDOW)
        {
            return false;
        }
        resent.insert(id, now, 1);
        true
    }

    /// Whether the parent's record proves `link` for a child of `request`'s pipeline and tenant: the
    /// parent waits on that very fan-out attempt (its unresolved await unit is the link's `unit`,
    /// at the link's step, and the item is one of its items), the link's token is the one only the
    /// coordinator derives from the parent's secret for that step and item, the tenant is the
    /// parent's, and the step fans out over this pipeline. So a link proven this way does no more
    /// than the parent's own start of that child would; it needs one read of the parent, made only
    /// for a link no key in use verifies.
    async fn proven_by_parent(
        &self,
        link: &ParentLink,
        request: &SubmitRequest,
    ) -> Result<bool, CoordinatorError> {
        let Some(parent) = self.store.get(link.execution_id).await? else {
            return Ok(false);
        };
        let waits_on_it = parent.status == domain::Status::WaitingExternal
            && parent.step == link.step
            && parent.await_unit.as_ref().is_some_and(|unit| {
                !unit.resolved
                    && unit.step == link.step
                    && link.unit == Some(unit.id)
                    && unit.fan_out.as_ref().is_some_and(|fan_out| {
                        domain::fan_out::item_number(&link.interaction)
                            .is_some_and(|item| item < fan_out.items)
                    })
            });
        let token =
            domain::ids::fan_out_token(&parent.secret, parent.id, link.step, &link.interaction);
        if !waits_on_it
            || parent.secret.is_empty()
            || parent.tenant != request.tenant
            || !domain::crypto::same(token.as_bytes(), link.token.as_bytes())
        {
            return Ok(false);
        }
        let definition = self
            .definition(&parent.pipeline_id, &parent.release_version)
            .await?;
        let step = definition.steps.get(link.step as usize);
        Ok(step.and_then(|s| s.child_pipeline.as_deref()) == Some(request.pipeline_id.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::memory::{
        InMemoryExecutionStore, InMemoryReleaseRegistry, MemoryKeys, RecordingSender,
    };
    use crate::domain::release::Release;
    use crate::domain::{PipelineDef, StepDef};
    use crate::ports::{ActivationRequest, SystemClock};

    fn settings() -> Settings {
        Settings {
            queues: Queues {
                start: Some("start".into()),
                start_dlq: Some("start-dlq".into()),
                ..Queues::named()
            },
            ..Settings::named()
        }
    }

    /// What the processes of a test share: the store, the sealing keys and the queues.
    #[derive(Default)]
    struct Shared {
        store: Arc<InMemoryExecutionStore>,
        keys: Arc<MemoryKeys>,
        sender: Arc<RecordingSender>,
    }

    /// A coordinator over `shared` with two pipelines active: `fan` (a fan-out over its input's
    /// `items`, each a child of `shop`) and `shop` (one task). A fresh process: it loads its keys at
    /// its first use.
    async fn coordinator(shared: &Shared) -> Coordinator {
        let Shared {
            store,
            keys,
            sender,
        } = shared;
        let registry = Arc::new(InMemoryReleaseRegistry::default());
        for def in [
            PipelineDef::new("fan", "1", [StepDef::fan_out("each", "shop")]),
            PipelineDef::new("shop", "1", [StepDef::task("a", "requests")]),
        ] {
            let release = Release::new(def, Vec::new());
            registry.register(&release).await.unwrap();
            let activation = ActivationRequest {
                pipeline_id: &release.pipeline_id,
                release_version: &release.release_version,
                at: Timestamp::EPOCH,
                reason: "test",
            };
            registry.activate(activation).await.unwrap();
        }
        Coordinator::new(
            store.clone(),
            registry,
            sender.clone(),
            Arc::new(SystemClock),
            settings(),
        )
        .with_keys(keys.clone())
    }

    /// The requests sent to the `requests` queue since the last call.
    fn requests(sender: &RecordingSender) -> usize {
        sender
            .drain()
            .iter()
            .filter(|(q, _)| q == "requests")
            .count()
    }

    /// The child starts a fan-out parent sent to the start queue since the last look, as
    /// submissions (what the launch function makes of them).
    fn child_starts(sender: &RecordingSender) -> Vec<SubmitRequest> {
        sender
            .drain()
            .into_iter()
            .filter(|(queue, _)| queue == "start")
            .map(|(_, message)| {
                let event: crate::envelope::StartEvent =
                    serde_json::from_str(&message.body).unwrap();
                SubmitRequest {
                    pipeline_id: event.detail.pipeline_id,
                    tenant: event.detail.tenant,
                    input: event.detail.input,
                    parent: event.detail.parent,
                    ..Default::default()
                }
            })
            .collect()
    }

    #[tokio::test]
    async fn a_duplicate_submission_re_sends_the_first_request_at_most_once_per_window() {
        let shared = Shared::default();
        let first = coordinator(&shared).await;
        let keyed = SubmitRequest {
            idempotency_key: Some("order-1".into()),
            ..submission("shop", None)
        };
        let created = first.submit(keyed.clone()).await.unwrap();
        assert_eq!(requests(&shared.sender), 1);
        // The first duplicate re-sends (the first submitter may have died before sending); a
        // hundred more within the window send nothing more.
        for _ in 0..100 {
            let again = first.submit(keyed.clone()).await.unwrap();
            assert!(again.duplicate);
            assert_eq!(again.execution, created.execution);
        }
        assert_eq!(requests(&shared.sender), 1, "one re-send in the window");
        // Another process re-sends once in its own window.
        let other = coordinator(&shared).await;
        for _ in 0..10 {
            other.submit(keyed.clone()).await.unwrap();
        }
        assert_eq!(requests(&shared.sender), 1);
    }

    fn submission(pipeline: &str, parent: Option<ParentLink>) -> SubmitRequest {
        SubmitRequest {
            pipeline_id: pipeline.into(),
            tenant: "t".into(),
            parent,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_childs_link_signed_under_a_retired_key_is_kept_when_its_parents_record_proves_it() {
        let shared = Shared::default();
        let first = coordinator(&shared).await;
        let parent = SubmitRequest {
            input: serde_json::json!({"items": [{"n": 1}, {"n": 2}]}),
            ..submission("fan", None)
        };
        first.submit(parent).await.unwrap();
        let starts = child_starts(&shared.sender);
        assert_eq!(starts.len(), 2, "the parent fanned out");
        // Two rotations while the children's starts wait in their queue: the key that signed their
        // links is neither current nor previous any more.
        shared.keys.rotate();
        shared.keys.rotate();
        let later = coordinator(&shared).await;
        let link = starts[0].parent.clone().expect("a link");
        let child = later.submit(starts[0].clone()).await.unwrap();
        let child = later.get(child.execution).await.unwrap();
        assert_eq!(
            child.parent,
            Some(link),
            "the child still answers its parent"
        );

        // What the parent's record does not prove is stripped as before: a wrong token, another
        // attempt's unit, an item beyond the fan-out, a child of another pipeline.
        let start = &starts[1];
        let tampered = |change: &dyn Fn(&mut ParentLink)| {
            let mut request = start.clone();
            change(request.parent.as_mut().unwrap());
            request
        };
        let cases = [
            tampered(&|l| l.token = "0".repeat(32)),
            tampered(&|l| l.unit = Some(Uuid::from_u128(7))),
            tampered(&|l| l.unit = None),
            tampered(&|l| l.interaction = crate::domain::fan_out::item_name(2)),
            SubmitRequest {
                pipeline_id: "fan".into(),
                ..start.clone()
            },
        ];
        for (n, request) in cases.into_iter().enumerate() {
            let stranger = later.submit(request).await.unwrap();
            let stranger = later.get(stranger.execution).await.unwrap();
            assert_eq!(stranger.parent, None, "case {n}");
        }
    }
}
