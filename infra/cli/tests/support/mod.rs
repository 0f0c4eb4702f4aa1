//! What the CLI's end-to-end tests share: a stage the local stack runs with the example workers.

use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use stepline::domain::StepError;
use stepline::envelope::RequestHeader;
use stepline::worker::StepFunction;
use stepline_local::{fresh_stage, functions, LocalStack};

/// A process's standard output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The order steps, each taking a moment (so `watch` and the console have progress to follow).
pub struct Paced;

#[async_trait::async_trait]
impl StepFunction for Paced {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        tokio::time::sleep(Duration::from_millis(300)).await;
        if request.step_id == "notify"
            || request.step_id == "validate" && input.get("table").is_some()
        {
            return restaurant_approval::RestaurantSteps
                .run(request, input)
                .await;
        }
        order_worker::OrderSteps.run(request, input).await
    }
}

/// A fresh stage with the order and restaurant examples released and their workers running.
pub async fn running_stack(prefix: &str) -> Result<(LocalStack, stepline_local::Runner)> {
    let local = LocalStack::up(&fresh_stage(prefix)).await?;
    let (orders, _) = local.stack.queue("OrderRequestQueue")?;
    local
        .release_example(orders, order_worker::RELEASE_VERSION, 60)
        .await?;
    local.release_restaurant().await?;
    let runner = local.run_workers(vec![
        (
            functions::ORDER_WORKER,
            order_worker::contract(),
            Arc::new(Paced),
        ),
        (
            "RestaurantWorkerFunction",
            restaurant_approval::contract(),
            Arc::new(Paced),
        ),
    ])?;
    Ok((local, runner))
}
