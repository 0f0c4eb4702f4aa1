//! Release use cases: register an immutable release, activate one, roll back to the one before. The
//! API, the operator CLI and the local stack all go through these.

use std::sync::Arc;

use super::{Coordinator, CoordinatorError};
use crate::domain::release::{self, Activation, Release, WorkerHealth, WorkerRecord};
use crate::envelope::WorkerAnnouncement;
use crate::ports::{ActivationRequest, Registration, StoreError};

/// How long a process trusts the workers it read for a pipeline before reading them again (one
/// registry Query per pipeline per process and period, not per submission).
pub const WORKERS_CACHED: std::time::Duration = std::time::Duration::from_secs(30);

impl Coordinator {
    /// Registers an immutable release after checking it against its definition. Registering the
    /// identical release again is `Unchanged`; another descriptor under the same version is refused.
    pub async fn register_release(
        &self,
        release: &Release,
    ) -> Result<Registration, CoordinatorError> {
        release
            .validate()
            .map_err(CoordinatorError::InvalidRelease)?;
        let registration = self.registry.register(release).await.map_err(|e| match e {
            StoreError::Conflict => CoordinatorError::ReleaseConflict {
                pipeline_id: release.pipeline_id.clone(),
                release_version: release.release_version.clone(),
            },
            other => other.into(),
        })?;
        tracing::info!(pipeline = %release.pipeline_id, release = %release.release_version, ?registration, "release registered");
        Ok(registration)
    }

    /// Makes a registered release the one new executions of its pipeline are pinned to (appended to
    /// the activation history, with the operator's reason).
    pub async fn activate_release(
        &self,
        pipeline_id: &str,
        release_version: &str,
        reason: &str,
    ) -> Result<Activation, CoordinatorError> {
        super::requests::require_reason(reason, "an activation")?;
        let activation = self
            .registry
            .activate(ActivationRequest {
                pipeline_id,
                release_version,
                at: self.now(),
                reason,
            })
            .await
            .map_err(|e| match e {
                StoreError::Missing(_) => CoordinatorError::UnknownRelease {
                    pipeline_id: pipeline_id.to_string(),
                    release_version: release_version.to_string(),
                },
                // The registry re-reads and retries lost appends itself; still losing is contention.
                StoreError::Conflict => CoordinatorError::Contention(1),
                other => other.into(),
            })?;
        tracing::info!(pipeline = pipeline_id, release = %activation.release_version, sequence = activation.sequence, "release activated");
        // Best effort: the activation stands either way.
        for warning in self
            .release_warnings(pipeline_id, release_version)
            .await
            .unwrap_or_default()
        {
            tracing::warn!(
                pipeline = pipeline_id,
                release = release_version,
                "{warning}"
            );
        }
        Ok(activation)
    }

    /// Activates the release that was active before the current one.
    pub async fn roll_back_release(
        &self,
        pipeline_id: &str,
        reason: &str,
    ) -> Result<Activation, CoordinatorError> {
        let history = self.registry.history(pipeline_id).await?;
        let current = history.last().map(|a| a.release_version.clone());
        let previous = history
            .iter()
            .rev()
            .map(|a| a.release_version.clone())
            .find(|r| Some(r) != current.as_ref())
            .ok_or_else(|| {
                CoordinatorError::Invalid(format!(
                    "pipeline {pipeline_id} has no earlier release to roll back to"
                ))
            })?;
        self.activate_release(pipeline_id, &previous, reason).await
    }

    /// Registers a release and activates it only if its pipeline has none active yet: which release is
    /// active is the operator's choice once there is one (a restarted local stack must not roll it back).
    pub async fn release_unless_active(
        &self,
        release: &Release,
        reason: &str,
    ) -> Result<Registration, CoordinatorError> {
        let registration = self.register_release(release).await?;
        if self.registry.active(&release.pipeline_id).await?.is_none() {
            self.activate_release(&release.pipeline_id, &release.release_version, reason)
                .await?;
        }
        Ok(registration)
    }

    /// The active release of a pipeline.
    pub async fn active_release(&self, pipeline_id: &str) -> Result<Activation, CoordinatorError> {
        self.registry
            .active(pipeline_id)
            .await?
            .ok_or_else(|| CoordinatorError::NoActiveRelease(pipeline_id.to_string()))
    }

    /// Records a worker's announcement, as received now.
    pub async fn announce_worker(
        &self,
        announcement: &WorkerAnnouncement,
    ) -> Result<(), CoordinatorError> {
        let identity = &announcement.identity;
        if announcement.worker_id.is_empty()
            || identity.pipeline_id.is_empty()
            || identity.release_version.is_empty()
        {
            return Err(CoordinatorError::Invalid(
                "a worker announcement names its worker, pipeline and release".into(),
            ));
        }
        let record = WorkerRecord {
            worker_id: announcement.worker_id.clone(),
            pipeline_id: identity.pipeline_id.clone(),
            contract_version: identity.contract_version.clone(),
            release_version: identity.release_version.clone(),
            queue: announcement.queue.clone(),
            state: announcement.state,
            seen_at: self.now(),
        };
        self.registry.announce(&record).await?;
        tracing::info!(worker = %record.worker_id, pipeline = %record.pipeline_id, release = %record.release_version, state = ?record.state, "worker announced");
        Ok(())
    }

    /// A pipeline's workers as last heard of, with their health now.
    pub async fn workers(
        &self,
        pipeline_id: &str,
    ) -> Result<Vec<(WorkerRecord, WorkerHealth)>, CoordinatorError> {
        let now = self.now();
        let mut workers = self.registry.workers(pipeline_id).await?;
        workers.sort_by(|a, b| {
            (&a.release_version, &a.worker_id).cmp(&(&b.release_version, &b.worker_id))
        });
        Ok(workers
            .into_iter()
            .map(|w| {
                let health = w.health(now);
                (w, health)
            })
            .collect())
    }

    /// What an operator should know about a release about to run: no live worker serving it.
    pub async fn release_warnings(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Vec<String>, CoordinatorError> {
        let workers = self.registry.workers(pipeline_id).await?;
        if release::served(&workers, release_version, self.now()) {
            return Ok(Vec::new());
        }
        Ok(vec![format!(
            "no live worker serves {pipeline_id} release {release_version}: its executions wait \
             until one announces itself (workers announce themselves when they start)"
        )])
    }

    /// Refuses a submission pinned to a release whose workers all drain (read at most every
    /// [`WORKERS_CACHED`] per pipeline).
    pub(super) async fn refuse_draining(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<(), CoordinatorError> {
        let now = self.now();
        let cached = self
            .workers
            .lock()
            .expect("workers")
            .get(pipeline_id)
            .filter(|(read_at, _)| now.since(*read_at) < WORKERS_CACHED)
            .map(|(_, workers)| workers.clone());
        let workers = match cached {
            Some(workers) => workers,
            None => {
                let workers = Arc::new(self.registry.workers(pipeline_id).await?);
                self.workers
                    .lock()
                    .expect("workers")
                    .insert(pipeline_id.to_string(), (now, workers.clone()));
                workers
            }
        };
        if release::all_draining(&workers, release_version, now) {
            return Err(CoordinatorError::ReleaseDraining {
                pipeline_id: pipeline_id.to_string(),
                release_version: release_version.to_string(),
            });
        }
        Ok(())
    }
}
