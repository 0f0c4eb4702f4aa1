//! Counts every AWS request the handlers make: an SDK interceptor on the same clients the adapters use
//! records each attempt (service, operation, queue or table, timing, status) and prices it by the
//! billing rules in `pricing`, from the request and response bodies themselves.
//!
//! Requests made inside `Meter::invoke` are attributed to that invocation of a function (a task-local
//! scope), which gives both the Lambda bill and the order of calls on the critical path.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use aws_sdk_dynamodb::config::ConfigBag;
use aws_sdk_dynamodb::error::BoxError;
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use serde::Serialize;
use serde_json::Value;

use stepline_local::iam::HttpCall;
use stepline_local::observe::Observer;

use crate::pricing;

tokio::task_local! {
    static SCOPE: Scope;
}

/// One invocation of a function, as Lambda would bill it.
#[derive(Debug, Clone, Copy)]
struct Scope {
    function: &'static str,
    invocation: u64,
}

/// A table the meter prices writes for: its key attributes and each GSI's key attributes.
#[derive(Debug, Clone, Default)]
pub struct TableInfo {
    pub key: Vec<String>,
    pub indexes: Vec<Vec<String>>,
}

/// One request attempt.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Call {
    pub service: String,
    pub operation: String,
    /// Function and invocation the request was made in (none: the event-source poller).
    pub function: Option<&'static str>,
    pub invocation: Option<u64>,
    /// Queue URL of an SQS request.
    pub queue: Option<String>,
    pub start_us: u64,
    pub end_us: u64,
    pub status: u16,
    /// Size of the item written (PutItem).
    pub item_bytes: u64,
    pub write_units: u64,
    pub read_units: f64,
    /// Index entries written (each is at least one write unit).
    pub index_writes: u64,
    pub sqs_requests: u64,
    pub events: u64,
    /// S3 requests (GET or PUT).
    pub s3_requests: u64,
    /// A write or read of the fan-out ledger (items keyed `fanout#...`).
    pub ledger: bool,
    /// A write of an execution's history journal (items keyed `exec#<id>#j<n>`).
    pub journal: bool,
    /// Entries of the list index written (part of `index_writes`).
    pub list_index_writes: u64,
    /// Bytes of an execution item that listing and history take (the list index's keys, the
    /// history entries the record holds).
    pub visibility_bytes: u64,
    /// Messages sent or received.
    pub messages: u64,
}

/// One function invocation.
#[derive(Debug, Clone, Serialize)]
pub struct Invocation {
    pub function: &'static str,
    /// Messages in the batch it handled.
    pub records: usize,
    pub duration_ms: f64,
}

#[derive(Default)]
struct Stored {
    bytes: u64,
    index_keys: Vec<Option<Vec<String>>>,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    invocations: Vec<Invocation>,
    next_invocation: u64,
    items: HashMap<String, Stored>,
}

/// The shared recorder; clone it into every client's interceptor.
#[derive(Clone)]
pub struct Meter {
    epoch: Instant,
    tables: Arc<HashMap<String, TableInfo>>,
    state: Arc<Mutex<State>>,
}

/// What the request carried, kept from before it is sent (the attempt hands the request over).
#[derive(Debug, Clone)]
struct Started {
    at: Instant,
    target: String,
    body: Vec<u8>,
}

impl Storable for Started {
    type Storer = StoreReplace<Self>;
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Meter")
    }
}

impl Meter {
    pub fn new(tables: HashMap<String, TableInfo>) -> Self {
        Self {
            epoch: Instant::now(),
            tables: Arc::new(tables),
            state: Arc::default(),
        }
    }

    /// Microseconds since the meter started.
    pub fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Runs `work` as one invocation of `function` handling `records` messages: its requests are
    /// attributed to it and its duration recorded.
    pub async fn invoke<F: Future>(
        &self,
        function: &'static str,
        records: usize,
        work: F,
    ) -> F::Output {
        let invocation = {
            let mut state = self.state.lock().unwrap();
            state.next_invocation += 1;
            state.next_invocation
        };
        let started = Instant::now();
        let output = SCOPE
            .scope(
                Scope {
                    function,
                    invocation,
                },
                work,
            )
            .await;
        self.state.lock().unwrap().invocations.push(Invocation {
            function,
            records,
            duration_ms: started.elapsed().as_secs_f64() * 1000.0,
        });
        output
    }

