//! Worker function of the csv-payments example: `WORKER_PIPELINE` says which of its two pipelines
//! (`csv-payments` or `csv-payment`) this function serves.

use std::sync::Arc;

use csv_payments::CsvSteps;
use lambda_runtime::{service_fn, LambdaEvent};
use stepline::aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use stepline::config::WorkerConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline::telemetry::init();
    let contract = match std::env::var("WORKER_PIPELINE").as_deref() {
        Ok(csv_payments::PAYMENT_PIPELINE) => csv_payments::payment_contract(),
        _ => csv_payments::batch_contract(),
    };
    let worker = Arc::new(stepline::aws::worker(
        &stepline::aws::sdk_config().await,
        &WorkerConfig::from_env()?,
        &contract,
        Arc::new(CsvSteps),
    ));
    lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
        let worker = worker.clone();
        async move { Ok::<SqsBatchResponse, lambda_runtime::Error>(worker.handle(event.payload).await) }
    }))
    .await
}
