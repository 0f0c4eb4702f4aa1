//! SQS adapter of `MessageSender`: `SendMessageBatch` in groups of at most 10 entries and 256 KiB
//! (the API's limits), queue names resolved to URLs once per process through `GetQueueUrl`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageAttributeValue, MessageSystemAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;

use crate::domain::Timestamp;
use crate::ports::{
    DeadLetter, DeadLetterQueue, MessageSender, OutMessage, SendError, Sent, StoreError,
};
use crate::worker::VisibilityExtender;

use super::batches::{split, MAX_BATCH_BYTES, MAX_ENTRIES};

/// SendMessageBatch takes at most 10 entries.
pub const MAX_BATCH: usize = MAX_ENTRIES;

/// Whether SQS refuses a character in a message: those outside XML's (U+0000-U+001F but tab, line
/// feed and carriage return; U+FFFE and U+FFFF).
fn refused(c: char) -> bool {
    (c < ' ' && !matches!(c, '\t' | '\n' | '\r')) || matches!(c, '\u{fffe}' | '\u{ffff}')
}

/// A text as SQS takes it: each character SQS refuses, which a JSON string may carry, is written as
/// its JSON escape (`\uffff`). Every body the project sends is JSON, where such a character can only
/// stand inside a string, so the body means the same value.
pub fn sqs_text(text: &str) -> Cow<'_, str> {
    if !text.contains(refused) {
        return Cow::Borrowed(text);
    }
    let mut escaped = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if refused(c) {
            let _ = write!(escaped, "\\u{:04x}", c as u32);
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

/// A message as SQS takes it (see [`sqs_text`]): copied only when something in it is escaped.
fn sendable(message: &OutMessage) -> Cow<'_, OutMessage> {
    let clean = |text: &str| !text.contains(refused);
    if clean(&message.body) && message.attributes.iter().all(|(_, value)| clean(value)) {
        return Cow::Borrowed(message);
    }
    Cow::Owned(OutMessage {
        body: sqs_text(&message.body).into_owned(),
        delay_secs: message.delay_secs,
        attributes: message
            .attributes
            .iter()
            .map(|(name, value)| (name.clone(), sqs_text(value).into_owned()))
            .collect(),
    })
}

/// The size SQS counts for a message: its body and each attribute's name, type and value.
fn message_bytes(message: &OutMessage) -> usize {
    let attributes: usize = message
        .attributes
        .iter()
        .map(|(name, value)| name.len() + "String".len() + value.len())
        .sum();
    message.body.len() + attributes
}

/// Queue URLs by the names queues are configured with: a URL stands for itself; a name is resolved
/// (`GetQueueUrl`) at its first use, once.
struct QueueUrls {
    client: Client,
    urls: Mutex<HashMap<String, String>>,
}

impl QueueUrls {
    fn new(client: Client) -> Self {
        Self {
            client,
            urls: Mutex::new(HashMap::new()),
        }
    }

    async fn url(&self, queue: &str) -> Result<String, String> {
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
            .map_err(|e| DisplayErrorContext(&e).to_string())?;
        let url = out.queue_url.ok_or("GetQueueUrl returned no URL")?;
        self.urls
            .lock()
            .expect("url cache")
            .insert(queue.to_string(), url.clone());
        Ok(url)
    }
}

pub struct SqsSender {
    client: Client,
    urls: QueueUrls,
}

impl SqsSender {
    pub fn new(client: Client) -> Self {
        Self {
            urls: QueueUrls::new(client.clone()),
            client,
        }
    }

    async fn resolve(&self, queue: &str) -> Result<String, SendError> {
        self.urls
            .url(queue)
            .await
            .map_err(|reason| SendError::new(queue, reason))
    }
}

