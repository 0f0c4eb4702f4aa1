//! The worker protocol's document (`docs/protocol.md`) and JSON Schemas (`docs/schemas`) against the
//! Rust types and what the coordinator and the worker runtime really send:
//!
//! - fully populated and minimal Rust values of every message validate against its schema, and each
//!   schema's `required` list is exactly the set of fields the Rust reader cannot do without (found by
//!   removing each field in turn), its `properties` exactly the fields a full value has;
//! - every JSON example of the document (a ```` ```json ```` block after an `<!-- example: NAME -->`
//!   marker) validates against the schema NAME and decodes with the Rust reader;
//! - the messages a coordinator over in-memory ports and the worker runtime send in a few runs
//!   validate against their schemas.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use boon::{Compiler, SchemaIndex, Schemas};
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use stepline::adapters::eventbridge::EVENT_SOURCE;
use stepline::adapters::{
    InMemoryExecutionStore, InMemoryFanOutLedger, InMemoryReleaseRegistry, RecordingSender,
};
use stepline::aws_lambda_events::event::sqs::{SqsEvent, SqsMessage};
use stepline::domain::execution::LifecycleKind;
use stepline::domain::payload::PayloadRef;
use stepline::domain::{ParentLink, PipelineDef, Status, StepDef, StepError, Timestamp, Verdict};
use stepline::envelope::{
    AwaitNotice, DeadLetterEnvelope, Identity, InteractionMessage, NoticeInteraction, RawRequest,
    ReplyEnvelope, ReplyOutcome, RequestEnvelope, RequestHeader, StartDetail, StartEvent,
    WorkerAnnouncement, AWAIT_NOTICE_KIND, CANCEL_KIND, DEAD_LETTER_KIND, DETAIL_ATTRIBUTE,
    INTERACTION_KIND, REASON_ATTRIBUTE, REPLY_KIND, REQUEST_KIND, SOURCE_ATTRIBUTE,
    START_DETAIL_TYPE, WORKER_KIND,
};
use stepline::handlers::{self, CancelRequest};
use stepline::ports::{BusEvent, EventPublisher, SystemClock};
use stepline::release::{WorkerHealth, WorkerState};
use stepline::worker::{Heartbeat, StepFunction, Worker};
use stepline::{Code, Coordinator, Settings, SubmitRequest};

/// Every schema, by the name of its file (`<name>.schema.json`) and of the document's examples.
const MESSAGES: [&str; 11] = [
    "request",
    "reply",
    "cancel-notice",
    "await-notice",
    "interaction",
    "dead-letter",
    "lifecycle-event",
    "start-event",
    "payload-ref",
    "step-error",
    "worker",
];

/// The document's example of the attributes of a dead-lettered request (no schema of its own).
const ATTRIBUTES_EXAMPLE: &str = "dead-letter-attributes";

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .canonicalize()
        .expect("the docs folder")
}

/// The schemas, compiled, and their source (to read `required` and `properties`).
struct Protocol {
    schemas: Schemas,
    index: BTreeMap<&'static str, SchemaIndex>,
    /// Each schema file's JSON, by file name.
    files: BTreeMap<String, Value>,
}

impl Protocol {
    fn load() -> Self {
        let dir = docs().join("schemas");
        let mut compiler = Compiler::new();
        compiler.enable_format_assertions();
        let mut schemas = Schemas::new();
        let mut index = BTreeMap::new();
        let mut files = BTreeMap::new();
        for name in MESSAGES {
            let file = format!("{name}.schema.json");
            let path = dir.join(&file);
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
            let schema: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(schema["$id"], json!(file), "{file}: $id");
            assert_eq!(
                schema["$schema"],
                json!("https://json-schema.org/draft/2020-12/schema"),
                "{file}: draft"
            );
            let compiled = compiler
                .compile(path.to_str().expect("a UTF-8 path"), &mut schemas)
                .unwrap_or_else(|e| panic!("{file} does not compile: {e:#}"));
            index.insert(name, compiled);
            files.insert(file, schema);
        }
        let listed: BTreeSet<String> = std::fs::read_dir(&dir)
            .expect("docs/schemas")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            // Pipeline files' schema: checked by tests/pipeline_files.rs.
            .filter(|name| name != "pipeline.schema.json")
            .collect();
        assert_eq!(
            listed,
            files.keys().cloned().collect(),
            "docs/schemas holds exactly the schemas checked here"
        );
        Self {
            schemas,
            index,
            files,
        }
    }

    fn validate(&self, name: &str, value: &Value) -> Result<(), String> {
        let index = *self
            .index
            .get(name)
            .unwrap_or_else(|| panic!("no schema {name}"));
        self.schemas
            .validate(value, index)
            .map_err(|e| format!("{e:#}"))
    }

    fn assert_valid(&self, name: &str, value: &Value, what: &str) {
        if let Err(e) = self.validate(name, value) {
            panic!("{what} does not match {name}.schema.json: {e}\n{value:#}");
        }
    }

    /// The schema nodes that describe `data` at `node` of `file`: the node itself, what its `$ref`
    /// names, and the `anyOf`/`oneOf` branch that fits `data`.
    fn expand(&self, file: &str, node: &Value, data: &Value) -> Vec<(String, Value)> {
        let mut out = vec![(file.to_string(), node.clone())];
        if let Some(reference) = node.get("$ref").and_then(Value::as_str) {
            let (target, fragment) = reference.split_once('#').unwrap_or((reference, ""));
            let target = if target.is_empty() { file } else { target };
            let root = self
                .files
                .get(target)
                .unwrap_or_else(|| panic!("{file} refers to unknown {target}"));
            let resolved = root
                .pointer(fragment)
                .unwrap_or_else(|| panic!("{file}: {reference} names nothing"))
                .clone();
            out.extend(self.expand(target, &resolved, data));
        }
        for combinator in ["anyOf", "oneOf"] {
            let Some(branches) = node.get(combinator).and_then(Value::as_array) else {
                continue;
            };
            if let Some(branch) = branches.iter().find(|b| self.fits(file, b, data)) {
                out.extend(self.expand(file, branch, data));
            }
        }
        out
    }

