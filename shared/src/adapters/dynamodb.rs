//! DynamoDB adapters: the execution table and the release registry table.
//!
//! Execution item: `pk = "exec#<id>"`, the record's fields (mapped by serde_dynamo), and the sparse
//! due-index attributes `dueShard`/`dueAt`, present only while the execution is due at some time. The
//! `due-index` GSI (keys only) is Queried per shard with `dueAt <= now`; sharding spreads the index's
//! write load over partitions (each takes about 1,000 WCU/s).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use serde_dynamo::aws_sdk_dynamodb_1::{from_item, to_item};
use uuid::Uuid;

use crate::domain::{Execution, PipelineDef};
use crate::ports::{ExecutionStore, Registration, ReleaseRegistry, StoreError};

/// Name of the due-time GSI (see template.yaml).
pub const DUE_INDEX: &str = "due-index";
const PK: &str = "pk";
const SK: &str = "sk";
const DUE_SHARD: &str = "dueShard";
const DUE_AT: &str = "dueAt";

type Item = HashMap<String, AttributeValue>;

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// Maps an SDK error: a failed condition is a `Conflict`, anything else is reported as unavailable.
fn classify<E>(err: aws_sdk_dynamodb::error::SdkError<E>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if err.code() == Some("ConditionalCheckFailedException") {
        return StoreError::Conflict;
    }
    StoreError::Unavailable(DisplayErrorContext(&err).to_string())
}

pub fn execution_key(id: Uuid) -> String {
    format!("exec#{id}")
}

/// The shard of the due index an execution belongs to.
pub fn due_shard(id: Uuid, shards: u32) -> u32 {
    (id.as_u128() % u128::from(shards.max(1))) as u32
}

#[derive(Clone)]
pub struct DynamoDbExecutionStore {
    client: Client,
    table: String,
    shards: u32,
}

impl DynamoDbExecutionStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32) -> Self {
        Self {
            client,
            table: table.into(),
            shards: shards.max(1),
        }
    }

    fn to_item(&self, record: &Execution) -> Result<Item, StoreError> {
        let mut item: Item = to_item(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        item.insert(PK.into(), s(execution_key(record.id)));
        if let Some(due) = record.due_at() {
            item.insert(
                DUE_SHARD.into(),
                s(format!("s{}", due_shard(record.id, self.shards))),
            );
            item.insert(DUE_AT.into(), n(due));
        }
        Ok(item)
    }
}

#[async_trait]
impl ExecutionStore for DynamoDbExecutionStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, s(execution_key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item
            .map(|item| from_item(item).map_err(|e| StoreError::Corrupt(e.to_string())))
            .transpose()
    }

    async fn create(&self, record: &Execution) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(self.to_item(record)?))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn replace(&self, record: &Execution, expected_version: u64) -> Result<(), StoreError> {
        // A full put costs the same write units as an update (both bill the whole item) and keeps the
        // mapping in serde; the condition is the optimistic lock every writer goes through.
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(self.to_item(record)?))
            .condition_expression("version = :expected")
            .expression_attribute_values(":expected", n(expected_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn due(&self, shard: u32, now: i64, limit: i32) -> Result<Vec<Uuid>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("#shard = :shard AND #due <= :now")
            .expression_attribute_names("#shard", DUE_SHARD)
            .expression_attribute_names("#due", DUE_AT)
            .expression_attribute_values(":shard", s(format!("s{shard}")))
            .expression_attribute_values(":now", n(now))
            .limit(limit)
            .send()
            .await
            .map_err(classify)?;
        Ok(out
            .items()
            .iter()
            .filter_map(|item| match item.get(PK) {
                Some(AttributeValue::S(key)) => key.strip_prefix("exec#")?.parse().ok(),
                _ => None,
            })
            .collect())
    }

    fn shards(&self) -> u32 {
        self.shards
    }
}

/// Release registry: `pk = "pipeline#<id>"`, `sk = "release#<version>"` holds the immutable definition
/// (as JSON text), `sk = "active"` the active release.
#[derive(Clone)]
pub struct DynamoDbReleaseRegistry {
    client: Client,
    table: String,
}

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

    async fn get_attr(
        &self,
        pipeline_id: &str,
        sk: String,
        attr: &str,
    ) -> Result<Option<String>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .key(PK, Self::pipeline_key(pipeline_id))
            .key(SK, s(sk))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        Ok(match out.item.as_ref().and_then(|i| i.get(attr)) {
            Some(AttributeValue::S(text)) => Some(text.clone()),
            _ => None,
        })
    }
}

#[async_trait]
impl ReleaseRegistry for DynamoDbReleaseRegistry {
    async fn get(
        &self,
        pipeline_id: &str,
        release_version: &str,
    ) -> Result<Option<PipelineDef>, StoreError> {
        self.get_attr(
            pipeline_id,
            format!("release#{release_version}"),
            "definition",
        )
        .await?
        .map(|text| serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(e.to_string())))
        .transpose()
    }

    async fn register(&self, def: &PipelineDef) -> Result<Registration, StoreError> {
        let text = serde_json::to_string(def).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let put = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, Self::pipeline_key(&def.pipeline_id))
            .item(SK, s(format!("release#{}", def.release_version)))
            .item("definition", s(text))
            .condition_expression("attribute_not_exists(pk)")
            .send()
            .await;
        match put.map_err(classify) {
            Ok(_) => Ok(Registration::Created),
            Err(StoreError::Conflict) => {
                match self.get(&def.pipeline_id, &def.release_version).await? {
                    Some(existing) if &existing == def => Ok(Registration::Unchanged),
                    _ => Err(StoreError::Conflict),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn activate(&self, pipeline_id: &str, release_version: &str) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .item(PK, Self::pipeline_key(pipeline_id))
            .item(SK, s("active"))
            .item("releaseVersion", s(release_version))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn active(&self, pipeline_id: &str) -> Result<Option<String>, StoreError> {
        self.get_attr(pipeline_id, "active".into(), "releaseVersion")
            .await
    }
}