#[async_trait]
impl MessageSender for SqsSender {
    async fn send(&self, queue: &str, messages: &[OutMessage]) -> Vec<Sent> {
        let fail = |reason: String| SendError::new(queue, reason);
        let url = match self.resolve(queue).await {
            Ok(url) => url,
            Err(e) => return messages.iter().map(|_| Err(e.clone())).collect(),
        };
        let prepared: Vec<Cow<'_, OutMessage>> = messages.iter().map(sendable).collect();
        let messages = &prepared[..];
        let mut results = Vec::with_capacity(messages.len());
        let groups = split(
            messages.iter().map(|m| message_bytes(m)),
            MAX_BATCH,
            MAX_BATCH_BYTES,
        );
        for chunk in groups.into_iter().map(|group| &messages[group]) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let mut entry = SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(&m.body)
                        .delay_seconds(m.delay_secs as i32);
                    for (name, value) in &m.attributes {
                        entry = entry.message_attributes(
                            name,
                            MessageAttributeValue::builder()
                                .data_type("String")
                                .string_value(value)
                                .build()
                                .expect("data type is set"),
                        );
                    }
                    entry.build().expect("id and body are set")
                })
                .collect();
            let mut chunk_results: Vec<Sent> = vec![Ok(()); chunk.len()];
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

    async fn redeliver_in(&self, queue: &str, receipts: &[String], seconds: u32) -> Sent {
        let url = self.resolve(queue).await?;
        for chunk in receipts.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, receipt)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .visibility_timeout(seconds as i32)
                        .build()
                        .expect("id and receipt are set")
                })
                .collect();
            let out = self
                .client
                .change_message_visibility_batch()
                .queue_url(&url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| SendError::new(queue, DisplayErrorContext(&e).to_string()))?;
            if let Some(failed) = out.failed().first() {
                let reason = format!(
                    "{}: {}",
                    failed.code(),
                    failed.message().unwrap_or_default()
                );
                return Err(SendError::new(queue, reason));
            }
        }
        Ok(())
    }
}

/// A DLQ read through SQS: received messages stay hidden for `hold_secs` unless deleted or released.
pub struct SqsDeadLetterQueue {
    client: Client,
    /// The queue's URL, or its name (resolved at the first use).
    queue: String,
    urls: QueueUrls,
    hold_secs: i32,
}

impl SqsDeadLetterQueue {
    pub fn new(client: Client, queue: impl Into<String>) -> Self {
        Self {
            urls: QueueUrls::new(client.clone()),
            client,
            queue: queue.into(),
            hold_secs: 120,
        }
    }

    async fn url(&self) -> Result<String, StoreError> {
        self.urls
            .url(&self.queue)
            .await
            .map_err(|reason| StoreError::Unavailable(format!("{}: {reason}", self.queue)))
    }
}

fn unavailable<E>(e: aws_sdk_sqs::error::SdkError<E>) -> StoreError
where
    E: std::error::Error + Send + Sync + 'static,
{
    StoreError::Unavailable(DisplayErrorContext(&e).to_string())
}

