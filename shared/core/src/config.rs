//! Function configuration, read from environment variables (set by template.yaml, or by the local
//! runner from the same template).

use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("environment variable {0} is not set")]
    Missing(&'static str),
    #[error("environment variable {name} has an invalid value {value:?}")]
    Invalid { name: &'static str, value: String },
}

/// Configuration of the coordinator functions (claim, launch, completion, redrive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorConfig {
    pub execution_table: String,
    pub release_table: String,
    pub queues: Queues,
    /// The bus lifecycle events are published to (none: lifecycle events off).
    pub event_bus: Option<String>,
    /// Shards of the due-time index.
    pub due_shards: u32,
    /// Due times are rounded up to this in the index (0: exact); see `adapters::dynamodb::due_key`.
    pub due_granularity_seconds: u32,
    pub lease_seconds: u32,
    /// Due executions taken per shard and claim run.
    pub claim_limit: i32,
    pub payloads: PayloadConfig,
    /// The Secrets Manager secret (ARN or name) the sealing keys derive from (`SEAL_KEY_SECRET`; none:
    /// requests go unsealed, their replies are read, and fan-outs cannot start children).
    pub seal_key_secret: Option<String>,
}

/// Payloads up to 32 KiB travel inline by default (well under SQS's 256 KiB messages and DynamoDB's
/// 400 KB items); larger ones are claim-checked.
pub const DEFAULT_PAYLOAD_THRESHOLD_BYTES: usize = 32 * 1024;

/// Where claim-checked payloads go (see `claims`): `PAYLOAD_BUCKET` (none: payloads above the
/// threshold are refused with `PAYLOAD_TOO_LARGE`) and `PAYLOAD_THRESHOLD_BYTES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadConfig {
    pub bucket: Option<String>,
    pub threshold_bytes: usize,
}

impl PayloadConfig {
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            bucket: get("PAYLOAD_BUCKET").filter(|b| !b.is_empty()),
            threshold_bytes: parsed(
                get,
                "PAYLOAD_THRESHOLD_BYTES",
                DEFAULT_PAYLOAD_THRESHOLD_BYTES,
            )?,
        })
    }
}

/// A queue the coordinator's functions consume: what its messages ask, and where those that cannot
/// be processed go (its DLQ, reported under its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[serde(rename_all = "camelCase")]
#[strum(serialize_all = "lowercase")]
pub enum Inbox {
    /// Launch work (and start events sent to the launch queue).
    Launch,
    /// Start events from the bus's StartExecution rule and fan-out children.
    Start,
    /// Worker replies and interaction completions.
    Reply,
}

impl Inbox {
    pub const ALL: [Inbox; 3] = [Inbox::Launch, Inbox::Start, Inbox::Reply];

    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// The coordinator's queues (URLs, or plain names for in-memory senders): its inboxes, where
/// interaction completions go, and the dead-letter queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queues {
    pub launch: String,
    pub reply: String,
    /// Where interaction completions are sent (announced in await notices).
    pub awaits: String,
    /// Where fan-out steps start their children (none: fan-out steps cannot start children).
    pub start: Option<String>,
    /// Where dead-letter envelopes of failed executions go.
    pub execution_dlq: String,
    /// DLQs of the launch and reply queues: messages a handler cannot process go there with a reason.
    pub launch_dlq: String,
    pub reply_dlq: String,
    /// The start queue's DLQ (none: start messages that cannot be processed go to the launch DLQ).
    pub start_dlq: Option<String>,
}