    /// Whether branch `node` is the one meant for `data`: a `null` branch for null, an object branch
    /// whose `status` constant (if any) is the data's for an object.
    fn fits(&self, file: &str, node: &Value, data: &Value) -> bool {
        let facets = self.expand(file, node, &Value::Null);
        let is_null_branch = facets.iter().any(|(_, n)| n["type"] == json!("null"));
        if data.is_null() || is_null_branch {
            return data.is_null() && is_null_branch;
        }
        facets
            .iter()
            .all(|(_, n)| match n.pointer("/properties/status/const") {
                Some(status) => data.get("status") == Some(status),
                None => true,
            })
    }

    /// The `properties` and `required` of the object schema of message `name` at `pointer` of `data`.
    fn object_at(
        &self,
        name: &str,
        pointer: &str,
        data: &Value,
    ) -> (BTreeSet<String>, BTreeSet<String>) {
        let file = format!("{name}.schema.json");
        let mut facets = self.expand(&file, &self.files[&file], data);
        let mut here = data;
        for token in pointer.split('/').skip(1) {
            let next_data = match (here, token.parse::<usize>()) {
                (Value::Array(items), Ok(i)) => &items[i],
                _ => &here[token],
            };
            let mut next = Vec::new();
            for (f, node) in &facets {
                if let Some(child) = node.pointer(&format!("/properties/{token}")) {
                    next.extend(self.expand(f, child, next_data));
                }
                if here.is_array() {
                    if let Some(items) = node.get("items") {
                        next.extend(self.expand(f, items, next_data));
                    }
                }
            }
            assert!(!next.is_empty(), "{name}: no schema for {pointer}");
            facets = next;
            here = next_data;
        }
        let mut properties = BTreeSet::new();
        let mut required = BTreeSet::new();
        for (_, node) in &facets {
            if let Some(p) = node.get("properties").and_then(Value::as_object) {
                properties.extend(p.keys().cloned());
            }
            if let Some(r) = node.get("required").and_then(Value::as_array) {
                required.extend(r.iter().map(|k| k.as_str().expect("a name").to_string()));
            }
        }
        (properties, required)
    }

    /// The values of the `enum` at `pointer` of schema `name`.
    fn enum_at(&self, name: &str, pointer: &str) -> BTreeSet<String> {
        self.files[&format!("{name}.schema.json")]
            .pointer(pointer)
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("{name}: no enum at {pointer}"))
            .iter()
            .map(|v| v.as_str().expect("a string").to_string())
            .collect()
    }
}

/// How a cancel notice is read: its header alone (its payload is null, or absent).
#[derive(Deserialize)]
#[allow(dead_code)]
struct CancelNotice {
    header: RequestHeader,
}