    /// Takes what was recorded so far (the item sizes seen stay, for pricing later writes).
    pub fn take(&self) -> (Vec<Call>, Vec<Invocation>) {
        let mut state = self.state.lock().unwrap();
        (
            std::mem::take(&mut state.calls),
            std::mem::take(&mut state.invocations),
        )
    }

    /// The SDK clients, each carrying this meter.
    pub fn clients(&self, sdk: &aws_config::SdkConfig) -> stepline::aws::Clients {
        let mut clients = stepline::aws::Clients::new(sdk);
        clients.s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(sdk)
                .force_path_style(sdk.endpoint_url().is_some())
                .build(),
        );
        stepline_local::observe::observed_clients(&clients, self.clone())
    }

    fn record(&self, started: Instant, target: &str, request: &[u8], status: u16, response: &[u8]) {
        let (service, operation) = match target.split_once('.') {
            Some((prefix, op)) if prefix.starts_with("DynamoDB") => ("dynamodb", op),
            Some((prefix, op)) if prefix.starts_with("AmazonSQS") => ("sqs", op),
            Some((prefix, op)) if prefix.starts_with("AWSEvents") => ("events", op),
            Some(("s3", op)) => ("s3", op),
            Some((prefix, op)) => (prefix, op),
            None => ("other", target),
        };
        let request: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
        let response: Value = serde_json::from_slice(response).unwrap_or(Value::Null);
        let scope = SCOPE.try_with(|s| *s).ok();
        let mut call = Call {
            service: service.to_string(),
            operation: operation.to_string(),
            function: scope.map(|s| s.function),
            invocation: scope.map(|s| s.invocation),
            start_us: (started - self.epoch).as_micros() as u64,
            end_us: self.now_us(),
            status,
            ..Call::default()
        };
        let mut state = self.state.lock().unwrap();
        match service {
            "dynamodb" => self.price_dynamodb(&mut state, &mut call, &request, &response),
            "sqs" => {
                call.queue = request["QueueUrl"].as_str().map(str::to_string);
                let payload = match operation {
                    "SendMessage" => request["MessageBody"].as_str().map_or(0, str::len),
                    "SendMessageBatch" => batch_payload(&request["Entries"]),
                    "ReceiveMessage" => response["Messages"].as_array().map_or(0, |m| {
                        m.iter()
                            .map(|m| m["Body"].as_str().map_or(0, str::len))
                            .sum()
                    }),
                    _ => 0,
                };
                call.sqs_requests = pricing::sqs_requests(payload as u64);
                call.messages = match operation {
                    "SendMessage" => 1,
                    "SendMessageBatch" => request["Entries"].as_array().map_or(0, Vec::len) as u64,
                    "ReceiveMessage" => response["Messages"].as_array().map_or(0, Vec::len) as u64,
                    "DeleteMessageBatch" => {
                        request["Entries"].as_array().map_or(0, Vec::len) as u64
                    }
                    _ => 0,
                };
            }
            "s3" => call.s3_requests = 1,
            "events" => {
                let entries = request["Entries"].as_array().cloned().unwrap_or_default();
                call.events = entries
                    .iter()
                    .map(|e| pricing::sqs_requests(e.to_string().len() as u64))
                    .sum();
            }
            _ => {}
        }
        state.calls.push(call);
    }

    fn price_dynamodb(
        &self,
        state: &mut State,
        call: &mut Call,
        request: &Value,
        response: &Value,
    ) {
        let table = request["TableName"].as_str().unwrap_or_default();
        let info = self.tables.get(table).cloned().unwrap_or_default();
        let ok = call.status < 300;
        let ledger_key = |v: &Value| {
            v["pk"]["S"]
                .as_str()
                .is_some_and(|k| k.starts_with("fanout#"))
        };
        call.ledger = ledger_key(&request["Item"]) || ledger_key(&request["Key"]);
        match call.operation.as_str() {
            "UpdateItem" => {
                // Billed by the larger of the item before and after (ReturnValues ALL_NEW gives it).
                let after = response["Attributes"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                let key = format!(
                    "{table}|{}",
                    key_of(
                        request["Key"].as_object().unwrap_or(&Default::default()),
                        &info.key
                    )
                );
                let stored = state.items.entry(key).or_default();
                let bytes = pricing::item_size(&after);
                call.item_bytes = bytes;
                call.write_units = pricing::write_units(bytes.max(stored.bytes)).max(1);
                if ok {
                    stored.bytes = bytes;
                }
            }
            "BatchGetItem" => {
                let consistent = request["RequestItems"]
                    .as_object()
                    .and_then(|t| t.values().next())
                    .is_some_and(|k| k["ConsistentRead"].as_bool() == Some(true));
                let items = response["Responses"]
                    .as_object()
                    .into_iter()
                    .flat_map(|t| t.values())
                    .filter_map(Value::as_array)
                    .flatten()
                    .filter_map(Value::as_object);
                call.ledger = request["RequestItems"]
                    .as_object()
                    .and_then(|t| t.values().next())
                    .and_then(|k| k["Keys"].as_array()?.first().cloned())
                    .is_some_and(|k| ledger_key(&k));
                // Each item read is rounded up to its own read units.
                call.read_units = items
                    .map(|item| pricing::read_units(pricing::item_size(item), consistent))
                    .sum();
            }
            "PutItem" => {
                let item = request["Item"].as_object().cloned().unwrap_or_default();
                let bytes = pricing::item_size(&item);
                call.journal = item["pk"]["S"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("exec#") && k.contains("#j"));
                let visible: serde_json::Map<String, Value> = item
                    .iter()
                    .filter(|(name, _)| {
                        ["lk", "la", "history", "historyBase"].contains(&name.as_str())
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                call.visibility_bytes = if visible.is_empty() {
                    0
                } else {
                    pricing::item_size(&visible)
                };
                let key = format!("{table}|{}", key_of(&item, &info.key));
                let stored = state.items.entry(key).or_default();
                call.item_bytes = bytes;
                // A put bills the larger of the old and the new item, whether or not its condition held.
                call.write_units = pricing::write_units(bytes.max(stored.bytes));
                if ok {
                    let new_keys: Vec<Option<Vec<String>>> =
                        info.indexes.iter().map(|k| index_key(&item, k)).collect();
                    for (i, new) in new_keys.iter().enumerate() {
                        let old = stored.index_keys.get(i).cloned().flatten();
                        // An index entry is written when its key changes (delete + put when both exist).
                        let written = match (&old, new) {
                            (None, None) => 0,
                            (Some(a), Some(b)) if a == b => 0,
                            (Some(_), Some(_)) => 2,
                            _ => 1,
                        };
                        call.index_writes += written;
                        if info.indexes[i].iter().any(|k| k == "lk") {
                            call.list_index_writes += written;
                        }
                    }
                    stored.bytes = bytes;
                    stored.index_keys = new_keys;
                }
                call.write_units += call.index_writes;
            }
            "GetItem" => {
                let bytes = response["Item"].as_object().map_or(0, pricing::item_size);
                call.read_units =
                    pricing::read_units(bytes, request["ConsistentRead"].as_bool() == Some(true));
            }
            "Query" | "Scan" => {
                let bytes: u64 = response["Items"].as_array().map_or(0, |items| {
                    items
                        .iter()
                        .filter_map(Value::as_object)
                        .map(pricing::item_size)
                        .sum()
                });
                call.read_units =
                    pricing::read_units(bytes, request["ConsistentRead"].as_bool() == Some(true));
            }
            _ => {}
        }
    }
}

fn batch_payload(entries: &Value) -> usize {
    entries.as_array().map_or(0, |entries| {
        entries
            .iter()
            .map(|e| {
                e["MessageBody"].as_str().map_or(0, str::len)
                    + e["MessageAttributes"].as_object().map_or(0, |a| {
                        a.iter().map(|(k, v)| k.len() + v.to_string().len()).sum()
                    })
            })
            .sum()
    })
}

fn key_of(item: &serde_json::Map<String, Value>, key: &[String]) -> String {
    key.iter()
        .map(|k| item.get(k).map(Value::to_string).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("|")
}

fn index_key(item: &serde_json::Map<String, Value>, key: &[String]) -> Option<Vec<String>> {
    key.iter()
        .map(|k| item.get(k).map(Value::to_string))
        .collect()
}

impl Observer for Meter {
    fn name(&self) -> &'static str {
        "stepline-bench-meter"
    }

    fn request(&self, call: HttpCall, bag: &mut ConfigBag) -> Result<(), BoxError> {
        bag.interceptor_state().store_put(Started {
            at: Instant::now(),
            target: call.operation(),
            body: call.body,
        });
        Ok(())
    }

    fn ended(&self, status: u16, body: &[u8], bag: &ConfigBag) {
        if let Some(started) = bag.load::<Started>() {
            self.record(started.at, &started.target, &started.body, status, body);
        }
    }
}
