//! DynamoDB adapters: the execution table and the release registry table.
//!
//! Execution item: `pk = "exec#<id>"`, the record's fields (mapped by serde_dynamo), and the sparse
//! due-index attributes `dueShard`/`dueAt`, present only while the execution is due at some time. The
//! `due-index` GSI (keys only) is Queried per shard with `dueAt <= now`; sharding spreads the index's
//! write load over partitions (each takes about 1,000 WCU/s).
//!
//! `dueAt` is the record's due time rounded *up* to the due granularity. Every hop moves a running
//! execution's deadline a little, but an index entry is only rewritten when its key changes: rounding
//! keeps the key still across the hops of one granule, so a fast execution writes its entry about twice
//! (created, removed) instead of twice per hop. Rounding up never makes anything due early; the sweeper
//! sees it at most one granule late.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use serde_dynamo::aws_sdk_dynamodb_1::{from_item, to_item};
use uuid::Uuid;

use crate::domain::history::Entry;
use crate::domain::release::{Activation, Release, WorkerRecord, WorkerState};
use crate::domain::Execution;
use crate::ports::{
    ActivationRequest, Backoff, DueCursor, DuePage, DueQuery, ExecutionStore, ListCursor, ListPage,
    ListQuery, Registration, ReleaseRegistry, StoreError, DAY_MS,
};

/// Name of the due-time GSI (see template.yaml).
pub const DUE_INDEX: &str = "due-index";
/// Name of the listing GSI (see template.yaml): keys only, written once per execution.
pub const LIST_INDEX: &str = "list-index";
/// The list index's keys: `<pipeline>#<day>` and the creation time (epoch ms). Both follow from what
/// never changes in a record, so every later write of the item leaves its index entry alone. Short
/// names: every write bills the item's bytes, names included.
const LIST_KEY: &str = "lk";
const LIST_AT: &str = "la";
const PK: &str = "pk";
const SK: &str = "sk";
const DUE_SHARD: &str = "dueShard";
const DUE_AT: &str = "dueAt";
/// Claims of the item that failed since its last write (see `defer`).
const CLAIM_FAILURES: &str = "claimFailures";

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
    let detail = DisplayErrorContext(&err).to_string();
    // "Item size has exceeded the maximum allowed size" (400 KB): final, never worth a retry.
    if err.code() == Some("ValidationException")
        && err
            .message()
            .is_some_and(|m| m.contains("size has exceeded"))
    {
        return StoreError::TooLarge(detail);
    }
    StoreError::Unavailable(detail)
}

pub fn execution_key(id: Uuid) -> String {
    format!("exec#{id}")
}

/// The key of chunk `chunk` of an execution's history journal.
fn journal_key(id: Uuid, chunk: u32) -> String {
    format!("exec#{id}#j{chunk}")
}

fn list_key(pipeline_id: &str, day: i64) -> String {
    format!("{pipeline_id}#{day}")
}

/// A listed execution from its index entry (keys only: the index's keys and the table's).
fn listed(item: &Item) -> Option<ListCursor> {
    let (Some(AttributeValue::N(at)), Some(AttributeValue::S(pk))) =
        (item.get(LIST_AT), item.get(PK))
    else {
        return None;
    };
    Some(ListCursor {
        created_at: at.parse().ok()?,
        id: pk.strip_prefix("exec#")?.parse().ok()?,
    })
}

/// The index key of a due time: rounded up to the next multiple of `granularity_ms` (0: exact).
pub fn due_key(due: i64, granularity_ms: i64) -> i64 {
    if granularity_ms <= 0 {
        return due;
    }
    due.div_euclid(granularity_ms) * granularity_ms
        + if due.rem_euclid(granularity_ms) == 0 {
            0
        } else {
            granularity_ms
        }
}