fn decode<T: serde::de::DeserializeOwned>(text: &str) -> Result<(), String> {
    serde_json::from_str::<T>(text)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Reads `text` as the Rust side reads message `name`.
fn read(name: &str, text: &str) -> Result<(), String> {
    match name {
        "request" => serde_json::from_str::<RawRequest>(text)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "cancel-notice" => decode::<CancelNotice>(text),
        "reply" => decode::<ReplyEnvelope>(text),
        "await-notice" => decode::<AwaitNotice>(text),
        "interaction" => decode::<InteractionMessage>(text),
        "dead-letter" => decode::<DeadLetterEnvelope>(text),
        "start-event" => decode::<StartEvent>(text),
        "step-error" => decode::<StepError>(text),
        "worker" => decode::<WorkerAnnouncement>(text),
        "payload-ref" => {
            let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            PayloadRef::of(&value)
                .map(|_| ())
                .ok_or_else(|| "not a payload reference".to_string())
        }
        "lifecycle-event" => {
            // Nothing in Rust reads a lifecycle event; its kind is a `LifecycleKind`.
            let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            serde_json::from_value::<LifecycleKind>(value["detail-type"].clone())
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        other => panic!("no reader for {other}"),
    }
}

fn read_value(name: &str, value: &Value) -> Result<(), String> {
    read(name, &serde_json::to_string(value).expect("serializes"))
}

// ------------------------------------------------------------------------------------- values

const EXECUTION: Uuid = Uuid::from_u128(0xb0ea26db_e51f_4800_8dbc_2afc1b4e7a5a);
const LAUNCH: Uuid = Uuid::from_u128(0x20550480_9c81_5a42_a2e3_5d4ad19bea39);
const UNIT: Uuid = Uuid::from_u128(0x1d02cb70_53cb_4cd4_a565_d66045713872);

fn identity() -> Identity {
    Identity {
        pipeline_id: "orders".into(),
        contract_version: format!("sha256:{}", "c".repeat(64)),
        release_version: "2".into(),
    }
}

fn reference() -> PayloadRef {
    let sha256 = "2".repeat(64);
    PayloadRef {
        bucket: "payloads".into(),
        key: format!("payloads/{EXECUTION}/{sha256}"),
        size: 104_857_600,
        sha256,
    }
}

fn header(kind: &str, token: &str) -> RequestHeader {
    RequestHeader {
        kind: kind.into(),
        identity: identity(),
        tenant: "acme".into(),
        execution_id: EXECUTION,
        step_id: "price".into(),
        step_index: 1,
        attempt: 2,
        launch_id: LAUNCH,
        step_key: "5b0f3c2a9e8d7f6e1a2b3c4d5e6f7a8b".into(),
        reply_to: "replies".into(),
        deadline: Timestamp::from_millis(1_764_633_660_000),
        reply_token: token.into(),
    }
}

fn full_error() -> StepError {
    StepError {
        detail: Some(reference().to_value()),
        ..StepError::new("INVALID_ORDER", "line 3...", false)
    }
}

fn to_value(value: &impl serde::Serialize) -> Value {
    serde_json::to_value(value).expect("serializes")
}

/// A message's Rust values: fully populated ones and minimal ones, and where their objects the Rust
/// reader decodes field by field are (JSON pointers; free-form values such as payloads excluded).
struct Values {
    name: &'static str,
    full: Vec<Value>,
    minimal: Vec<Value>,
    objects: &'static [&'static str],
}

fn values() -> Vec<Values> {
    let token = "7aabd6496b67527eefeb354d9b5afcd9";
    let payload = json!({"orderId": "order-1", "lines": [reference().to_value()]});
    let reply = |token: &str, outcome| {
        to_value(&ReplyEnvelope::for_request(
            &header(REQUEST_KIND, token),
            outcome,
        ))
    };
    let link = ParentLink {
        execution_id: EXECUTION,
        interaction: "item-000001".into(),
        token: token.into(),
        complete_to: "replies".into(),
        unit: Some(UNIT),
        step: 3,
        signature: Some("ab".repeat(32)),
    };
    vec![
        Values {
            name: "request",
            full: vec![to_value(&RequestEnvelope {
                header: header(REQUEST_KIND, token),
                payload: &payload,
            })],
            minimal: vec![to_value(&RequestEnvelope {
                header: header(REQUEST_KIND, ""),
                payload: &Value::Null,
            })],
            objects: &["", "/header", "/header/identity"],
        },
        Values {
            name: "cancel-notice",
            full: vec![to_value(&RequestEnvelope {
                header: header(CANCEL_KIND, token),
                payload: &Value::Null,
            })],
            minimal: vec![json!({"header": to_value(&header(CANCEL_KIND, ""))})],
            objects: &["", "/header", "/header/identity"],
        },
        Values {
            name: "reply",
            full: vec![
                reply(
                    token,
                    ReplyOutcome::Succeeded {
                        output: payload.clone(),
                    },
                ),
                reply(
                    token,
                    ReplyOutcome::Failed {
                        error: full_error(),
                    },
                ),
                reply(token, ReplyOutcome::Running),
            ],
            minimal: vec![
                reply(
                    "",
                    ReplyOutcome::Succeeded {
                        output: Value::Null,
                    },
                ),
                reply(
                    "",
                    ReplyOutcome::Failed {
                        error: StepError::new("E", "", true),
                    },
                ),
                reply("", ReplyOutcome::Running),
            ],
            objects: &["", "/identity", "/outcome", "/outcome/error"],
        },
        Values {
            name: "await-notice",
            full: vec![to_value(&AwaitNotice {
                kind: AWAIT_NOTICE_KIND.into(),
                execution_id: EXECUTION,
                tenant: "acme".into(),
                pipeline_id: "orders".into(),
                release_version: "2".into(),
                step_id: "approve".into(),
                step_index: 2,
                await_unit_id: UNIT,
                deadline: Timestamp::from_millis(1_764_720_000_000),
                interactions: vec![NoticeInteraction {
                    id: "manager".into(),
                    idempotency_key: format!("{UNIT}/manager"),
                    token: token.into(),
                }],
                input: payload.clone(),
                complete_to: "replies".into(),
            })],
            minimal: vec![to_value(&AwaitNotice {
                kind: AWAIT_NOTICE_KIND.into(),
                execution_id: EXECUTION,
                tenant: String::new(),
                pipeline_id: String::new(),
                release_version: String::new(),
                step_id: String::new(),
                step_index: 0,
                await_unit_id: UNIT,
                deadline: Timestamp::from_millis(0),
                interactions: Vec::new(),
                input: Value::Null,
                complete_to: String::new(),
            })],
            objects: &["", "/interactions/0"],
        },
        Values {
            name: "interaction",
            full: vec![to_value(&InteractionMessage {
                unit: Some(UNIT),
                ..InteractionMessage::approving(&link, json!({"approvedBy": "dana"}))
            })],
            minimal: vec![json!({
                "kind": INTERACTION_KIND, "executionId": EXECUTION, "interaction": "manager",
                "token": token, "verdict": Verdict::Rejected,
            })],
            objects: &[""],
        },
        Values {
            name: "dead-letter",
            full: vec![to_value(&DeadLetterEnvelope {
                kind: DEAD_LETTER_KIND.into(),
                dead_letter_id: UNIT,
                execution_id: EXECUTION,
                tenant: "acme".into(),
                pipeline_id: "orders".into(),
                release_version: "2".into(),
                status: Status::Failed,
                step_index: 1,
                step_id: "price".into(),
                attempt: 3,
                error: Some(full_error()),
                failed_at: Timestamp::from_millis(1_764_633_600_000),
                version: 9,
            })],
            minimal: vec![to_value(&DeadLetterEnvelope {
                kind: DEAD_LETTER_KIND.into(),
                dead_letter_id: UNIT,
                execution_id: EXECUTION,
                tenant: String::new(),
                pipeline_id: String::new(),
                release_version: String::new(),
                status: Status::Dlq,
                step_index: 0,
                step_id: String::new(),
                attempt: 0,
                error: None,
                failed_at: Timestamp::from_millis(0),
                version: 0,
            })],
            objects: &["", "/error"],
        },
        Values {
            name: "start-event",
            full: vec![to_value(&StartEvent {
                id: "0e2f1f6c-5a0c-4d8e-9b2a-7f3c1d4e5a6b".into(),
                detail_type: START_DETAIL_TYPE.into(),
                source: "shop.checkout".into(),
                detail: StartDetail {
                    pipeline_id: "orders".into(),
                    tenant: "acme".into(),
                    input: payload.clone(),
                    release_version: Some("2".into()),
                    parent: Some(link.clone()),
                },
            })],
            minimal: vec![to_value(&StartEvent {
                id: "e".into(),
                detail_type: START_DETAIL_TYPE.into(),
                source: String::new(),
                detail: StartDetail {
                    pipeline_id: "orders".into(),
                    tenant: "acme".into(),
                    input: Value::Null,
                    release_version: None,
                    parent: Some(ParentLink {
                        unit: None,
                        step: 0,
                        ..link.clone()
                    }),
                },
            })],
            objects: &["", "/detail", "/detail/parent"],
        },
        Values {
            name: "payload-ref",
            full: vec![reference().to_value()],
            minimal: vec![PayloadRef {
                size: 0,
                ..reference()
            }
            .to_value()],
            objects: &[""],
        },
        Values {
            name: "step-error",
            full: vec![to_value(&full_error())],
            minimal: vec![to_value(&StepError::new("E", "", false))],
            objects: &[""],
        },
        Values {
            name: "worker",
            full: worker_states()
                .into_iter()
                .map(|state| {
                    to_value(&WorkerAnnouncement::new(
                        UNIT.to_string(),
                        identity(),
                        "orders-requests",
                        state,
                    ))
                })
                .collect(),
            // The queue is not known before a worker's first batch.
            minimal: vec![to_value(&WorkerAnnouncement::new(
                "w",
                identity(),
                "",
                WorkerState::Healthy,
            ))],
            objects: &["", "/identity"],
        },
    ]
}

/// The names of the fields of the object at `pointer` of `value` without which the Rust reader of
/// message `name` fails.
fn rust_required(name: &str, value: &Value, pointer: &str) -> BTreeSet<String> {
    let object = value
        .pointer(pointer)
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("{name}: no object at {pointer:?}"));
    let mut required = BTreeSet::new();
    for key in object.keys() {
        let mut without = value.clone();
        without
            .pointer_mut(pointer)
            .and_then(Value::as_object_mut)
            .expect("the object")
            .remove(key);
        if read_value(name, &without).is_err() {
            required.insert(key.clone());
        }
    }
    required
}

