//! The execution table's records: create, conditional put, read, the due index and the list index, the
//! history journal.

use super::*;

#[derive(Clone)]
pub struct DynamoDbExecutionStore {
    pub(super) client: Client,
    pub(super) table: String,
    shards: u32,
    granularity: Duration,
}

impl DynamoDbExecutionStore {
    pub fn new(client: Client, table: impl Into<String>, shards: u32) -> Self {
        Self {
            client,
            table: table.into(),
            shards: shards.max(1),
            granularity: Duration::ZERO,
        }
    }

    /// Rounds due times up to `granularity` in the index (see the module documentation).
    pub fn with_due_granularity(mut self, granularity: Duration) -> Self {
        self.granularity = granularity;
        self
    }

    pub(super) fn to_item(&self, record: &Execution) -> Result<Item, StoreError> {
        let mut item: Item = to_item(record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // The id is in the key already: not stored twice (every byte of the item is billed).
        item.remove("id");
        rename_steps(&mut item, true);
        share_step_error(&mut item, record);
        item.insert(PK.into(), s(execution_key(record.id)));
        let day = record.created_at.days();
        item.insert(LIST_KEY.into(), s(list_key(&record.pipeline_id, day)));
        item.insert(LIST_AT.into(), at(record.created_at));
        if let Some(due) = record.index_due() {
            item.insert(
                DUE_SHARD.into(),
                s(format!("s{}", due_shard(record.id, self.shards))),
            );
            item.insert(DUE_AT.into(), at(due_key(due, self.granularity)));
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
                (DUE_AT.to_string(), at(c.due_at)),
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
            .expression_attribute_values(":now", at(query.now))
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
                Some(AttributeValue::N(v)) => parse_at(v)?,
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

    async fn defer(&self, id: Uuid, now: Timestamp, backoff: Backoff) -> Deferred {
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
        let until = due_key(backoff.until(now, failures), self.granularity);
        let moved = self
            .update(id)
            .update_expression("SET #due = :until")
            .condition_expression("attribute_exists(#due) AND #due < :until")
            .expression_attribute_names("#due", DUE_AT)
            .expression_attribute_values(":until", at(until))
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
            request = request.expression_attribute_values(":before", at(before.created_at));
        } else {
            // After a listed execution: on from its entry (executions created in the same
            // millisecond are told apart by the table key, which the index orders them by).
            request = request
                .expression_attribute_values(
                    ":before",
                    at(before.created_at + Duration::from_millis(1)),
                )
                .exclusive_start_key(LIST_KEY, key)
                .exclusive_start_key(LIST_AT, at(before.created_at))
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
