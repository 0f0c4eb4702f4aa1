//! Local runner: emulates Lambda's event sources. For each function with an SQS event source it polls
//! the queue and calls the handler with an `SqsEvent` batch; messages the handler reports in
//! `batchItemFailures` (or all of them, if the handler panics) are not deleted and reappear after the
//! visibility timeout, as on Lambda. Scheduled functions are invoked on a fixed tick.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use aws_lambda_events::event::eventbridge::EventBridgeEvent;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
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
    let source = stepline::adapters::sqs::EventSource {
        name: source.queue,
        queue_url: source.queue_url,
        queue_arn: source.queue_arn,
        batch_size: source.batch_size,
        wait_secs: 1,
    };
    stepline::adapters::sqs::poll_event_source(&sqs, &source, |event| handler(event)).await
}
