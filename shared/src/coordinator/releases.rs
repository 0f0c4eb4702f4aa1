//! Release use cases: register an immutable release, activate one, roll back to the one before. The
//! API, the operator CLI and the local stack all go through these.

use super::{Coordinator, CoordinatorError};
use crate::domain::release::{Activation, Release};
use crate::ports::{ActivationRequest, Registration, StoreError};

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
}
