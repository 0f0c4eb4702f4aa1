//! Local runner: emulates Lambda's event sources. For each function with an SQS event source it polls
//! the queue and calls the handler with an `SqsEvent` batch; messages the handler reports in
//! `batchItemFailures` (or all of them, if the handler panics) are not deleted and reappear after the
//! visibility timeout, as on Lambda. Scheduled functions are invoked on a fixed tick.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::stack::{SqsSource, Stack};

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
pub type SqsHandler = Arc<dyn Fn(SqsEvent) -> BoxFuture<SqsBatchResponse> + Send + Sync>;
pub type ScheduleHandler = Arc<dyn Fn(EventBridgeEvent<Value>) -> BoxFuture<()> + Send + Sync>;

/// A function of the template bound to the code that handles it.
pub enum Binding {
    Sqs {
        function: String,
        handler: SqsHandler,
    },
    Schedule {
        function: String,
        handler: ScheduleHandler,
    },
    /// A queue outside the template (e.g. the request queue of a second release's workers).
    Queue {
        source: SqsSource,
        handler: SqsHandler,
    },
}

/// Runner options.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// Period of scheduled invocations (the template's `rate(1 minute)` is too slow for a local run).
    pub tick: Duration,
    /// Concurrent pollers per SQS event source (Lambda scales out; a few pollers approximate it).
    pub pollers: usize,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            tick: Duration::from_secs(1),
            pollers: 2,
        }
    }
}

/// Running event-source emulation; stops (abruptly, as a killed process would) when dropped.
pub struct Runner {
    tasks: Vec<JoinHandle<()>>,
}

impl Runner {
    pub fn start(
        sqs: aws_sdk_sqs::Client,
        stack: &Stack,
        bindings: Vec<Binding>,
        options: RunnerOptions,
    ) -> anyhow::Result<Runner> {
        let mut tasks = Vec::new();
        let pollers = |source: &SqsSource, handler: &SqsHandler| {
            (0..options.pollers.max(1))
                .map(|_| tokio::spawn(poll(sqs.clone(), source.clone(), handler.clone())))
                .collect::<Vec<_>>()
        };
        for binding in bindings {
            match binding {
                Binding::Sqs { function, handler } => {
                    let spec = stack.function(&function)?;
                    anyhow::ensure!(!spec.sqs.is_empty(), "{function} has no SQS event source");
                    for source in &spec.sqs {
                        tasks.extend(pollers(source, &handler));
                    }
                }
                Binding::Queue { source, handler } => tasks.extend(pollers(&source, &handler)),
                Binding::Schedule { function, handler } => {
                    let spec = stack.function(&function)?;
                    anyhow::ensure!(!spec.schedules.is_empty(), "{function} has no schedule");
                    let tick = options.tick;
                    tasks.push(tokio::spawn(async move {
                        let mut interval = tokio::time::interval(tick);
                        loop {
                            interval.tick().await;
                            handler(scheduled_event()).await;
                        }
                    }));
                }
            }
        }
        Ok(Runner { tasks })
    }

    pub fn stop(self) {}
}

impl Drop for Runner {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The event an EventBridge schedule delivers.
pub fn scheduled_event() -> EventBridgeEvent<Value> {
    let mut event = EventBridgeEvent::<Value>::default();
    event.detail_type = "Scheduled Event".into();
    event.source = "aws.events".into();
    event.detail = Value::Object(Default::default());
    event
}

async fn poll(sqs: aws_sdk_sqs::Client, source: SqsSource, handler: SqsHandler) {
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    loop {
        let received = sqs
            .receive_message()
            .queue_url(&source.queue_url)
            .max_number_of_messages(source.batch_size.clamp(1, 10))
            .wait_time_seconds(1)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await;
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(queue = %source.queue, error = %aws_sdk_sqs::error::DisplayErrorContext(e), "receive failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if messages.is_empty() {
            continue;
        }
        let mut event = SqsEvent::default();
        let mut receipts = Vec::new();
        for m in messages {
            let mut message = SqsMessage::default();
            message.message_id = m.message_id.clone();
            message.receipt_handle = m.receipt_handle.clone();
            message.body = m.body.clone();
            message.md5_of_body = m.md5_of_body.clone();
            message.attributes = m
                .attributes
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.as_str().to_string(), v))
                .collect();
            message.event_source = Some("aws:sqs".into());
            message.event_source_arn = Some(source.queue_arn.clone());
            message.aws_region = Some(region.clone());
            receipts.push((
                m.message_id.unwrap_or_default(),
                m.receipt_handle.unwrap_or_default(),
            ));
            event.records.push(message);
        }
        // A panicking handler fails the whole batch, as a crashed invocation does on Lambda.
        let response = match tokio::spawn(handler(event)).await {
            Ok(response) => response,
            Err(e) => {
                tracing::error!(queue = %source.queue, error = %e, "handler crashed");
                continue;
            }
        };
        let failed: std::collections::HashSet<String> = response
            .batch_item_failures
            .into_iter()
            .map(|f| f.item_identifier)
            .collect();
        let entries: Vec<DeleteMessageBatchRequestEntry> = receipts
            .into_iter()
            .filter(|(id, _)| !failed.contains(id))
            .enumerate()
            .map(|(i, (_, receipt))| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .expect("id and receipt are set")
            })
            .collect();
        if !entries.is_empty() {
            if let Err(e) = sqs
                .delete_message_batch()
                .queue_url(&source.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                tracing::warn!(queue = %source.queue, error = %aws_sdk_sqs::error::DisplayErrorContext(e), "delete failed; messages will be redelivered");
            }
        }
    }
}