/// Short names of the attributes of a step's progress in the item (long ones in the record): the item
/// holds one entry per step launched and every write is billed by its size.
const STEP_NAMES: [(&str, &str); 7] = [
    ("status", "s"),
    ("launchId", "l"),
    ("output", "o"),
    ("receipt", "r"),
    ("fingerprint", "f"),
    ("earlierReceipts", "er"),
    ("error", "e"),
];

/// Renames the keys of every step entry (and of the receipts in it), `long` to short or back.
fn rename_steps(item: &mut Item, to_short: bool) {
    fn rename(map: &mut HashMap<String, AttributeValue>, to_short: bool) {
        for (long, short) in STEP_NAMES {
            let (from, to) = if to_short {
                (long, short)
            } else {
                (short, long)
            };
            if let Some(value) = map.remove(from) {
                map.insert(to.to_string(), value);
            }
        }
        for value in map.values_mut() {
            match value {
                AttributeValue::M(inner) => rename(inner, to_short),
                AttributeValue::L(list) => {
                    for v in list {
                        if let AttributeValue::M(inner) = v {
                            rename(inner, to_short);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    if let Some(AttributeValue::L(steps)) = item.get_mut("steps") {
        for step in steps {
            if let AttributeValue::M(map) = step {
                rename(map, to_short);
            }
        }
    }
}

/// The attribute of a step entry whose error is the execution's `error`, stored there only: a failed
/// step's error (up to a worker's whole message) is not written twice.
const SHARED_ERROR: &str = "es";

/// Stores the current step's error once when it is the execution's (after `rename_steps` to short).
fn share_step_error(item: &mut Item, record: &Execution) {
    let current = record.progress(record.step);
    if record.error.is_none() || current.is_none_or(|p| p.error != record.error) {
        return;
    }
    let index = (record.step - record.first_step) as usize;
    if let Some(AttributeValue::L(steps)) = item.get_mut("steps") {
        if let Some(AttributeValue::M(step)) = steps.get_mut(index) {
            if step.remove("e").is_some() {
                step.insert(SHARED_ERROR.into(), AttributeValue::Bool(true));
            }
        }
    }
}

/// Puts the execution's error back in the step entry that shares it (before `rename_steps` to long).
fn unshare_step_error(item: &mut Item) {
    let error = item.get("error").cloned();
    if let (Some(error), Some(AttributeValue::L(steps))) = (error, item.get_mut("steps")) {
        for step in steps {
            if let AttributeValue::M(map) = step {
                if map.remove(SHARED_ERROR).is_some() {
                    map.insert("e".into(), error.clone());
                }
            }
        }
    }
}

/// Maps an execution item back to its record (the id comes from the key).
fn execution_from_item(mut item: Item) -> Result<Execution, StoreError> {
    unshare_step_error(&mut item);
    rename_steps(&mut item, false);
    if !item.contains_key("id") {
        let id = match item.get(PK) {
            Some(AttributeValue::S(pk)) => pk.strip_prefix("exec#").unwrap_or(pk).to_string(),
            _ => return Err(StoreError::Corrupt("execution item without a key".into())),
        };
        item.insert("id".into(), s(id));
    }
    from_item(item).map_err(|e| StoreError::Corrupt(e.to_string()))
}

pub use crate::ports::due_shard;

#[derive(Clone)]
pub struct DynamoDbExecutionStore {
    client: Client,
    table: String,
    shards: u32,
    granularity_ms: i64,
}

impl DynamoDbExecutionStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32) -> Self {
        Self {
            client,
            table: table.into(),
            shards: shards.max(1),
            granularity_ms: 0,
        }
    }

    /// Rounds due times up to `granularity_ms` in the index (see the module documentation).
    pub fn with_due_granularity(mut self, granularity_ms: i64) -> Self {
        self.granularity_ms = granularity_ms.max(0);
        self
    }

    fn to_item(&self, record: &Execution) -> Result<Item, StoreError> {
        let mut item: Item = to_item(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // The id is in the key already: not stored twice (every byte of the item is billed).
        item.remove("id");
        rename_steps(&mut item, true);
        share_step_error(&mut item, record);
        item.insert(PK.into(), s(execution_key(record.id)));
        let day = record.created_at.div_euclid(DAY_MS);
        item.insert(LIST_KEY.into(), s(list_key(&record.pipeline_id, day)));
        item.insert(LIST_AT.into(), n(record.created_at));
        if let Some(due) = record.index_due() {
            item.insert(
                DUE_SHARD.into(),
                s(format!("s{}", due_shard(record.id, self.shards))),
            );
            item.insert(DUE_AT.into(), n(due_key(due, self.granularity_ms)));
        }
        Ok(item)
    }

    /// An UpdateItem of one execution's item.
    fn update(
        &self,
        id: Uuid,
    ) -> aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder {
        let item = self.client.update_item().table_name(&self.table);
        item.key(PK, s(execution_key(id)))
    }
}

#[async_trait]
impl ExecutionStore for DynamoDbExecutionStore {
    async fn get(&self, id: Uuid) -> Result<Option<Execution>, StoreError> {
        let read = self.client.get_item().table_name(&self.table);
        let out = read
            .key(PK, s(execution_key(id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(classify)?;
        out.item.map(execution_from_item).transpose()
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

    async fn due(&self, query: DueQuery) -> Result<DuePage, StoreError> {
        let shard_key = format!("s{}", query.shard);
        // A GSI's start key holds the index keys and the table key of the last item read.
        let start = query.after.map(|c| {
            Item::from([
                (PK.to_string(), s(execution_key(c.id))),
                (DUE_SHARD.to_string(), s(shard_key.clone())),
                (DUE_AT.to_string(), n(c.due_at)),
            ])
        });
        let out = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(DUE_INDEX)
            .key_condition_expression("#shard = :shard AND #due <= :now")
            .expression_attribute_names("#shard", DUE_SHARD)
            .expression_attribute_names("#due", DUE_AT)
            .expression_attribute_values(":shard", s(shard_key))
            .expression_attribute_values(":now", n(query.now))
            .limit(query.limit)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(classify)?;
        let id_of = |item: &Item| match item.get(PK) {
            Some(AttributeValue::S(key)) => key.strip_prefix("exec#")?.parse::<Uuid>().ok(),
            _ => None,
        };
        let next = out.last_evaluated_key.as_ref().and_then(|key| {
            let due_at = match key.get(DUE_AT) {
                Some(AttributeValue::N(v)) => v.parse().ok()?,
                _ => return None,
            };
            Some(DueCursor {
                due_at,
                id: id_of(key)?,
            })
        });
        Ok(DuePage {
            ids: out.items().iter().filter_map(id_of).collect(),
            next,
        })
    }

    async fn defer(&self, id: Uuid, now: i64, backoff: Backoff) -> Result<Option<i64>, StoreError> {
        // Counted first (the count decides the delay), then moved; both only while the item is in the
        // index. A full write of the record drops both attributes.
        let counted = self
            .update(id)
            .update_expression("ADD #failures :one")
            .condition_expression("attribute_exists(#due)")
            .expression_attribute_names("#failures", CLAIM_FAILURES)
            .expression_attribute_names("#due", DUE_AT)
            .expression_attribute_values(":one", n(1))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::UpdatedNew)
            .send()
            .await;
        let failures = match counted {
            Ok(out) => match out.attributes.as_ref().and_then(|a| a.get(CLAIM_FAILURES)) {
                Some(AttributeValue::N(v)) => v.parse::<u32>().unwrap_or(1),
                _ => 1,
            },
            Err(e) => {
                return match classify(e) {
                    StoreError::Conflict => Ok(None),
                    other => Err(other),
                }
            }
        };
        let until = due_key(backoff.until(now, failures), self.granularity_ms);
        let moved = self
            .update(id)
            .update_expression("SET #due = :until")
            .condition_expression("attribute_exists(#due) AND #due < :until")
            .expression_attribute_names("#due", DUE_AT)
            .expression_attribute_values(":until", n(until))
            .send()
            .await;
        match moved.map_err(classify) {
            Ok(_) => Ok(Some(until)),
            Err(StoreError::Conflict) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn shards(&self) -> u32 {
        self.shards
    }

    async fn put_journal(&self, id: Uuid, chunk: u32, entries: &[Entry]) -> Result<(), StoreError> {
        let body =
            serde_json::to_string(entries).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.client
            .put_item()
            .table_name(&self.table)
            .item(PK, s(journal_key(id, chunk)))
            .item("entries", s(body))
            .send()
            .await
            .map_err(classify)?;
        Ok(())
    }

    async fn journal(&self, id: Uuid, chunks: u32) -> Result<Vec<Option<Vec<Entry>>>, StoreError> {
        let keys = (0..chunks).map(|k| s(journal_key(id, k))).collect();
        let mut found = self.read_many(keys).await?;
        (0..chunks)
            .map(|k| {
                let Some(item) = found.remove(&journal_key(id, k)) else {
                    return Ok(None);
                };
                match item.get("entries") {
                    Some(AttributeValue::S(body)) => serde_json::from_str(body)
                        .map(Some)
                        .map_err(|e| StoreError::Corrupt(e.to_string())),
                    _ => Err(StoreError::Corrupt(format!("journal chunk {k} of {id}"))),
                }
            })
            .collect()
    }

    async fn list(&self, query: ListQuery) -> Result<ListPage, StoreError> {
        let key = s(list_key(&query.pipeline_id, query.day));
        let before = query.before;
        let mut request = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(LIST_INDEX)
            .key_condition_expression("#key = :key AND #at < :before")
            .expression_attribute_names("#key", LIST_KEY)
            .expression_attribute_names("#at", LIST_AT)
            .expression_attribute_values(":key", key.clone())
            .scan_index_forward(false)
            .limit(query.limit.max(1));
        if before.id.is_nil() {
            request = request.expression_attribute_values(":before", n(before.created_at));
        } else {
            // After a listed execution: on from its entry (executions created in the same
            // millisecond are told apart by the table key, which the index orders them by).
            request = request
                .expression_attribute_values(":before", n(before.created_at + 1))
                .exclusive_start_key(LIST_KEY, key)
                .exclusive_start_key(LIST_AT, n(before.created_at))
                .exclusive_start_key(PK, s(execution_key(before.id)));
        }
        let out = request.send().await.map_err(classify)?;
        let keys = out
            .items
            .unwrap_or_default()
            .iter()
            .filter_map(listed)
            .collect();
        Ok(ListPage {
            keys,
            more: out.last_evaluated_key.is_some_and(|k| !k.is_empty()),
        })
    }

    async fn get_many(&self, ids: &[Uuid]) -> Result<Vec<Execution>, StoreError> {
        let keys = ids.iter().map(|id| s(execution_key(*id))).collect();
        let found = self.read_many(keys).await?;
        found.into_values().map(execution_from_item).collect()
    }
}

/// The fan-out ledger, in the execution table: `pk = "fanout#<unit>#<item>"` keeps a child's end
/// (`end`, its JSON), `"fanout#<unit>#b<block>"` the block's number sets `ok` and `failed`,
/// `"fanout#<unit>"` the head's number sets `blocks` (complete ones) and `failed`. Adding to a number
/// set is idempotent, and each write touches one small item: a child costs two writes of about
/// 1 KB, three when it fails or completes its block.
fn ledger_key(unit: Uuid, suffix: Option<String>) -> AttributeValue {
    match suffix {
        Some(suffix) => s(format!("fanout#{unit}#{suffix}")),
        None => s(format!("fanout#{unit}")),
    }
}

fn set_len(item: &Item, name: &str) -> u32 {
    match item.get(name) {
        Some(AttributeValue::Ns(values)) => values.len() as u32,
        _ => 0,
    }
}

impl DynamoDbExecutionStore {
    /// Strongly consistent reads of `keys` (any number: read 100 at a time, unprocessed keys again),
    /// by key.
    async fn read_many(
        &self,
        keys: Vec<AttributeValue>,
    ) -> Result<HashMap<String, Item>, StoreError> {
        let mut found = HashMap::new();
        for chunk in keys.chunks(100) {
            let mut pending: Vec<Item> = chunk
                .iter()
                .map(|k| Item::from([(PK.to_string(), k.clone())]))
                .collect();
            while !pending.is_empty() {
                let request = aws_sdk_dynamodb::types::KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut pending)))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| StoreError::Unavailable(e.to_string()))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(classify)?;
                for item in out
                    .responses
                    .unwrap_or_default()
                    .remove(&self.table)
                    .unwrap_or_default()
                {
                    if let Some(AttributeValue::S(key)) = item.get(PK) {
                        found.insert(key.clone(), item);
                    }
                }
                if let Some(mut left) = out.unprocessed_keys {
                    if let Some(keys) = left.remove(&self.table) {
                        pending = keys.keys;
                    }
                }
            }
        }
        Ok(found)
    }

    /// ADDs numbers to number sets of one ledger item and DELETEs others; returns the item after.
    async fn update_sets(
        &self,
        key: AttributeValue,
        adds: &[(&str, u32)],
        deletes: &[(&str, u32)],
    ) -> Result<Item, StoreError> {
        let mut update = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, key);
        let mut clauses = Vec::new();
        for (verb, changes) in [("ADD", adds), ("DELETE", deletes)] {
            let mut parts = Vec::new();
            for (set, value) in changes {
                let n = clauses.len() + parts.len();
                parts.push(format!("#s{n} :v{n}"));
                update = update
                    .expression_attribute_names(format!("#s{n}"), *set)
                    .expression_attribute_values(
                        format!(":v{n}"),
                        AttributeValue::Ns(vec![value.to_string()]),
                    );
            }
            if !parts.is_empty() {
                clauses.push(format!("{verb} {}", parts.join(", ")));
            }
        }
        let out = update
            .update_expression(clauses.join(" "))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllNew)
            .send()
            .await
            .map_err(classify)?;
        Ok(out.attributes.unwrap_or_default())
    }
}

fn set_has(item: &Item, name: &str, value: u32) -> bool {
    let value = value.to_string();
    matches!(item.get(name), Some(AttributeValue::Ns(values)) if values.contains(&value))
}

/// The ledger's item of a child's end keeps the child's version beside it.
const END_VERSION: &str = "version";

#[async_trait]
impl crate::ports::FanOutLedger for DynamoDbExecutionStore {
    async fn keep(
        &self,
        unit: Uuid,
        end: &crate::domain::ChildEnd,
        version: u64,
    ) -> Result<bool, StoreError> {
        let body = serde_json::to_string(end).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let kept = self
            .client
            .put_item()
            .table_name(&self.table)
            .item(PK, ledger_key(unit, Some(end.item.to_string())))
            .item("end", s(body))
            .item(END_VERSION, n(version))
            .condition_expression("attribute_not_exists(#pk) OR #v <= :v")
            .expression_attribute_names("#pk", PK)
            .expression_attribute_names("#v", END_VERSION)
            .expression_attribute_values(":v", n(version))
            .send()
            .await
            .map_err(classify);
        match kept {
            Ok(_) => Ok(true),
            Err(StoreError::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn set_outcome(
        &self,
        unit: Uuid,
        item: u32,
        succeeded: bool,
        version: u64,
    ) -> Result<Option<crate::ports::BlockCount>, StoreError> {
        let block = crate::domain::fan_out::block_of(item);
        let (into, out_of) = if succeeded {
            ("ok", "failed")
        } else {
            ("failed", "ok")
        };
        // One outcome per item: in one set, out of the other, under the version it came from (an
        // attribute per item), never over a later version's.
        let set = self
            .client
            .update_item()
            .table_name(&self.table)
            .key(PK, ledger_key(unit, Some(format!("b{block}"))))
            .update_expression("ADD #into :i DELETE #out :i SET #v = :v")
            .condition_expression("attribute_not_exists(#v) OR #v <= :v")
            .expression_attribute_names("#into", into)
            .expression_attribute_names("#out", out_of)
            .expression_attribute_names("#v", format!("v{item}"))
            .expression_attribute_values(":i", AttributeValue::Ns(vec![item.to_string()]))
            .expression_attribute_values(":v", n(version))
            .return_values(aws_sdk_dynamodb::types::ReturnValue::AllOld)
            .send()
            .await
            .map_err(classify);
        let before = match set {
            Ok(out) => out.attributes.unwrap_or_default(),
            Err(StoreError::Conflict) => return Ok(None),
            Err(e) => return Err(e),
        };
        let had = set_has(&before, "ok", item) || set_has(&before, "failed", item);
        Ok(Some(crate::ports::BlockCount {
            counted: set_len(&before, "ok") + set_len(&before, "failed") + u32::from(!had),
            was_failed: set_has(&before, "failed", item),
        }))
    }

    async fn add_to_head(
        &self,
        unit: Uuid,
        block: Option<u32>,
        failed: Option<u32>,
        recovered: Option<u32>,
    ) -> Result<(u32, u32), StoreError> {
        let adds: Vec<(&str, u32)> = block
            .map(|b| ("blocks", b))
            .into_iter()
            .chain(failed.map(|f| ("failed", f)))
            .collect();
        let deletes: Vec<(&str, u32)> = recovered.map(|r| ("failed", r)).into_iter().collect();
        let head = if adds.is_empty() && deletes.is_empty() {
            self.read_many(vec![ledger_key(unit, None)])
                .await?
                .into_values()
                .next()
                .unwrap_or_default()
        } else {
            self.update_sets(ledger_key(unit, None), &adds, &deletes)
                .await?
        };
        Ok((set_len(&head, "blocks"), set_len(&head, "failed")))
    }

    async fn tally(&self, unit: Uuid, items: u32) -> Result<crate::domain::Tally, StoreError> {
        let blocks = items.div_ceil(crate::domain::fan_out::BLOCK);
        let keys = (0..blocks)
            .map(|b| ledger_key(unit, Some(format!("b{b}"))))
            .collect();
        let found = self.read_many(keys).await?;
        let mut tally = crate::domain::Tally::default();
        for item in found.values() {
            tally.succeeded += set_len(item, "ok");
            tally.failed += set_len(item, "failed");
        }
        Ok(tally)
    }

    async fn ends(
        &self,
        unit: Uuid,
        from: u32,
        to: u32,
    ) -> Result<Vec<Option<crate::domain::ChildEnd>>, StoreError> {
        let key = |i: u32| ledger_key(unit, Some(i.to_string()));
        let mut found = self.read_many((from..to).map(key).collect()).await?;
        (from..to)
            .map(|i| {
                let AttributeValue::S(k) = key(i) else {
                    unreachable!("ledger keys are strings")
                };
                match found.remove(&k).and_then(|mut item| item.remove("end")) {
                    Some(AttributeValue::S(body)) => serde_json::from_str(&body)
                        .map(Some)
                        .map_err(|e| StoreError::Corrupt(format!("{k}: {e}"))),
                    _ => Ok(None),
                }
            })
            .collect()
    }
}

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
            .item("seenAt", AttributeValue::N(worker.seen_at.to_string()))
            .item(
                "expiresAt",
                AttributeValue::N((worker.seen_at / 1000 + WORKER_RETENTION_SECS).to_string()),
            );
        // The latest word of a worker replaces an older one, whatever either says: a drain is
        // evidence only until the worker is heard again.
        let written = put
            .condition_expression("attribute_not_exists(pk) OR seenAt <= :seen")
            .expression_attribute_values(":seen", AttributeValue::N(worker.seen_at.to_string()))
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

#[cfg(test)]
mod due_key_tests {
    use super::due_key;

    #[test]
    fn due_keys_round_up_to_the_granule_and_never_early() {
        assert_eq!(due_key(12_345, 0), 12_345);
        assert_eq!(due_key(10_000, 5_000), 10_000);
        assert_eq!(due_key(10_001, 5_000), 15_000);
        assert_eq!(due_key(14_999, 5_000), 15_000);
        // Hops inside one granule keep the key (and so the index entry) unchanged.
        assert_eq!(
            due_key(60_100 + 10_000, 5_000),
            due_key(60_900 + 10_000, 5_000)
        );
        for due in [-7_001, -1, 0, 1, 4_999, 123_456_789] {
            let key = due_key(due, 5_000);
            assert!(key >= due && key - due < 5_000, "{due} -> {key}");
        }
    }
}

#[cfg(test)]
mod item_tests {
    use super::*;
    use crate::domain::{
        start_launched, Context, NewExecution, PipelineDef, Receipt, RetryPolicy, StepDef,
        StepError,
    };

    fn store() -> DynamoDbExecutionStore {
        let config = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .region(aws_sdk_dynamodb::config::Region::new("us-east-1"))
            .build();
        DynamoDbExecutionStore::new(Client::from_conf(config), "t", 4).with_due_granularity(5_000)
    }

    #[test]
    fn an_execution_item_is_compact_and_maps_back_to_the_same_record() {
        let step = StepDef::task("a", "q")
            .types("x/1", "x/1")
            .timeout_secs(60)
            .retry(RetryPolicy::doubling(3, 100, 1_000));
        let def = PipelineDef {
            pipeline_id: "p".into(),
            release_version: "1".into(),
            steps: vec![step],
        };
        let ctx = Context {
            now: 1_000_001,
            jitter: 0.5,
            token: Uuid::from_u128(9),
            secret: [9; 16],
            owner: "test".into(),
            lease_ms: 60_000,
            lifecycle: false,
        };
        let id = Uuid::from_u128(7);
        let (mut record, _) = start_launched(
            NewExecution::of(id, "t", &def, serde_json::json!({"n": 1})),
            &ctx,
        );
        record.steps[0].receipt = Some(Receipt {
            launch_id: record.steps[0].launch_id,
            fingerprint: "ff".into(),
        });
        let item = store().to_item(&record).unwrap();
        assert!(!item.contains_key("id"), "the id is the key's");
        let AttributeValue::L(steps) = &item["steps"] else {
            panic!("{item:?}")
        };
        let AttributeValue::M(entry) = &steps[0] else {
            panic!()
        };
        let mut keys: Vec<&str> = entry.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["l", "r", "s"]);
        assert_eq!(
            item[DUE_AT],
            n(due_key(record.due_at().unwrap(), 5_000)),
            "rounded up to the granule"
        );
        assert_eq!(execution_from_item(item).unwrap(), record);

        // A failed step's error is the execution's: written once, read back in both places.
        let error = StepError::new("HUGE", "e".repeat(1_000), false);
        record.steps[0].error = Some(error.clone());
        record.error = Some(error);
        let item = store().to_item(&record).unwrap();
        let text = format!("{item:?}");
        assert_eq!(text.matches(&"e".repeat(1_000)).count(), 1, "{text}");
        assert_eq!(execution_from_item(item).unwrap(), record);

        // A step error other than the execution's stays in the step.
        record.error = Some(StepError::new("CANCELLED", "stop", false));
        let item = store().to_item(&record).unwrap();
        assert_eq!(execution_from_item(item).unwrap(), record);
    }
}