#[test]
fn rust_values_match_their_schemas_and_required_fields_are_what_rust_requires() {
    let protocol = Protocol::load();
    let all = values();
    let covered: BTreeSet<&str> = all.iter().map(|v| v.name).collect();
    let expected: BTreeSet<&str> = MESSAGES
        .into_iter()
        .filter(|m| *m != "lifecycle-event")
        .collect();
    assert_eq!(
        covered, expected,
        "every message with a Rust type is covered"
    );
    for message in &all {
        let name = message.name;
        for value in message.full.iter().chain(&message.minimal) {
            protocol.assert_valid(name, value, &format!("a Rust {name}"));
            if let Err(e) = read_value(name, value) {
                panic!("a Rust {name} does not read back: {e}\n{value:#}");
            }
        }
        for full in &message.full {
            for pointer in message.objects {
                let Some(object) = full.pointer(pointer).and_then(Value::as_object) else {
                    continue;
                };
                let (properties, required) = protocol.object_at(name, pointer, full);
                let present: BTreeSet<String> = object.keys().cloned().collect();
                assert_eq!(
                    properties, present,
                    "{name}.schema.json at {pointer:?}: the properties are the fields of a full Rust value"
                );
                assert_eq!(
                    required,
                    rust_required(name, full, pointer),
                    "{name}.schema.json at {pointer:?}: `required` is what the Rust reader cannot do without"
                );
                // The schema never lets through a null that Rust refuses.
                for key in object.keys() {
                    let mut nulled = full.clone();
                    nulled.pointer_mut(pointer).expect("the object")[key.as_str()] = Value::Null;
                    if protocol.validate(name, &nulled).is_ok() {
                        assert!(
                            read_value(name, &nulled).is_ok(),
                            "{name}.schema.json at {pointer:?} accepts a null {key} that Rust refuses"
                        );
                    }
                }
            }
        }
    }
}

/// Every variant of `$enum`, listed: the match fails to compile when one is added.
macro_rules! every {
    ($enum:ident: $($variant:ident),+ $(,)?) => {{
        let all = vec![$($enum::$variant),+];
        for value in &all {
            match value {
                $($enum::$variant)|+ => {}
            }
        }
        all
    }};
}

/// Every `Status`, `LifecycleKind`, worker state and health, and `Verdict`.
fn statuses() -> Vec<Status> {
    every!(Status: Queued, Running, WaitingExternal, WaitRetry, Succeeded, Failed, Dlq, Cancelled)
}

fn lifecycle_kinds() -> Vec<LifecycleKind> {
    every!(LifecycleKind: ExecutionStarted, StepSucceeded, StepFailed, AwaitRequested,
        ExecutionSucceeded, ExecutionFailed, ExecutionCancelled)
}

fn worker_states() -> Vec<WorkerState> {
    every!(WorkerState: Healthy, Draining)
}

fn worker_healths() -> Vec<WorkerHealth> {
    every!(WorkerHealth: Healthy, Stale, Draining)
}

/// `ms` as the document writes it: `300,000 ms`.
fn written_ms(ms: i64) -> String {
    let digits = ms.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    format!("{out} ms")
}

fn verdicts() -> Vec<Verdict> {
    every!(Verdict: Approved, Rejected)
}

fn wire_names<T: serde::Serialize>(values: &[T]) -> BTreeSet<String> {
    values
        .iter()
        .map(|v| to_value(v).as_str().expect("a string").to_string())
        .collect()
}

