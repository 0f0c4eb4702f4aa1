//! EventBridge adapter of `EventPublisher`: `PutEvents` in groups of at most 10 entries and 256 KiB
//! (the API's limits), each entry's result checked (`FailedEntryCount` counts the entries that carry
//! an error code).

use async_trait::async_trait;
use aws_sdk_eventbridge::error::DisplayErrorContext;
use aws_sdk_eventbridge::types::PutEventsRequestEntry;
use aws_sdk_eventbridge::Client;

use super::batches::{split, MAX_BATCH_BYTES, MAX_ENTRIES};
use crate::ports::{BusEvent, EventPublisher};

/// The `source` of every lifecycle event.
pub const EVENT_SOURCE: &str = "stepline";

/// The size EventBridge counts for an entry: source, detail-type and detail (no time, no resources).
fn entry_bytes(event: &BusEvent, detail: &str) -> usize {
    EVENT_SOURCE.len() + event.detail_type.len() + detail.len()
}

pub struct EventBridgePublisher {
    client: Client,
    bus: String,
}

impl EventBridgePublisher {
    pub fn new(client: Client, bus: impl Into<String>) -> Self {
        Self {
            client,
            bus: bus.into(),
        }
    }
}

#[async_trait]
impl EventPublisher for EventBridgePublisher {
    async fn publish(&self, events: &[BusEvent]) -> Vec<Result<(), String>> {
        let mut results = Vec::with_capacity(events.len());
        let details: Vec<String> = events.iter().map(|e| e.detail.to_string()).collect();
        let sizes = events.iter().zip(&details).map(|(e, d)| entry_bytes(e, d));
        for group in split(sizes, MAX_ENTRIES, MAX_BATCH_BYTES) {
            let chunk = &events[group.clone()];
            let entries = chunk
                .iter()
                .zip(&details[group])
                .map(|(e, detail)| {
                    PutEventsRequestEntry::builder()
                        .event_bus_name(&self.bus)
                        .source(EVENT_SOURCE)
                        .detail_type(&e.detail_type)
                        .detail(detail)
                        .build()
                })
                .collect();
            match self
                .client
                .put_events()
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) if out.failed_entry_count == 0 => {
                    results.extend(chunk.iter().map(|_| Ok(())))
                }
                Ok(out) => {
                    let answered = out.entries();
                    for i in 0..chunk.len() {
                        results.push(match answered.get(i) {
                            Some(entry)
                                if entry.error_code().is_none() && entry.event_id().is_some() =>
                            {
                                Ok(())
                            }
                            Some(entry) => Err(format!(
                                "{}: {}",
                                entry.error_code().unwrap_or("UNKNOWN"),
                                entry.error_message().unwrap_or_default()
                            )),
                            None => Err("no result for the entry".into()),
                        });
                    }
                }
                Err(e) => {
                    let reason = DisplayErrorContext(&e).to_string();
                    results.extend(chunk.iter().map(|_| Err(reason.clone())));
                }
            }
        }
        results
    }
}
