//! Adapters: the ports implemented on AWS (DynamoDB, SQS, EventBridge, S3, Secrets Manager) and in
//! memory.

pub mod dynamodb;
pub mod eventbridge;
pub mod secrets;

pub use dynamodb::{DynamoDbExecutionStore, DynamoDbReleaseRegistry};
pub use eventbridge::EventBridgePublisher;
pub use stepline_core::adapters::{batches, memory};
pub use stepline_worker::adapters::{s3, sqs};

pub use memory::{
    InMemoryExecutionStore, InMemoryFanOutLedger, InMemoryPayloadStore, InMemoryReleaseRegistry,
    MemoryKeys, RecordingSender,
};
pub use s3::S3PayloadStore;
pub use secrets::SecretsManagerKeys;
pub use sqs::{SqsDeadLetterQueue, SqsSender};