#[test]
fn enumerations_and_constants_match_the_types() {
    let protocol = Protocol::load();
    assert_eq!(
        protocol.enum_at("dead-letter", "/properties/status/enum"),
        wire_names(&statuses())
    );
    assert_eq!(
        protocol.enum_at("interaction", "/properties/verdict/enum"),
        wire_names(&verdicts())
    );
    assert_eq!(
        protocol.enum_at("worker", "/properties/state/enum"),
        wire_names(&worker_states())
    );
    let kinds = lifecycle_kinds();
    assert_eq!(
        protocol.enum_at("lifecycle-event", "/properties/detail-type/enum"),
        wire_names(&kinds)
    );
    for kind in kinds {
        // The coordinator names an event by its kind's Debug form.
        assert_eq!(json!(format!("{kind:?}")), to_value(&kind));
    }
    let constant = |name: &str, pointer: &str| {
        protocol.files[&format!("{name}.schema.json")]
            .pointer(pointer)
            .unwrap_or_else(|| panic!("{name}: no const at {pointer}"))
            .clone()
    };
    assert_eq!(
        constant("request", "/properties/header/properties/kind/const"),
        json!(REQUEST_KIND)
    );
    assert_eq!(
        constant("cancel-notice", "/properties/header/properties/kind/const"),
        json!(CANCEL_KIND)
    );
    assert_eq!(
        constant("reply", "/properties/kind/const"),
        json!(REPLY_KIND)
    );
    assert_eq!(
        constant("await-notice", "/properties/kind/const"),
        json!(AWAIT_NOTICE_KIND)
    );
    assert_eq!(
        constant("interaction", "/properties/kind/const"),
        json!(INTERACTION_KIND)
    );
    assert_eq!(
        constant("dead-letter", "/properties/kind/const"),
        json!(DEAD_LETTER_KIND)
    );
    assert_eq!(
        constant("worker", "/properties/kind/const"),
        json!(WORKER_KIND)
    );
    assert_eq!(
        constant("start-event", "/properties/detail-type/const"),
        json!(START_DETAIL_TYPE)
    );
    assert_eq!(
        constant("lifecycle-event", "/properties/source/const"),
        json!(EVENT_SOURCE)
    );
    assert_eq!(
        constant("payload-ref", "/properties/$stepline/const"),
        json!(stepline::domain::payload::PAYLOAD_REF)
    );
    assert_eq!(stepline::domain::payload::REF_FIELD, "$stepline");

    let document = std::fs::read_to_string(docs().join("protocol.md")).expect("protocol.md");
    for named in [
        REQUEST_KIND,
        REPLY_KIND,
        CANCEL_KIND,
        AWAIT_NOTICE_KIND,
        INTERACTION_KIND,
        DEAD_LETTER_KIND,
        WORKER_KIND,
        START_DETAIL_TYPE,
        REASON_ATTRIBUTE,
        DETAIL_ATTRIBUTE,
        SOURCE_ATTRIBUTE,
        Code::IdentityMismatch.as_str(),
        Code::Undecodable.as_str(),
        Code::Unauthenticated.as_str(),
        Code::ReceiptConflict.as_str(),
        Code::PayloadUnresolvable.as_str(),
        Code::PayloadUnavailable.as_str(),
        Code::PayloadTooLarge.as_str(),
        Code::UndecodableInput.as_str(),
        Code::StepTimeout.as_str(),
        Code::ReleaseDraining.as_str(),
        Code::InvalidRequest.as_str(),
    ] {
        assert!(
            document.contains(&format!("`{named}`")),
            "protocol.md names `{named}`"
        );
    }
    for kind in lifecycle_kinds() {
        assert!(
            document.contains(&format!("`{kind:?}`")),
            "protocol.md names `{kind:?}`"
        );
    }
    // The worker healths the coordinator derives, and the periods it derives them with.
    for health in wire_names(&worker_healths()) {
        assert!(
            document.contains(&format!("`{health}`")),
            "protocol.md names `{health}`"
        );
    }
    for span in [
        stepline::release::ANNOUNCE_EVERY,
        stepline::release::STALE_AFTER,
    ] {
        let written = written_ms(span.as_millis() as i64);
        assert!(document.contains(&written), "protocol.md says {written}");
    }
}

// ---------------------------------------------------------------------------- the document

/// The document's examples: (marker name, JSON). Every ```json block must follow a marker.
fn examples() -> Vec<(String, Value)> {
    let document = std::fs::read_to_string(docs().join("protocol.md")).expect("protocol.md");
    let mut found = Vec::new();
    let mut lines = document.lines().enumerate();
    let mut marker: Option<String> = None;
    while let Some((number, line)) = lines.next() {
        let line = line.trim();
        if let Some(name) = line
            .strip_prefix("<!-- example: ")
            .and_then(|rest| rest.strip_suffix(" -->"))
        {
            marker = Some(name.trim().to_string());
            continue;
        }
        if line == "```json" {
            let name = marker.take().unwrap_or_else(|| {
                panic!(
                    "protocol.md:{}: a JSON block without an example marker",
                    number + 1
                )
            });
            let mut text = String::new();
            for (_, body) in lines.by_ref() {
                if body.trim() == "```" {
                    break;
                }
                text.push_str(body);
                text.push('\n');
            }
            let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!(
                    "protocol.md:{}: example {name} is not JSON: {e}",
                    number + 1
                )
            });
            found.push((name, value));
            continue;
        }
        if !line.is_empty() {
            marker = None;
        }
    }
    found
}

#[test]
fn the_documents_examples_match_their_schemas_and_decode() {
    let protocol = Protocol::load();
    let examples = examples();
    let mut shown = BTreeSet::new();
    let mut request_header = None;
    for (name, value) in &examples {
        if name == ATTRIBUTES_EXAMPLE {
            check_attributes_example(value);
            continue;
        }
        assert!(
            MESSAGES.contains(&name.as_str()),
            "protocol.md: example of unknown message {name}"
        );
        protocol.assert_valid(name, value, &format!("protocol.md's example {name}"));
        if let Err(e) = read_value(name, value) {
            panic!("protocol.md's example {name} does not decode: {e}\n{value:#}");
        }
        if name == "request" {
            let header: RequestHeader =
                serde_json::from_value(value["header"].clone()).expect("a header");
            assert_eq!(header.kind, REQUEST_KIND);
            request_header = Some(header);
        }
        shown.insert(name.as_str());
    }
    let all: BTreeSet<&str> = MESSAGES.into_iter().collect();
    assert_eq!(shown, all, "protocol.md shows an example of every message");

    // The replies shown answer the request shown, as the runtime builds them.
    let header = request_header.expect("a request example");
    for (_, value) in examples.iter().filter(|(name, _)| name == "reply") {
        let reply: ReplyEnvelope = serde_json::from_value(value.clone()).expect("a reply");
        assert_eq!(
            reply,
            ReplyEnvelope::for_request(&header, reply.outcome.clone()),
            "protocol.md's reply example copies the request's header"
        );
    }
    // The cancel notice names the same launch.
    let (_, cancel) = examples
        .iter()
        .find(|(name, _)| name == "cancel-notice")
        .expect("a cancel notice");
    let cancel: RequestHeader = serde_json::from_value(cancel["header"].clone()).expect("a header");
    assert_eq!(cancel.kind, CANCEL_KIND);
    assert_eq!(cancel.launch_id, header.launch_id);
}

