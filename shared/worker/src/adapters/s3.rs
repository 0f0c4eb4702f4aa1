//! The payload store on S3: one object per claim-checked payload, written whole with one `PutObject`
//! (up to 5 GB) and read with one `GetObject`; a fan-out's items are read in pages (ranged
//! `GetObject`s). Encryption and expiry are the bucket's (template.yaml).

use std::ops::Range;

use async_trait::async_trait;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;

use crate::ports::{PayloadStore, StoreError};

type Result<T> = std::result::Result<T, StoreError>;

#[derive(Clone, Debug)]
pub struct S3PayloadStore {
    client: Client,
}

impl S3PayloadStore {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

fn unavailable<E>(err: aws_sdk_s3::error::SdkError<E>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    if matches!(err.code(), Some("NoSuchKey" | "NoSuchBucket")) {
        return StoreError::Missing(DisplayErrorContext(&err).to_string());
    }
    // `If-None-Match: *` met an object under the key.
    if err.code() == Some("PreconditionFailed") {
        return StoreError::Conflict;
    }
    StoreError::Unavailable(DisplayErrorContext(&err).to_string())
}

#[async_trait]
impl PayloadStore for S3PayloadStore {
    async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.client
            .put_object()
            .bucket(bucket)
            .key(key)
            .if_none_match("*")
            .content_type("application/json")
            .body(ByteStream::from(bytes))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        let object = self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
            .map_err(unavailable)?;
        let bytes =
            object.body.collect().await.map_err(|e| {
                StoreError::Unavailable(format!("reading s3://{bucket}/{key}: {e}"))
            })?;
        Ok(bytes.into_bytes().to_vec())
    }

    async fn get_range(&self, bucket: &str, key: &str, bytes: Range<u64>) -> Result<Vec<u8>> {
        if bytes.is_empty() {
            return Ok(Vec::new());
        }
        let range = format!("bytes={}-{}", bytes.start, bytes.end - 1);
        let object = match self
            .client
            .get_object()
            .bucket(bucket)
            .key(key)
            .range(range)
            .send()
            .await
        {
            Ok(object) => object,
            // A range that starts past the end: nothing more to read.
            Err(e) if e.code() == Some("InvalidRange") => return Ok(Vec::new()),
            Err(e) => return Err(unavailable(e)),
        };
        let bytes =
            object.body.collect().await.map_err(|e| {
                StoreError::Unavailable(format!("reading s3://{bucket}/{key}: {e}"))
            })?;
        Ok(bytes.into_bytes().to_vec())
    }
}
