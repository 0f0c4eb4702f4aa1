//! Adapters: the ports implemented on AWS (DynamoDB, SQS) and in memory.

pub mod batches;
pub mod dynamodb;
pub mod eventbridge;
pub mod memory;
pub mod sqs;

pub use dynamodb::{DynamoDbExecutionStore, DynamoDbReleaseRegistry};
pub use eventbridge::EventBridgePublisher;
pub use memory::{InMemoryExecutionStore, InMemoryReleaseRegistry, RecordingSender};
pub use sqs::{SqsDeadLetterQueue, SqsSender};
