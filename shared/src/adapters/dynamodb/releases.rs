//! The release registry: releases, activations and workers' announcements, in the release table.

use super::*;

/// Release registry: under `pk = "pipeline#<id>"`, `sk = "release#<version>"` holds an immutable
/// release descriptor and `sk = "activation#<sequence, zero-padded>"` the append-only activations (each
/// written once, conditionally); the highest sequence is the active release. Under
/// `pk = "workers#<id>"`, `sk = "worker#<worker id>"` holds a worker's latest announcement (written
/// only over an older one; expired a week after it): a partition of its own, so that the completion
/// function, which records announcements, may write there and nowhere else of the table (IAM's
/// `dynamodb:LeadingKeys`).
#[derive(Clone)]
pub struct DynamoDbReleaseRegistry {
    client: Client,
    table: String,
}

const RELEASE_PREFIX: &str = "release#";
const ACTIVATION_PREFIX: &str = "activation#";
const WORKER_PREFIX: &str = "worker#";
/// A worker's item expires (table TTL) a week after its latest announcement.
const WORKER_RETENTION_SECS: i64 = 7 * 24 * 3600;

impl DynamoDbReleaseRegistry {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    fn pipeline_key(pipeline_id: &str) -> AttributeValue {
        s(format!("pipeline#{pipeline_id}"))
    }

    fn workers_key(pipeline_id: &str) -> AttributeValue {
        s(format!("workers#{pipeline_id}"))
    }

    /// The `body` attributes (JSON text) of the items under `prefix`, in sort-key order.
    async fn query<T: serde::de::DeserializeOwned>(
        &self,
        partition: AttributeValue,
        prefix: &str,
        newest_first_one: bool,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("pk = :pk AND begins_with(sk, :prefix)")
                .expression_attribute_values(":pk", partition.clone())
                .expression_attribute_values(":prefix", s(prefix))
                .consistent_read(true)
                .scan_index_forward(!newest_first_one)
                .set_limit(newest_first_one.then_some(1))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(classify)?;
            for item in page.items() {
                if let Some(AttributeValue::S(text)) = item.get("body") {
                    out.push(
                        serde_json::from_str(text)
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    );
                }
            }
            start = page.last_evaluated_key;
            if start.is_none() || newest_first_one {
                return Ok(out);
            }
        }
    }

    async fn put_new(&self, pipeline_id: &str, sk: String, body: String) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .item(PK, Self::pipeline_key(pipeline_id))
            .item(SK, s(sk))
            .item("body", s(body))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }
}

#[async_trait]
impl ReleaseRegistry for DynamoDbReleaseRegistry {
    async fn get(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Option<Release>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, Self::pipeline_key(pipeline_id))
            .key(SK, s(format!("{RELEASE_PREFIX}{release_version}")))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        match out.item.as_ref().and_then(|i| i.get("body")) {
            Some(AttributeValue::S(text)) => serde_json::from_str(text)
                .map(Some)
                .map_err(|e| StoreError::Corrupt(e.to_string())),
            _ => Ok(None),
        }
    }

    async fn list(&self, pipeline_id: &str) -> Result<Vec<Release>, StoreError> {
        self.query(Self::pipeline_key(pipeline_id), RELEASE_PREFIX, false)
            .await
    }

    async fn register(&self, release: &Release) -> Result<Registration, StoreError> {
        let body =
            serde_json::to_string(release).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let sk = format!("{RELEASE_PREFIX}{}", release.release_version);
        match self.put_new(&release.pipeline_id, sk, body).await {
            Ok(()) => Ok(Registration::Created),
            Err(StoreError::Conflict) => {
                match self
                    .get(&release.pipeline_id, &release.release_version)
                    .await?
                {
                    Some(existing) if &existing == release => Ok(Registration::Unchanged),
                    _ => Err(StoreError::Conflict),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn append_activation(
        &self,
        request: ActivationRequest<'_>,
    ) -> Result<Activation, StoreError> {
        // Append at the next sequence; a concurrent activation taking it makes us retry on top.
        for _ in 0..5 {
            let pipeline_id = request.pipeline_id;
            let latest = self.active(pipeline_id).await?;
            let activation = request.at_sequence(latest.map_or(1, |a| a.sequence + 1));
            let body = serde_json::to_string(&activation).expect("activation serializes");
            let sk = format!("{ACTIVATION_PREFIX}{:012}", activation.sequence);
            match self.put_new(pipeline_id, sk, body).await {
                Ok(()) => return Ok(activation),
                Err(StoreError::Conflict) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict)
    }

    async fn history(&self, pipeline_id: &str) -> Result<Vec<Activation>, StoreError> {
        self.query(Self::pipeline_key(pipeline_id), ACTIVATION_PREFIX, false)
            .await
    }

    async fn active(&self, pipeline_id: &str) -> Result<Option<Activation>, StoreError> {
        Ok(self
            .query(Self::pipeline_key(pipeline_id), ACTIVATION_PREFIX, true)
            .await?
            .into_iter()
            .next())
    }

    async fn announce(&self, worker: &WorkerRecord) -> Result<(), StoreError> {
        let body = serde_json::to_string(worker).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let draining = worker.state == WorkerState::Draining;
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, Self::workers_key(&worker.pipeline_id))
            .item(SK, s(format!("{WORKER_PREFIX}{}", worker.worker_id)))
            .item("body", s(body))
            .item("draining", AttributeValue::Bool(draining))
            .item("seenAt", at(worker.seen_at))
            .item(
                "expiresAt",
                n(worker.seen_at.seconds() + WORKER_RETENTION_SECS),
            );
        // The latest word of a worker replaces an older one, whatever either says: a drain is
        // evidence only until the worker is heard again.
        let written = put
            .condition_expression("attribute_not_exists(pk) OR seenAt <= :seen")
            .expression_attribute_values(":seen", at(worker.seen_at))
            .send()
            .await
            .map_err(classify);
        match written {
            // A later announcement is recorded already.
            Ok(_) | Err(StoreError::Conflict) => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn workers(&self, pipeline_id: &str) -> Result<Vec<WorkerRecord>, StoreError> {
        self.query(Self::workers_key(pipeline_id), WORKER_PREFIX, false)
            .await
    }
}
