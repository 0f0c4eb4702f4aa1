//! Worker function of the csv-payments example: `WORKER_PIPELINE` says which of its two pipelines
//! (`csv-payments` or `csv-payment`) this function serves.

use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let contract = match std::env::var("WORKER_PIPELINE").as_deref() {
        Ok(csv_payments::PAYMENT_PIPELINE) => csv_payments::payment_contract(),
        _ => csv_payments::batch_contract(),
    };
    stepline_worker::lambda::run_worker(contract, Arc::new(csv_payments::CsvSteps)).await
}
