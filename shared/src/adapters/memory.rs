//! In-memory stand-ins of the ports for unit and simulation tests. They follow the same conditional
//! semantics as the DynamoDB adapters: `create` fails on an existing id, `replace` on a changed version.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use uuid::Uuid;

use crate::adapters::dynamodb::due_shard;
use crate::domain::Execution;
use crate::ports::{
    ExecutionStore, MessageSender, OutMessage, Registration, ReleaseRegistry, SendError, StoreError,
};
use crate::release::{Activation, Release};

#[derive(Default)]
pub struct InMemoryExecutionStore {
    records: Mutex<HashMap<Uuid, Execution>>,
    shards: u32,
}

impl InMemoryExecutionStore {
    pub fn new(shards: u32) -> Self {
        Self {
            records: Mutex::default(),
            shards: shards.max(1),
        }
    }

    pub fn snapshot(&self, id: Uuid) -> Option<Execution> {
        self.records.lock().expect("store").get(&id).cloned()
    }
}

#[async_trait]
impl ExecutionStore for InMemoryExecutionStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        Ok(self.snapshot(id))
    }

    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        let mut records = self.records.lock().expect("store");
        if records.contains_key(&record.id) {
            return Err(StoreError::Conflict);
        }
        records.insert(record.id, record.clone());
        Ok(())
    }

    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError> {
        let mut records = self.records.lock().expect("store");
        match records.get(&record.id) {
            Some(current) if current.version == expected_version => {
                records.insert(record.id, record.clone());
                Ok(())
            }
            _ => Err(StoreError::Conflict),
        }
    }

    async fn due(&self, shard: u32, now: i64, limit: i32) -> Result<Vec<Uuid>, StoreError> {
        let records = self.records.lock().expect("store");
        let mut due: Vec<(i64, Uuid)> = records
            .values()
            .filter(|r| due_shard(r.id, self.shards) == shard)
            .filter_map(|r| r.due_at().filter(|d| *d <= now).map(|d| (d, r.id)))
            .collect();
        due.sort();
        Ok(due
            .into_iter()
            .take(limit.max(0) as usize)
            .map(|(_, id)| id)
            .collect())
    }

    fn shards(&self) -> u32 {
        self.shards
    }
}

#[derive(Default)]
pub struct InMemoryReleaseRegistry {
    releases: Mutex<BTreeMap<(String, String), Release>>,
    activations: Mutex<Vec<Activation>>,
}

#[async_trait]
impl ReleaseRegistry for InMemoryReleaseRegistry {
    async fn get(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Option<Release>, StoreError> {
        Ok(self
            .releases
            .lock()
            .expect("registry")
            .get(&(pipeline_id.to_string(), release_version.to_string()))
            .cloned())
    }

    async fn list(&self, pipeline_id: &str) -> Result<Vec<Release>, StoreError> {
        Ok(self
            .releases
            .lock()
            .expect("registry")
            .values()
            .filter(|r| r.pipeline_id == pipeline_id)
            .cloned()
            .collect())
    }

    async fn register(&self, release: &Release) -> Result<Registration, StoreError> {
        let mut releases = self.releases.lock().expect("registry");
        let key = (release.pipeline_id.clone(), release.release_version.clone());
        match releases.get(&key) {
            Some(existing) if existing == release => Ok(Registration::Unchanged),
            Some(_) => Err(StoreError::Conflict),
            None => {
                releases.insert(key, release.clone());
                Ok(Registration::Created)
            }
        }
    }

    async fn activate(
        &self,
        pipeline_id: &str,
        release_version: &str,
        at: i64,
        reason: &str,
    ) -> Result<Activation, StoreError> {
        if self.get(pipeline_id, release_version).await?.is_none() {
            return Err(StoreError::Missing(format!(
                "release {release_version} of pipeline {pipeline_id}"
            )));
        }
        let mut activations = self.activations.lock().expect("registry");
        let sequence = activations
            .iter()
            .filter(|a| a.pipeline_id == pipeline_id)
            .count() as u64
            + 1;
        let activation = Activation {
            pipeline_id: pipeline_id.to_string(),
            release_version: release_version.to_string(),
            sequence,
            at,
            reason: reason.to_string(),
        };
        activations.push(activation.clone());
        Ok(activation)
    }

    async fn history(&self, pipeline_id: &str) -> Result<Vec<Activation>, StoreError> {
        Ok(self
            .activations
            .lock()
            .expect("registry")
            .iter()
            .filter(|a| a.pipeline_id == pipeline_id)
            .cloned()
            .collect())
    }

    async fn active(&self, pipeline_id: &str) -> Result<Option<Activation>, StoreError> {
        Ok(self.history(pipeline_id).await?.pop())
    }
}

/// Records every message sent, per queue, and never fails.
#[derive(Default)]
pub struct RecordingSender {
    sent: Mutex<Vec<(String, OutMessage)>>,
}

impl RecordingSender {
    /// Takes the messages sent so far.
    pub fn drain(&self) -> Vec<(String, OutMessage)> {
        std::mem::take(&mut *self.sent.lock().expect("sender"))
    }
}

#[async_trait]
impl MessageSender for RecordingSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Result<(), SendError>> {
        let mut sent = self.sent.lock().expect("sender");
        messages
            .iter()
            .map(|m| {
                sent.push((queue.to_string(), m.clone()));
                Ok(())
            })
            .collect()
    }
}
