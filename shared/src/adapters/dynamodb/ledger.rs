//! The fan-out ledger, in the execution table: one item per child outcome, counted in blocks.

use super::*;

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
    pub(super) async fn read_many(
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
        outcome: ItemOutcome,
    ) -> Result<Option<crate::ports::BlockCount>, StoreError> {
        let ItemOutcome {
            item,
            succeeded,
            version,
        } = outcome;
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

    async fn add_to_head(&self, unit: Uuid, change: HeadChange) -> Result<(u32, u32), StoreError> {
        let adds: Vec<(&str, u32)> = change
            .block
            .map(|b| ("blocks", b))
            .into_iter()
            .chain(change.failed.map(|f| ("failed", f)))
            .collect();
        let deletes: Vec<(&str, u32)> = change
            .recovered
            .map(|r| ("failed", r))
            .into_iter()
            .collect();
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
        items: Range<u32>,
    ) -> Result<Vec<Option<crate::domain::ChildEnd>>, StoreError> {
        let key = |i: u32| ledger_key(unit, Some(i.to_string()));
        let mut found = self.read_many(items.clone().map(key).collect()).await?;
        items
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