fn check_attributes_example(value: &Value) {
    let attributes = value.as_object().expect("attributes");
    let names: BTreeSet<&str> = attributes.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        BTreeSet::from([REASON_ATTRIBUTE, DETAIL_ATTRIBUTE, SOURCE_ATTRIBUTE])
    );
    for attribute in attributes.values() {
        assert_eq!(attribute["DataType"], json!("String"));
        assert!(attribute["StringValue"].is_string());
    }
    let reason = attributes[REASON_ATTRIBUTE]["StringValue"]
        .as_str()
        .expect("text");
    assert!(Code::parse(reason).is_some(), "{reason} is a code");
}

// ------------------------------------------------------------------ what is really sent

/// Keeps every lifecycle event published.
#[derive(Default)]
struct Published(Mutex<Vec<BusEvent>>);

#[async_trait]
impl EventPublisher for Published {
    async fn publish(&self, events: &[BusEvent]) -> Vec<Result<(), String>> {
        self.0
            .lock()
            .expect("events")
            .extend(events.iter().cloned());
        events.iter().map(|_| Ok(())).collect()
    }
}

/// A bus event as EventBridge delivers it to a target.
fn delivered(event: &BusEvent) -> Value {
    json!({
        "version": "0",
        "id": Uuid::new_v4(),
        "detail-type": event.detail_type,
        "source": EVENT_SOURCE,
        "account": "123456789012",
        "time": "2025-12-02T00:00:00Z",
        "region": "eu-west-1",
        "resources": [],
        "detail": event.detail,
    })
}

fn sqs(bodies: &[String]) -> SqsEvent {
    let mut event = SqsEvent::default();
    for (i, body) in bodies.iter().enumerate() {
        let mut message = SqsMessage::default();
        message.message_id = Some(format!("m{i}"));
        message.body = Some(body.clone());
        event.records.push(message);
    }
    event
}

fn settings() -> Settings {
    let mut settings = Settings {
        instance: "protocol".into(),
        ..Settings::named()
    };
    settings.queues.start = Some("start".into());
    settings
}

async fn coordinator(
    definitions: Vec<PipelineDef>,
) -> (Coordinator, Arc<RecordingSender>, Arc<Published>) {
    let registry = Arc::new(InMemoryReleaseRegistry::activated(definitions, "test").await);
    let sender = Arc::new(RecordingSender::default());
    let published = Arc::new(Published::default());
    let coordinator = Coordinator::new(
        Arc::new(InMemoryExecutionStore::default()),
        registry,
        sender.clone(),
        Arc::new(SystemClock),
        settings(),
    )
    .with_ledger(Arc::new(InMemoryFanOutLedger::default()))
    .with_keys(Arc::new(stepline::adapters::MemoryKeys::default()))
    .with_publisher(published.clone());
    (coordinator, sender, published)
}

/// The bodies sent to `queue`, taken from `sent`.
fn bodies(sent: &[(String, stepline::ports::OutMessage)], queue: &str) -> Vec<Value> {
    sent.iter()
        .filter(|(q, _)| q == queue)
        .map(|(_, m)| serde_json::from_str(&m.body).expect("a JSON body"))
        .collect()
}

async fn submit(coordinator: &Coordinator, pipeline_id: &str, input: Value) -> Uuid {
    let request = SubmitRequest {
        pipeline_id: pipeline_id.into(),
        tenant: "acme".into(),
        input,
        ..Default::default()
    };
    coordinator
        .submit(request)
        .await
        .expect("submitted")
        .execution
}

