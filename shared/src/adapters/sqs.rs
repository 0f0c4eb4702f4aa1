//! SQS adapter of `MessageSender`: `SendMessageBatch` in chunks of 10 (the API's limit), queue names
//! resolved to URLs once per process through `GetQueueUrl`.

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::SendMessageBatchRequestEntry;
use aws_sdk_sqs::Client;

use crate::ports::{MessageSender, OutMessage, SendError};

/// SendMessageBatch takes at most 10 entries.
pub const MAX_BATCH: usize = 10;

pub struct SqsSender {
    client: Client,
    urls: Mutex<HashMap<String, String>>,
}

impl SqsSender {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            urls: Mutex::new(HashMap::new()),
        }
    }

    async fn resolve(&self, queue: &str) -> Result<String, SendError> {
        if queue.starts_with("https://") || queue.starts_with("http://") {
            return Ok(queue.to_string());
        }
        if let Some(url) = self.urls.lock().expect("url cache").get(queue) {
            return Ok(url.clone());
        }
        let out = self
            .client
            .get_queue_url()
            .queue_name(queue)
            .send()
            .await
            .map_err(|e| SendError {
                queue: queue.to_string(),
                reason: DisplayErrorContext(&e).to_string(),
            })?;
        let url = out.queue_url.ok_or_else(|| SendError {
            queue: queue.to_string(),
            reason: "GetQueueUrl returned no URL".into(),
        })?;
        self.urls
            .lock()
            .expect("url cache")
            .insert(queue.to_string(), url.clone());
        Ok(url)
    }
}

#[async_trait]
impl MessageSender for SqsSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Result<(), SendError>> {
        let fail = |reason: String| SendError {
            queue: queue.to_string(),
            reason,
        };
        let url = match self.resolve(queue).await {
            Ok(url) => url,
            Err(e) => return messages.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut results = Vec::with_capacity(messages.len());
        for chunk in messages.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(&m.body)
                        .delay_seconds(m.delay_secs as i32)
                        .build()
                        .expect("id and body are set")
                })
                .collect();
            let mut chunk_results: Vec<Result<(), SendError>> = vec![Ok(()); chunk.len()];
            match self
                .client
                .send_message_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await
            {
                Ok(out) => {
                    for failed in out.failed() {
                        if let Ok(i) = failed.id().parse::<usize>() {
                            if let Some(slot) = chunk_results.get_mut(i) {
                                *slot = Err(fail(format!(
                                    "{}: {}",
                                    failed.code(),
                                    failed.message().unwrap_or_default()
                                )));
                            }
                        }
                    }
                }
                Err(e) => {
                    let reason = DisplayErrorContext(&e).to_string();
                    chunk_results = chunk.iter().map(|_| Err(fail(reason.clone()))).collect();
                }
            }
            results.extend(chunk_results);
        }
        results
    }
}
