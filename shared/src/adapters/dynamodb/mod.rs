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
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use serde_dynamo::aws_sdk_dynamodb_1::{from_item, to_item};
use uuid::Uuid;

use crate::domain::history::Entry;
use crate::domain::release::{Activation, Release, WorkerRecord, WorkerState};
use crate::domain::{Execution, Timestamp};
use crate::ports::{
    ActivationRequest, Backoff, Deferred, DueCursor, DuePage, DueQuery, ExecutionStore, HeadChange,
    ItemOutcome, ListCursor, ListPage, ListQuery, Registration, ReleaseRegistry, StoreError,
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

/// A moment as a number attribute: its epoch milliseconds.
fn at(moment: Timestamp) -> AttributeValue {
    n(moment.millis())
}

/// A number attribute's text read as a moment (epoch milliseconds).
fn parse_at(text: &str) -> Option<Timestamp> {
    text.parse().ok().map(Timestamp::from_millis)
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
        created_at: parse_at(at)?,
        id: pk.strip_prefix("exec#")?.parse().ok()?,
    })
}

/// The index key of a due time: rounded up to the next multiple of `granularity` (zero: exact).
pub fn due_key(due: Timestamp, granularity: Duration) -> Timestamp {
    let (due, step) = (due.millis(), granularity.as_millis() as i64);
    if step <= 0 {
        return Timestamp::from_millis(due);
    }
    let rounded = due.div_euclid(step) * step + if due.rem_euclid(step) == 0 { 0 } else { step };
    Timestamp::from_millis(rounded)
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

mod executions;
mod ledger;
mod releases;

pub use executions::DynamoDbExecutionStore;
pub use releases::DynamoDbReleaseRegistry;

#[cfg(test)]
mod due_key_tests {
    use super::*;

    /// `due_key` on milliseconds, a granule of 5 s (0: none).
    fn key(due: i64, granule_ms: u64) -> i64 {
        due_key(
            Timestamp::from_millis(due),
            Duration::from_millis(granule_ms),
        )
        .millis()
    }

    #[test]
    fn due_keys_round_up_to_the_granule_and_never_early() {
        assert_eq!(key(12_345, 0), 12_345);
        assert_eq!(key(10_000, 5_000), 10_000);
        assert_eq!(key(10_001, 5_000), 15_000);
        assert_eq!(key(14_999, 5_000), 15_000);
        // Hops inside one granule keep the key (and so the index entry) unchanged.
        assert_eq!(key(60_100 + 10_000, 5_000), key(60_900 + 10_000, 5_000));
        for due in [-7_001, -1, 0, 1, 4_999, 123_456_789] {
            let k = key(due, 5_000);
            assert!(k >= due && k - due < 5_000, "{due} -> {k}");
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
        DynamoDbExecutionStore::new(Client::from_conf(config), "t", 4)
            .with_due_granularity(Duration::from_secs(5))
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
            lease: Duration::from_secs(60),
            ..Context::at(Timestamp::from_millis(1_000_001))
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
            at(due_key(record.due_at().unwrap(), Duration::from_secs(5))),
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