#[async_trait]
impl DeadLetterQueue for SqsDeadLetterQueue {
    async fn receive(&self, max: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let out = self
            .client
            .receive_message()
            .queue_url(self.url().await?)
            .max_number_of_messages(max.clamp(1, MAX_BATCH) as i32)
            .visibility_timeout(self.hold_secs)
            .wait_time_seconds(1)
            .message_attribute_names("All")
            .message_system_attribute_names(
                aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp,
            )
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out
            .messages
            .unwrap_or_default()
            .into_iter()
            .map(|m| DeadLetter {
                sent_at: m
                    .attributes
                    .as_ref()
                    .and_then(|a| {
                        a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp)
                    })
                    .and_then(|v| v.parse().ok())
                    .map(Timestamp::from_millis),
                attributes: m
                    .message_attributes
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(k, v)| Some((k, v.string_value?)))
                    .collect(),
                handle: m.receipt_handle.unwrap_or_default(),
                body: m.body.unwrap_or_default(),
            })
            .collect())
    }

    async fn delete(&self, handle: &str) -> Result<(), StoreError> {
        self.client
            .delete_message()
            .queue_url(self.url().await?)
            .receipt_handle(handle)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn release(&self, handle: &str) -> Result<(), StoreError> {
        self.client
            .change_message_visibility()
            .queue_url(self.url().await?)
            .receipt_handle(handle)
            .visibility_timeout(0)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}

/// An SQS queue as a Lambda event source mapping feeds a function: batches of messages, and the
/// messages the handler does not report failed deleted.
#[derive(Debug, Clone)]
pub struct EventSource {
    /// For logs.
    pub name: String,
    pub queue_url: String,
    /// The `eventSourceARN` of the records (a worker extends its messages' visibility by it).
    pub queue_arn: String,
    pub batch_size: i32,
    /// Long-poll wait of each receive.
    pub wait_secs: i32,
}

/// Polls `source` forever, as an event source mapping does: each batch goes to `handler` as an
/// `SqsEvent`; messages it reports in `batchItemFailures` (or all of them, if it panics) are left to
/// reappear after their visibility timeout, the others are deleted.
pub async fn poll_event_source<H, F>(sqs: &Client, source: &EventSource, handler: H)
where
    H: Fn(SqsEvent) -> F,
    F: std::future::Future<Output = SqsBatchResponse> + Send + 'static,
{
    let region = std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".into());
    loop {
        let received = sqs
            .receive_message()
            .queue_url(&source.queue_url)
            .max_number_of_messages(source.batch_size.clamp(1, 10))
            .wait_time_seconds(source.wait_secs)
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await;
        let messages = match received {
            Ok(out) => out.messages.unwrap_or_default(),
            Err(e) => {
                tracing::warn!(queue = %source.name, error = %DisplayErrorContext(e), "receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
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
                tracing::error!(queue = %source.name, error = %e, "handler crashed");
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
                tracing::warn!(queue = %source.name, error = %DisplayErrorContext(e), "delete failed; messages will be redelivered");
            }
        }
    }
}

/// The account id and queue name of an SQS queue ARN (`arn:aws:sqs:region:account:name`).
pub fn parse_queue_arn(arn: &str) -> Option<(&str, &str)> {
    let parts: Vec<&str> = arn.split(':').collect();
    match parts.as_slice() {
        ["arn", _, "sqs", _, account, .., name] if !account.is_empty() && !name.is_empty() => {
            Some((account, name))
        }
        _ => None,
    }
}

/// [`VisibilityExtender`] on SQS: the queue URL is resolved from the event source ARN once per process
/// (`GetQueueUrl` with the owner account, as the queue may belong to another account), then
/// `ChangeMessageVisibility`.
pub struct SqsVisibilityExtender {
    client: aws_sdk_sqs::Client,
    urls: Mutex<HashMap<String, String>>,
}

impl SqsVisibilityExtender {
    pub fn new(client: aws_sdk_sqs::Client) -> Self {
        Self {
            client,
            urls: Mutex::new(HashMap::new()),
        }
    }

    async fn queue_url(&self, arn: &str) -> Result<String, String> {
        if let Some(url) = self
            .urls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(arn)
        {
            return Ok(url.clone());
        }
        let (account, name) =
            parse_queue_arn(arn).ok_or_else(|| format!("not an SQS queue ARN: {arn}"))?;
        let out = self
            .client
            .get_queue_url()
            .queue_name(name)
            .queue_owner_aws_account_id(account)
            .send()
            .await
            .map_err(|e| format!("GetQueueUrl {arn}: {}", DisplayErrorContext(&e)))?;
        let url = out
            .queue_url
            .ok_or_else(|| format!("GetQueueUrl {arn} returned no URL"))?;
        self.urls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(arn.to_string(), url.clone());
        Ok(url)
    }
}

#[async_trait]
impl VisibilityExtender for SqsVisibilityExtender {
    async fn extend(
        &self,
        event_source_arn: &str,
        receipt_handle: &str,
        seconds: i32,
    ) -> Result<(), String> {
        let url = self.queue_url(event_source_arn).await?;
        self.client
            .change_message_visibility()
            .queue_url(&url)
            .receipt_handle(receipt_handle)
            .visibility_timeout(seconds)
            .send()
            .await
            .map_err(|e| format!("ChangeMessageVisibility {url}: {}", DisplayErrorContext(&e)))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_sqs_refuses_are_escaped_and_the_json_means_the_same() {
        let value =
            serde_json::json!({"id": "a\u{0}b\u{1f}\t\n\r\u{fffe}\u{ffff}\u{fffd}\u{10ffff}é"});
        // A body written by hand, with the characters raw (serde_json escapes control characters).
        let raw = "{\"id\":\"a\u{0}b\u{1f}\\t\\n\\r\u{fffe}\u{ffff}\u{fffd}\u{10ffff}é\"}";
        for body in [serde_json::to_string(&value).unwrap(), raw.to_string()] {
            let text = sqs_text(&body);
            assert!(
                !text.contains(|c: char| (c < ' ' && !"\t\n\r".contains(c))
                    || c == '\u{fffe}'
                    || c == '\u{ffff}'),
                "{text:?}"
            );
            let back: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, value);
        }
        assert!(matches!(
            sqs_text("{\"ok\":\"é\u{10ffff}\"}"),
            Cow::Borrowed(_)
        ));
    }

    #[test]
    fn a_message_is_copied_only_when_something_in_it_is_escaped() {
        let with_reason = |reason: &str| OutMessage {
            attributes: vec![("reason".into(), reason.into())],
            ..OutMessage::new("{}".into())
        };
        let plain = with_reason("fine");
        assert!(matches!(sendable(&plain), Cow::Borrowed(_)));
        let odd = with_reason("bad \u{ffff}");
        assert_eq!(sendable(&odd).attributes[0].1, "bad \\uffff");
    }
}