#[tokio::test]
async fn messages_the_coordinator_sends_match_their_schemas() {
    let protocol = Protocol::load();
    let task = |id: &str| StepDef::task(id, "requests").timeout_secs(60);
    let (coordinator, sender, published) = coordinator(vec![
        PipelineDef::new("orders", "1", [task("price"), task("ship")]),
        PipelineDef::new(
            "approvals",
            "1",
            [
                StepDef::await_step("approve", "approvals").interactions(["manager"]),
                task("after"),
            ],
        ),
        PipelineDef::new("spread", "1", [StepDef::fan_out("each", "leaf")]),
        PipelineDef::new("leaf", "1", [task("leaf")]),
    ])
    .await;

    // A request, answered with a final failure: a dead-letter envelope.
    submit(&coordinator, "orders", json!({"orderId": "order-1"})).await;
    let sent = sender.drain();
    let requests = bodies(&sent, "requests");
    assert_eq!(requests.len(), 1, "{sent:?}");
    protocol.assert_valid("request", &requests[0], "a request the coordinator sent");
    let header: RequestHeader =
        serde_json::from_value(requests[0]["header"].clone()).expect("a header");
    let (token, sealed) = stepline::domain::seal::split_token(&header.reply_token);
    assert!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "a reply token of 128 bits in hex, then the sealed record: {}",
        header.reply_token
    );
    assert!(sealed.is_some(), "the request carries its record sealed");
    let failure = ReplyEnvelope::for_request(
        &header,
        ReplyOutcome::Failed {
            error: StepError::new("INVALID_ORDER", "no lines", false),
        },
    );
    let failure = serde_json::to_string(&failure).expect("serializes");
    protocol.assert_valid(
        "reply",
        &serde_json::from_str(&failure).expect("JSON"),
        "a reply",
    );
    let response = handlers::completion(&coordinator, sqs(&[failure])).await;
    assert!(response.batch_item_failures.is_empty());
    let sent = sender.drain();
    let envelopes = bodies(&sent, "execution-dlq");
    assert_eq!(envelopes.len(), 1, "{sent:?}");
    protocol.assert_valid("dead-letter", &envelopes[0], "a dead-letter envelope");

    // A running step cancelled: a cancel notice.
    let cancelled = submit(&coordinator, "orders", json!({"orderId": "order-2"})).await;
    sender.drain();
    coordinator
        .cancel(CancelRequest {
            execution_id: cancelled,
            reason: "customer left".into(),
        })
        .await
        .expect("cancelled");
    let sent = sender.drain();
    let notices = bodies(&sent, "requests");
    assert_eq!(notices.len(), 1, "{sent:?}");
    assert_eq!(notices[0]["header"]["kind"], json!(CANCEL_KIND));
    protocol.assert_valid("cancel-notice", &notices[0], "a cancel notice");

    // An await step: its notice, then a completion through the reply queue.
    submit(&coordinator, "approvals", json!({"totalCents": 500})).await;
    let sent = sender.drain();
    let notices = bodies(&sent, "approvals");
    assert_eq!(notices.len(), 1, "{sent:?}");
    protocol.assert_valid("await-notice", &notices[0], "an await notice");
    let notice: AwaitNotice = serde_json::from_value(notices[0].clone()).expect("a notice");
    let completion = InteractionMessage {
        kind: INTERACTION_KIND.into(),
        execution_id: notice.execution_id,
        interaction: notice.interactions[0].id.clone(),
        token: notice.interactions[0].token.clone(),
        verdict: Verdict::Approved,
        payload: json!({"approvedBy": "dana"}),
        unit: Some(notice.await_unit_id),
    };
    let completion = to_value(&completion);
    protocol.assert_valid("interaction", &completion, "an interaction completion");
    let response = handlers::completion(&coordinator, sqs(&[completion.to_string()])).await;
    assert!(response.batch_item_failures.is_empty());
    let sent = sender.drain();
    let requests = bodies(&sent, "requests");
    assert_eq!(requests.len(), 1, "the step after the approval: {sent:?}");
    protocol.assert_valid("request", &requests[0], "a request after an await step");

    // A fan-out: one start event per item on the start queue.
    submit(
        &coordinator,
        "spread",
        json!({"items": [{"n": 1}, {"n": 2}]}),
    )
    .await;
    let sent = sender.drain();
    let starts = bodies(&sent, "start");
    assert_eq!(starts.len(), 2, "{sent:?}");
    for start in &starts {
        protocol.assert_valid("start-event", start, "a fan-out child's start event");
    }

    // Lifecycle events of all of the above.
    let events = published.0.lock().expect("events").clone();
    let kinds: BTreeSet<&str> = events.iter().map(|e| e.detail_type.as_str()).collect();
    for kind in [
        "ExecutionStarted",
        "StepFailed",
        "ExecutionFailed",
        "ExecutionCancelled",
        "AwaitRequested",
        "StepSucceeded",
    ] {
        assert!(kinds.contains(kind), "a {kind} event among {kinds:?}");
    }
    let (_, required) = protocol.object_at("lifecycle-event", "/detail", &delivered(&events[0]));
    for event in &events {
        let event = delivered(event);
        protocol.assert_valid("lifecycle-event", &event, "a lifecycle event");
        read_value("lifecycle-event", &event).expect("a lifecycle kind");
        let fields: BTreeSet<String> = event["detail"]
            .as_object()
            .expect("a detail")
            .keys()
            .cloned()
            .collect();
        assert_eq!(fields, required, "every detail field is always there");
    }
    // The document's example has the same fields.
    let (_, example) = examples()
        .into_iter()
        .find(|(name, _)| name == "lifecycle-event")
        .expect("a lifecycle example");
    let fields: BTreeSet<String> = example["detail"]
        .as_object()
        .expect("a detail")
        .keys()
        .cloned()
        .collect();
    assert_eq!(fields, required);
}

/// Steps of the worker runtime's run: `slow` beats a few times, `fail` fails, others echo.
struct Steps;

#[async_trait]
impl StepFunction for Steps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_id.as_str() {
            "slow" => {
                tokio::time::sleep(Duration::from_millis(120)).await;
                Ok(input)
            }
            "fail" => Err(StepError::new("PRICING_DOWN", "pricing answered 503", true)),
            _ => Ok(json!({"echo": input})),
        }
    }
}

#[tokio::test]
async fn messages_the_worker_runtime_sends_match_their_schemas() {
    let protocol = Protocol::load();
    let sender = Arc::new(RecordingSender::default());
    let worker = Worker::new(identity(), sender.clone(), Arc::new(Steps))
        .with_dead_letter_queue("request-dlq")
        .with_heartbeat(Heartbeat::Every(Duration::from_millis(20)));
    let request = |step: &str, launch: u128, identity: Identity| {
        let header = RequestHeader {
            step_id: step.into(),
            launch_id: Uuid::from_u128(launch),
            step_key: String::new(),
            identity,
            ..header(REQUEST_KIND, "7aabd6496b67527eefeb354d9b5afcd9")
        };
        serde_json::to_string(&RequestEnvelope {
            header,
            payload: &json!({"orderId": "order-1"}),
        })
        .expect("serializes")
    };
    let stranger = Identity {
        release_version: "3".into(),
        ..identity()
    };
    let misaddressed = request("price", 4, stranger);
    let batch = [
        request("price", 1, identity()),
        request("fail", 2, identity()),
        request("slow", 3, identity()),
        misaddressed.clone(),
    ];
    let response = worker.handle(sqs(&batch)).await;
    assert!(response.batch_item_failures.is_empty());
    let sent = sender.drain();

    let replies = bodies(&sent, "replies");
    let mut statuses = BTreeSet::new();
    for reply in &replies {
        protocol.assert_valid("reply", reply, "a reply the worker runtime sent");
        statuses.insert(
            reply["outcome"]["status"]
                .as_str()
                .expect("a status")
                .to_string(),
        );
    }
    assert_eq!(
        statuses,
        BTreeSet::from(["SUCCEEDED".into(), "FAILED".into(), "RUNNING".into()])
    );
    // The misaddressed request: a final failure for the coordinator, and a dead letter.
    let mismatch = replies
        .iter()
        .find(|r| r["launchId"] == json!(Uuid::from_u128(4)))
        .expect("a reply to the misaddressed request");
    assert_eq!(
        mismatch["outcome"]["error"]["code"],
        json!("IDENTITY_MISMATCH")
    );
    assert_eq!(mismatch["outcome"]["error"]["retryable"], json!(false));
    assert_eq!(
        mismatch["identity"]["releaseVersion"],
        json!("3"),
        "the identity as received"
    );
    let dead: Vec<_> = sent.iter().filter(|(q, _)| q == "request-dlq").collect();
    assert_eq!(dead.len(), 1);
    let (_, message) = dead[0];
    assert_eq!(message.body, misaddressed, "the body unchanged");
    let attributes: BTreeMap<&str, &str> = message
        .attributes
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        attributes.keys().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([REASON_ATTRIBUTE, DETAIL_ATTRIBUTE, SOURCE_ATTRIBUTE])
    );
    assert_eq!(attributes[REASON_ATTRIBUTE], "IDENTITY_MISMATCH");
    assert_eq!(
        attributes[SOURCE_ATTRIBUTE], "m3",
        "the rejected message's id"
    );
    assert!(attributes[DETAIL_ATTRIBUTE].len() <= 1024);

    // A redelivered request is answered with the first reply's bytes, without running again.
    let first = sent
        .iter()
        .find(|(q, m)| q == "replies" && m.body.contains(&Uuid::from_u128(1).to_string()))
        .map(|(_, m)| m.body.clone())
        .expect("the first reply");
    worker.handle(sqs(&[batch[0].clone()])).await;
    let again = sender.drain();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1.body, first, "the same bytes");
}

