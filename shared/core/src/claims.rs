//! Claim checks: a payload (execution input, step output, answer, error message) whose compact JSON
//! text is longer than a threshold is stored as an immutable object in the payload bucket, and a
//! reference to it (`domain::payload::PayloadRef`, with its size and SHA-256 digest) travels in the
//! messages and sits in the record instead. Objects are content-addressed under the execution
//! (`payloads/<execution>/<sha256>`), written before the reference is committed or sent, so a retry
//! writes the same key with the same bytes. The worker runtime resolves references before step code
//! runs and offloads what the step returns: step code sees values, never references.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::cache::json_size;
use crate::domain::payload::PayloadRef;
use crate::domain::{Code, StepError};
use crate::ports::{PayloadStore, StoreError};

/// The prefix of every payload object (the bucket's lifecycle rule expires it).
pub const PAYLOAD_PREFIX: &str = "payloads/";
/// The most a payload takes inline (with no payload bucket, or the threshold at its highest): the
/// rest of a 256 KiB SQS message is left to its envelope.
pub const MAX_INLINE_BYTES: usize = 200 * 1024;
/// A claim-checked error message keeps this many bytes of its beginning inline.
pub const INLINE_MESSAGE_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The payload bucket throttled or unreachable: try again.
    #[error("payload store unavailable: {0}")]
    Unavailable(String),
    /// The reference cannot be resolved (missing object, foreign bucket, size or digest mismatch).
    #[error("payload reference does not resolve: {0}")]
    Unresolvable(String),
    /// Larger than what can travel inline, and no payload bucket to hold it.
    #[error("a payload of {bytes} bytes exceeds the {limit} bytes a message carries inline, and no payload bucket is configured")]
    TooLarge { bytes: usize, limit: usize },
}

impl ClaimError {
    pub fn code(&self) -> Code {
        match self {
            ClaimError::Unavailable(_) => Code::PayloadUnavailable,
            ClaimError::Unresolvable(_) => Code::PayloadUnresolvable,
            ClaimError::TooLarge { .. } => Code::PayloadTooLarge,
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.code().is_retryable()
    }

    /// As the failure of a step.
    pub fn step_error(&self) -> StepError {
        StepError::new(self.code().as_str(), self.to_string(), self.is_retryable())
    }
}

impl From<StoreError> for ClaimError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(detail) => ClaimError::Unavailable(detail),
            other => ClaimError::Unresolvable(other.to_string()),
        }
    }
}

/// Without a payload bucket: whether `value` can travel inline (`TooLarge` if not). Measured without
/// writing the text out.
pub fn check_inline(value: &Value) -> Result<(), ClaimError> {
    let bytes = json_size(value);
    if bytes > MAX_INLINE_BYTES {
        return Err(ClaimError::TooLarge {
            bytes,
            limit: MAX_INLINE_BYTES,
        });
    }
    Ok(())
}

/// Offloads and resolves payloads against one bucket.
#[derive(Clone)]
pub struct ClaimCheck {
    store: Arc<dyn PayloadStore>,
    bucket: String,
    threshold: usize,
}

