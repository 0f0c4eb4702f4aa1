//! The example pipeline, `orders`: three steps run by one worker.
//!
//! 1. `validate` — checks the order has lines with positive quantities (non-retryable `INVALID_ORDER`).
//! 2. `price` — prices the lines and adds the total.
//! 3. `confirm` — issues a confirmation number derived from the launch id (idempotent on it).

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline_worker::contract::Contract;
use stepline_worker::domain::{PipelineDef, RetryPolicy, StepDef, StepError};
use stepline_worker::envelope::RequestHeader;
use stepline_worker::worker::StepFunction;

pub const PIPELINE_ID: &str = "orders";
pub const RELEASE_VERSION: &str = "1";

/// The pipeline definition; `queue` is the name of the worker's request queue.
pub fn pipeline(queue: &str) -> PipelineDef {
    let step = |id: &str, input: &str, output: &str| {
        StepDef::task(id, queue)
            .types(input, output)
            .timeout_secs(60)
            .retry(RetryPolicy::doubling(3, 500, 10_000))
    };
    PipelineDef::new(
        PIPELINE_ID,
        RELEASE_VERSION,
        [
            step("validate", "orders.Order/1", "orders.ValidOrder/1"),
            step("price", "orders.ValidOrder/1", "orders.PricedOrder/1"),
            step("confirm", "orders.PricedOrder/1", "orders.Confirmation/1"),
        ],
    )
}

/// The contract this worker is built for (queues and release versions are deployment, not contract).
pub fn contract() -> Contract {
    Contract::of(&pipeline(""))
}

/// A sample order input.
pub fn sample_order(n: usize) -> Value {
    json!({
        "orderId": format!("order-{n}"),
        "lines": [
            {"sku": "espresso", "qty": 1 + n % 3, "unitCents": 250},
            {"sku": "croissant", "qty": 1, "unitCents": 320}
        ]
    })
}

pub struct OrderSteps;

fn invalid(message: &str) -> StepError {
    StepError::new("INVALID_ORDER", message, false)
}

/// An order's total: each line's `qty` times its `unitCents`.
pub fn total_cents(order: &Value) -> u64 {
    order["lines"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| l["qty"].as_u64().unwrap_or(0) * l["unitCents"].as_u64().unwrap_or(0))
        .sum()
}

#[async_trait]
impl StepFunction for OrderSteps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_id.as_str() {
            "validate" => {
                let lines = input["lines"]
                    .as_array()
                    .filter(|l| !l.is_empty())
                    .ok_or_else(|| invalid("an order needs at least one line"))?;
                if lines.iter().any(|l| l["qty"].as_u64().unwrap_or(0) == 0) {
                    return Err(invalid("every line needs a positive qty"));
                }
                Ok(json!({"orderId": input["orderId"], "lines": lines, "valid": true}))
            }
            "price" => {
                let total = total_cents(&input);
                Ok(json!({"orderId": input["orderId"], "totalCents": total}))
            }
            "confirm" => Ok(json!({
                "orderId": input["orderId"],
                "totalCents": input["totalCents"],
                "confirmation": format!("C-{}", &request.launch_id.simple().to_string()[..8]),
            })),
            other => Err(StepError::new(
                "UNKNOWN_STEP",
                format!("this worker has no step {other:?}"),
                false,
            )),
        }
    }
}