/// Where the runtime's records come from, as an event source mapping names it.
const REQUEST_QUEUE_ARN: &str = "arn:aws:sqs:eu-west-1:123456789012:orders-requests";

/// The announcements among the messages sent to `queue`.
fn announcements(sent: &[(String, stepline::ports::OutMessage)], queue: &str) -> Vec<Value> {
    bodies(sent, queue)
        .into_iter()
        .filter(|body| body["kind"] == json!(WORKER_KIND))
        .collect()
}

/// The one announcement among `sent` to `queue` (`what`), valid by the protocol's schema: as sent,
/// and as read.
fn the_announcement(
    protocol: &Protocol,
    sent: &[(String, stepline::ports::OutMessage)],
    queue: &str,
    what: &str,
) -> (Value, WorkerAnnouncement) {
    let announced = announcements(sent, queue);
    assert_eq!(announced.len(), 1, "one {what}: {sent:?}");
    protocol.assert_valid("worker", &announced[0], what);
    let read = serde_json::from_value(announced[0].clone()).expect("an announcement");
    (announced[0].clone(), read)
}

#[tokio::test]
async fn the_worker_runtimes_announcements_match_their_schema() {
    let protocol = Protocol::load();
    let request = |launch: u128| {
        let header = RequestHeader {
            launch_id: Uuid::from_u128(launch),
            step_key: String::new(),
            ..header(REQUEST_KIND, "7aabd6496b67527eefeb354d9b5afcd9")
        };
        serde_json::to_string(&RequestEnvelope {
            header,
            payload: &json!({"orderId": "order-1"}),
        })
        .expect("serializes")
    };
    let batch = |launch: u128| {
        let mut event = sqs(&[request(launch)]);
        for record in &mut event.records {
            record.event_source_arn = Some(REQUEST_QUEUE_ARN.into());
        }
        event
    };
    // What the runtime announces, but for its random id.
    let expected = |state| WorkerAnnouncement::new("", identity(), "orders-requests", state);
    // A coordinator: announcements need no registered release.
    let (coordinator, coordinator_sent, _) = coordinator(Vec::new()).await;

    // With the reply queue configured, and without it (learned from the requests' `replyTo`).
    for configured in [Some("announcements"), None] {
        let reply_queue = configured.unwrap_or("replies");
        let sender = Arc::new(RecordingSender::default());
        let worker = Worker::new(identity(), sender.clone(), Arc::new(Steps))
            .with_announcements(configured.map(String::from));
        let response = worker.handle(batch(1)).await;
        assert!(response.batch_item_failures.is_empty());
        let (_, healthy) = the_announcement(
            &protocol,
            &sender.drain(),
            reply_queue,
            "announcement the worker runtime sent at its first batch",
        );
        assert!(!healthy.worker_id.is_empty());
        assert_eq!(
            WorkerAnnouncement {
                worker_id: String::new(),
                ..healthy.clone()
            },
            expected(WorkerState::Healthy),
            "its identity, and its queue named after the records' event source"
        );

        // Not again at the next batch (not due for five minutes).
        worker.handle(batch(2)).await;
        assert!(announcements(&sender.drain(), reply_queue).is_empty());

        // Draining: at once, same worker.
        worker.drain().await;
        let (sent_draining, draining) = the_announcement(
            &protocol,
            &sender.drain(),
            reply_queue,
            "draining announcement the worker runtime sent",
        );
        assert_eq!(draining.worker_id, healthy.worker_id, "one id per worker");
        assert_eq!(
            WorkerAnnouncement {
                worker_id: String::new(),
                ..draining
            },
            expected(WorkerState::Draining)
        );

        // The coordinator takes both from its reply queue and lists the worker as draining.
        for announcement in [to_value(&healthy), sent_draining] {
            let response =
                handlers::completion(&coordinator, sqs(&[announcement.to_string()])).await;
            assert!(response.batch_item_failures.is_empty());
        }
        let parked = coordinator_sent.drain();
        assert!(parked.is_empty(), "nothing dead-lettered: {parked:?}");
        let listed = coordinator.workers("orders").await.expect("workers");
        let listed: Vec<_> = listed
            .iter()
            .filter(|(w, _)| w.worker_id == healthy.worker_id)
            .collect();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].1, WorkerHealth::Draining);
        assert_eq!(listed[0].0.queue, "orders-requests");
    }
}