impl ClaimCheck {
    pub fn new(store: Arc<dyn PayloadStore>, bucket: impl Into<String>, threshold: usize) -> Self {
        Self {
            store,
            bucket: bucket.into(),
            threshold,
        }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn threshold(&self) -> usize {
        self.threshold
    }

    /// The key of a payload object: content-addressed under its execution.
    pub fn key(execution: Uuid, sha256: &str) -> String {
        format!("{PAYLOAD_PREFIX}{execution}/{sha256}")
    }

    /// `value` itself if its JSON text is within the threshold (or it is a reference already), else
    /// stored and replaced by its reference.
    pub async fn offload(&self, execution: Uuid, value: Value) -> Result<Value, ClaimError> {
        // Measured first: the text is written out only for a payload that goes to the bucket.
        if PayloadRef::of(&value).is_some() || json_size(&value) <= self.threshold {
            return Ok(value);
        }
        let text = serde_json::to_vec(&value).expect("a JSON value serializes");
        Ok(self.store_bytes(execution, text).await?.to_value())
    }

    /// An error whose message is longer than the threshold keeps its beginning inline; the whole
    /// message is stored and referenced from `detail`.
    pub async fn offload_error(
        &self,
        execution: Uuid,
        mut error: StepError,
    ) -> Result<StepError, ClaimError> {
        if error.message.len() <= self.threshold {
            return Ok(error);
        }
        let whole =
            serde_json::to_vec(&Value::String(error.message.clone())).expect("a string serializes");
        let reference = self.store_bytes(execution, whole).await?;
        error.message = crate::domain::machine::truncated(&error.message, INLINE_MESSAGE_BYTES);
        error.detail = Some(reference.to_value());
        Ok(error)
    }

    /// Stores `bytes` under their digest and returns the reference.
    pub async fn store_bytes(
        &self,
        execution: Uuid,
        bytes: Vec<u8>,
    ) -> Result<PayloadRef, ClaimError> {
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let key = Self::key(execution, &sha256);
        let size = bytes.len() as u64;
        match self.store.put(&self.bucket, &key, bytes).await {
            // Stored before (a retry, or the same payload again): the same bytes, or a reader's
            // digest check refuses them.
            Ok(()) | Err(StoreError::Conflict) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(PayloadRef {
            bucket: self.bucket.clone(),
            key,
            size,
            sha256,
        })
    }

    /// The bytes a reference names, checked against its size and digest. Only this stack's bucket is
    /// read: a reference is data a sender controls.
    pub async fn fetch(&self, reference: &PayloadRef) -> Result<Vec<u8>, ClaimError> {
        if reference.bucket != self.bucket {
            return Err(ClaimError::Unresolvable(format!(
                "bucket {} is not the payload bucket",
                reference.bucket
            )));
        }
        let bytes = self.store.get(&self.bucket, &reference.key).await?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if bytes.len() as u64 != reference.size || sha256 != reference.sha256 {
            return Err(ClaimError::Unresolvable(format!(
                "{} holds {} bytes with digest {sha256}, the reference says {} bytes with {}",
                reference.key,
                bytes.len(),
                reference.size,
                reference.sha256
            )));
        }
        Ok(bytes)
    }

    /// Writes `bytes` under `key` (under the payload prefix) in the payload bucket: an object named by
    /// what it holds (a fan-out's items of one block), written the same each time.
    pub async fn put_named(&self, key: &str, bytes: Vec<u8>) -> Result<(), ClaimError> {
        if !key.starts_with(PAYLOAD_PREFIX) {
            return Err(ClaimError::Unresolvable(format!(
                "{key} is not under {PAYLOAD_PREFIX}"
            )));
        }
        match self.store.put(&self.bucket, key, bytes.clone()).await {
            Ok(()) => Ok(()),
            // Written before: by this writer (a retry) if it holds these bytes, else by someone
            // who must not decide what it names.
            Err(StoreError::Conflict) => {
                if self.store.get(&self.bucket, key).await? == bytes {
                    Ok(())
                } else {
                    Err(ClaimError::Unresolvable(format!(
                        "{key} exists with other content"
                    )))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// At most `len` bytes of object `key` of the payload bucket from byte `start` on: a page of a
    /// fan-out's items. Only this stack's bucket is read, under the payload prefix.
    pub async fn fetch_range(
        &self,
        bucket: &str,
        key: &str,
        start: u64,
        len: u64,
    ) -> Result<Vec<u8>, ClaimError> {
        if bucket != self.bucket || !key.starts_with(PAYLOAD_PREFIX) {
            return Err(ClaimError::Unresolvable(format!(
                "s3://{bucket}/{key} is not under {PAYLOAD_PREFIX} in the payload bucket {}",
                self.bucket
            )));
        }
        Ok(self
            .store
            .get_range(bucket, key, start..start.saturating_add(len))
            .await?)
    }

    /// `value` with every reference in it (at any depth) replaced by the payload it names.
    pub async fn resolve(&self, mut value: Value) -> Result<Value, ClaimError> {
        if PayloadRef::any_in(&value) {
            self.resolve_in(&mut value).await?;
        }
        Ok(value)
    }

    fn resolve_in<'a>(
        &'a self,
        value: &'a mut Value,
    ) -> Pin<Box<dyn Future<Output = Result<(), ClaimError>> + Send + 'a>> {
        Box::pin(async move {
            if let Some(reference) = PayloadRef::of(value) {
                let bytes = self.fetch(&reference).await?;
                *value = serde_json::from_slice(&bytes).map_err(|e| {
                    ClaimError::Unresolvable(format!("{} is not JSON: {e}", reference.key))
                })?;
                // A stored payload may hold references itself (an await step's answers beside its
                // input); a content address cannot name itself, so this ends.
                if PayloadRef::any_in(value) {
                    self.resolve_in(value).await?;
                }
                return Ok(());
            }
            match value {
                Value::Object(fields) => {
                    for field in fields.values_mut() {
                        if PayloadRef::any_in(field) {
                            self.resolve_in(field).await?;
                        }
                    }
                }
                Value::Array(items) => {
                    for item in items {
                        if PayloadRef::any_in(item) {
                            self.resolve_in(item).await?;
                        }
                    }
                }
                _ => {}
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::InMemoryPayloadStore;
    use serde_json::json;

    const EXEC: Uuid = Uuid::from_u128(7);

    fn check(threshold: usize) -> (Arc<InMemoryPayloadStore>, ClaimCheck) {
        let store = Arc::new(InMemoryPayloadStore::default());
        (store.clone(), ClaimCheck::new(store, "payloads", threshold))
    }

    #[tokio::test]
    async fn a_stored_payload_is_never_overwritten() {
        let (store, claims) = check(64);
        let reference = claims.store_bytes(EXEC, b"genuine".to_vec()).await.unwrap();
        // Whoever saw the reference writes other bytes under its key: refused, the object stays.
        assert_eq!(
            store
                .put(claims.bucket(), &reference.key, b"forged".to_vec())
                .await,
            Err(StoreError::Conflict)
        );
        assert!(claims
            .put_named(&reference.key, b"forged".to_vec())
            .await
            .is_err());
        assert_eq!(claims.fetch(&reference).await.unwrap(), b"genuine");
        // Storing the same payload again (a retry) is fine, and so is naming the same bytes again.
        assert_eq!(
            claims.store_bytes(EXEC, b"genuine".to_vec()).await.unwrap(),
            reference
        );
        claims
            .put_named(&reference.key, b"genuine".to_vec())
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_payload_over_the_threshold_travels_as_a_reference_and_resolves_whole() {
        let (store, claims) = check(64);
        let small = json!({"a": 1});
        assert_eq!(claims.offload(EXEC, small.clone()).await.unwrap(), small);
        assert!(store.is_empty(), "a small payload stays inline");

        let large = json!({"rows": "x".repeat(1_000)});
        let reference = claims.offload(EXEC, large.clone()).await.unwrap();
        let parsed = PayloadRef::of(&reference).expect("a reference");
        assert_eq!(
            parsed.size,
            serde_json::to_vec(&large).unwrap().len() as u64
        );
        assert_eq!(parsed.key, ClaimCheck::key(EXEC, &parsed.sha256));
        // Content-addressed: the same payload again is the same object.
        assert_eq!(
            claims.offload(EXEC, large.clone()).await.unwrap(),
            reference
        );
        assert_eq!(store.len(), 1);
        // References resolve wherever they sit.
        let nested = json!({"input": reference, "n": [reference]});
        assert_eq!(
            claims.resolve(nested).await.unwrap(),
            json!({"input": large, "n": [large]})
        );
    }

    #[tokio::test]
    async fn a_reference_that_does_not_match_its_object_is_refused() {
        let (store, claims) = check(16);
        let reference = claims
            .offload(EXEC, json!("a long enough payload"))
            .await
            .unwrap();
        let parsed = PayloadRef::of(&reference).unwrap();
        store.overwrite(
            "payloads",
            &parsed.key,
            b"\"tampered payload text\"".to_vec(),
        );
        let err = claims.resolve(reference).await.unwrap_err();
        assert_eq!(err.code(), Code::PayloadUnresolvable);
        assert!(!err.is_retryable());

        let foreign = PayloadRef {
            bucket: "someone-elses".into(),
            ..parsed.clone()
        };
        let err = claims.resolve(foreign.to_value()).await.unwrap_err();
        assert!(err.to_string().contains("not the payload bucket"), "{err}");

        let missing = PayloadRef {
            key: "payloads/none".into(),
            ..parsed
        };
        let err = claims.resolve(missing.to_value()).await.unwrap_err();
        assert_eq!(err.code(), Code::PayloadUnresolvable);
    }

    #[tokio::test]
    async fn a_long_error_message_keeps_its_beginning_and_refers_to_the_whole() {
        let (_, claims) = check(4_096);
        let message = "e".repeat(300_000);
        let error = StepError::new("HUGE", message.clone(), false);
        let cut = claims.offload_error(EXEC, error).await.unwrap();
        assert_eq!(cut.code, "HUGE");
        assert!(cut.message.len() <= INLINE_MESSAGE_BYTES);
        let detail = cut.detail.expect("a reference to the whole message");
        assert_eq!(claims.resolve(detail).await.unwrap(), json!(message));
    }
}
