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

impl Coordinator {
    /// Starts a new execution pinned to the requested (or active) release and enqueues its first launch.
    pub async fn submit(&self, request: SubmitRequest) -> Result<Submitted, CoordinatorError> {
        self.seal_keys().await;
        let mut outbox = Outbox::default();
        let submitted = self.submit_into(&mut outbox, 0, request).await?;
        self.flush(outbox).await;
        Ok(submitted)
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
        let ctx = self.context("submit");
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
                    // under the same launch id.
                    let again = domain::creation_actions(&existing);
                    if !again.is_empty() {
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
                            .decide_into(outbox, source, id, &rejoin, "fan-out", (false, false))
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

    /// `request` with its parent link only if the coordinator signed it (a fan-out's child start);
    /// anyone else's link is stripped, and the execution starts as a parentless one. Without the key
    /// to check it, the start waits (a retryable error).
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
                .keys_newer_than(KEYS_RECHECKED_MS)
                .await
                .is_some_and(|keys| signed(&keys));
        if !signed {
            tracing::warn!(parent = %link.execution_id, pipeline = %request.pipeline_id, "a start event's parent link is not the coordinator's: stripped");
            request.parent = None;
        }
        Ok(request)
    }
}
