//! Adapters: the ports implemented on AWS (DynamoDB, SQS, EventBridge, S3, Secrets Manager) and in
//! memory.

pub mod batches;
pub mod dynamodb;
pub mod eventbridge;
pub mod memory;
pub mod s3;
pub mod secrets;
pub mod sqs;

pub use dynamodb::{DynamoDbExecutionStore, DynamoDbReleaseRegistry};
pub use eventbridge::EventBridgePublisher;
pub use memory::{
    InMemoryExecutionStore, InMemoryFanOutLedger, InMemoryPayloadStore, InMemoryReleaseRegistry,
    MemoryKeys, RecordingSender,
};
pub use s3::S3PayloadStore;
pub use secrets::SecretsManagerKeys;
pub use sqs::{SqsDeadLetterQueue, SqsSender};