impl Queues {
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let required = |name: &'static str| get(name).ok_or(ConfigError::Missing(name));
        let optional = |name: &str| get(name).filter(|u| !u.is_empty());
        Ok(Self {
            launch: required("LAUNCH_QUEUE_URL")?,
            reply: required("REPLY_QUEUE_URL")?,
            awaits: required("AWAIT_QUEUE_URL")?,
            start: optional("START_QUEUE_URL"),
            execution_dlq: required("EXECUTION_DLQ_URL")?,
            launch_dlq: required("LAUNCH_DLQ_URL")?,
            reply_dlq: required("REPLY_DLQ_URL")?,
            start_dlq: optional("START_DLQ_URL"),
        })
    }

    /// Queues named plainly (what an in-memory sender records), with no start queue: tests and
    /// simulations over in-memory ports.
    #[cfg(any(test, feature = "testing"))]
    pub fn named() -> Self {
        Self {
            launch: "launch".into(),
            reply: "replies".into(),
            awaits: "replies".into(),
            start: None,
            execution_dlq: "execution-dlq".into(),
            launch_dlq: "launch-dlq".into(),
            reply_dlq: "reply-dlq".into(),
            start_dlq: None,
        }
    }

    /// The queue `inbox` reads (none: the stack has no such queue).
    pub fn inbox(&self, inbox: Inbox) -> Option<&str> {
        let queue = match inbox {
            Inbox::Launch => Some(self.launch.as_str()),
            Inbox::Reply => Some(self.reply.as_str()),
            Inbox::Start => self.start.as_deref(),
        };
        queue.filter(|q| !q.is_empty())
    }

    /// Where `inbox`'s messages that cannot be processed go.
    pub fn dead_letters_of(&self, inbox: Inbox) -> &str {
        match (inbox, &self.start_dlq) {
            (Inbox::Start, Some(start_dlq)) => start_dlq,
            (Inbox::Start | Inbox::Launch, _) => &self.launch_dlq,
            (Inbox::Reply, _) => &self.reply_dlq,
        }
    }
}

impl CoordinatorConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let required = |name: &'static str| get(name).ok_or(ConfigError::Missing(name));
        Ok(Self {
            execution_table: required("EXECUTION_TABLE")?,
            release_table: required("RELEASE_TABLE")?,
            queues: Queues::from_lookup(&get)?,
            event_bus: get("EVENT_BUS_NAME")
                .filter(|b| !b.is_empty())
                .filter(|_| get("LIFECYCLE_EVENTS").is_some_and(|on| on == "true")),
            due_shards: parsed(&get, "DUE_SHARDS", 4)?,
            due_granularity_seconds: parsed(&get, "DUE_GRANULARITY_SECONDS", 5)?,
            lease_seconds: parsed(&get, "LEASE_SECONDS", 60)?,
            claim_limit: parsed(&get, "CLAIM_LIMIT", 100)?,
            payloads: PayloadConfig::from_lookup(&get)?,
            seal_key_secret: get("SEAL_KEY_SECRET").filter(|s| !s.is_empty()),
        })
    }
}

/// Deployment of a worker: the release it serves (its pipeline and contract come from its code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    pub release_version: String,
    /// DLQ of the worker's request queue: requests it cannot handle go there with a reason.
    pub request_dlq_url: Option<String>,
    /// The coordinator's reply queue, where the worker announces itself at its start (without it, at
    /// its first request, on the queue the request names).
    pub reply_queue_url: Option<String>,
    pub payloads: PayloadConfig,
}

impl WorkerConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        Ok(Self {
            release_version: get("RELEASE_VERSION")
                .ok_or(ConfigError::Missing("RELEASE_VERSION"))?,
            request_dlq_url: get("REQUEST_DLQ_URL"),
            reply_queue_url: get("REPLY_QUEUE_URL").filter(|u| !u.is_empty()),
            payloads: PayloadConfig::from_lookup(&get)?,
        })
    }
}

fn parsed<T: FromStr>(
    get: &impl Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, ConfigError> {
    match get(name) {
        None => Ok(default),
        Some(value) => value
            .parse()
            .map_err(|_| ConfigError::Invalid { name, value }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn reads_required_and_defaults() {
        let env: HashMap<&str, &str> = [
            ("EXECUTION_TABLE", "e"),
            ("RELEASE_TABLE", "r"),
            ("LAUNCH_QUEUE_URL", "l"),
            ("REPLY_QUEUE_URL", "p"),
            ("EXECUTION_DLQ_URL", "x"),
            ("LAUNCH_DLQ_URL", "ld"),
            ("REPLY_DLQ_URL", "rd"),
            ("AWAIT_QUEUE_URL", "aw"),
            ("DUE_SHARDS", "8"),
        ]
        .into();
        let cfg = CoordinatorConfig::from_lookup(|k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(cfg.due_shards, 8);
        assert_eq!(cfg.lease_seconds, 60);
        assert_eq!(cfg.due_granularity_seconds, 5);
        let missing = CoordinatorConfig::from_lookup(|_| None).unwrap_err();
        assert_eq!(missing, ConfigError::Missing("EXECUTION_TABLE"));
        let bad = CoordinatorConfig::from_lookup(|k| {
            if k == "DUE_SHARDS" {
                Some("many".into())
            } else {
                Some("x".into())
            }
        })
        .unwrap_err();
        assert!(matches!(
            bad,
            ConfigError::Invalid {
                name: "DUE_SHARDS",
                ..
            }
        ));
    }
}
