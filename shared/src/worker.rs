//! Worker runtime: the library side of an SQS request/reply worker. It decodes each request header,
//! refuses a command addressed to another pipeline release before touching the payload, runs the step,
//! and sends the result envelope to the reply queue the request names (batched per queue). Step failures
//! are replies (the coordinator decides retries); only messages that cannot be handled are reported as
//! batch item failures, to be retried and finally dead-lettered by their queue.
//!
//! Delivery to a worker is at least once: a step can run more than once for one launch id (a redelivered
//! or re-sent request), so its side effects should be idempotent on the launch id.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use serde_json::Value;

use crate::domain::StepError;
use crate::envelope::{
    Identity, RawRequest, ReplyEnvelope, ReplyOutcome, RequestHeader, REQUEST_KIND,
};
use crate::ports::{MessageSender, OutMessage, SendError};

/// The step code a worker hosts.
#[async_trait]
pub trait StepFunction: Send + Sync {
    /// Runs one attempt of `request.step_id` on `input`.
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError>;
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("undecodable request: {0}")]
    Undecodable(String),
    #[error("request for {got} delivered to a worker of {expected}")]
    IdentityMismatch { expected: Identity, got: Identity },
    #[error(transparent)]
    ReplyFailed(#[from] SendError),
}

impl WorkerError {
    pub fn code(&self) -> &'static str {
        match self {
            WorkerError::Undecodable(_) => "UNDECODABLE",
            WorkerError::IdentityMismatch { .. } => "IDENTITY_MISMATCH",
            WorkerError::ReplyFailed(_) => "REPLY_FAILED",
        }
    }
}

pub struct Worker {
    identity: Identity,
    sender: Arc<dyn MessageSender>,
    steps: Arc<dyn StepFunction>,
}

impl Worker {
    pub fn new(
        identity: Identity,
        sender: Arc<dyn MessageSender>,
        steps: Arc<dyn StepFunction>,
    ) -> Self {
        Self {
            identity,
            sender,
            steps,
        }
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// Handles one SQS batch of requests.
    pub async fn handle(&self, event: SqsEvent) -> SqsBatchResponse {
        let mut response = SqsBatchResponse::default();
        let mut replies: BTreeMap<String, Vec<(String, OutMessage)>> = BTreeMap::new();
        let fail = |id: String, err: &WorkerError, response: &mut SqsBatchResponse| {
            tracing::error!(message_id = %id, code = err.code(), error = %err, "request not handled");
            let mut failure = BatchItemFailure::default();
            failure.item_identifier = id;
            response.batch_item_failures.push(failure);
        };
        for message in event.records {
            let id = message.message_id.clone().unwrap_or_default();
            match self.run_one(&message).await {
                Ok((reply_to, body)) => replies.entry(reply_to).or_default().push((
                    id,
                    OutMessage::new(body),
                )),
                Err(e) => fail(id, &e, &mut response),
            }
        }
        for (queue, entries) in replies {
            let messages: Vec<OutMessage> = entries.iter().map(|(_, m)| m.clone()).collect();
            let results = self.sender.send(&queue, &messages).await;
            for ((id, _), result) in entries.into_iter().zip(results) {
                if let Err(e) = result {
                    // The request is redelivered and the step runs again: at-least-once.
                    fail(id, &WorkerError::ReplyFailed(e), &mut response);
                }
            }
        }
        response
    }

    /// Runs one request; returns the reply queue and the reply body.
    async fn run_one(&self, message: &SqsMessage) -> Result<(String, String), WorkerError> {
        let text = message
            .body
            .as_deref()
            .ok_or_else(|| WorkerError::Undecodable("empty body".into()))?;
        let raw: RawRequest =
            serde_json::from_str(text).map_err(|e| WorkerError::Undecodable(e.to_string()))?;
        let header = raw.header;
        if header.kind != REQUEST_KIND {
            return Err(WorkerError::Undecodable(format!(
                "unknown kind {:?}",
                header.kind
            )));
        }
        if header.identity != self.identity {
            return Err(WorkerError::IdentityMismatch {
                expected: self.identity.clone(),
                got: header.identity,
            });
        }
        let outcome = match serde_json::from_str::<Value>(raw.payload.get()) {
            Ok(input) => match self.steps.run(&header, input).await {
                Ok(output) => ReplyOutcome::Succeeded { output },
                Err(error) => ReplyOutcome::Failed { error },
            },
            Err(e) => ReplyOutcome::Failed {
                error: StepError::new("UNDECODABLE_INPUT", e.to_string(), false),
            },
        };
        tracing::info!(
            execution_id = %header.execution_id, tenant = %header.tenant, step = %header.step_id,
            attempt = header.attempt, launch_id = %header.launch_id,
            ok = matches!(outcome, ReplyOutcome::Succeeded { .. }), "step ran"
        );
        let reply = ReplyEnvelope::for_request(&header, outcome);
        let body = serde_json::to_string(&reply).expect("reply serializes");
        Ok((header.reply_to, body))
    }
}
