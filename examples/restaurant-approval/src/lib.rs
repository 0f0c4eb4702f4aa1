//! The `restaurant-approval` pipeline: an order is placed, validated, waits for the manager's
//! approval (an await step whose notices go to the approvals queue, answered with `stepline approve` or
//! through the API), then the kitchen is notified. A rejection or an unanswered approval ends the
//! execution FAILED with the reason (`REJECTED`, `AWAIT_TIMEOUT`).

use async_trait::async_trait;
use serde_json::{json, Value};
use stepline_worker::contract::Contract;
use stepline_worker::domain::{PipelineDef, RetryPolicy, StepDef, StepError};
use stepline_worker::envelope::RequestHeader;
use stepline_worker::worker::StepFunction;

pub const PIPELINE_ID: &str = "restaurant-approval";
pub const RELEASE_VERSION: &str = "1";

/// The definition: `requests` is the worker's request queue, `approvals` where approval requests are
/// announced; `approval_secs` how long the manager has.
pub fn pipeline(requests: &str, approvals: &str, approval_secs: u32) -> PipelineDef {
    let policy = |step: StepDef, input: &str, output: &str, timeout_secs: u32| {
        step.types(input, output)
            .timeout_secs(timeout_secs)
            .retry(RetryPolicy::doubling(3, 500, 5_000))
            .non_retryable(["INVALID_ORDER"])
    };
    PipelineDef::new(
        PIPELINE_ID,
        RELEASE_VERSION,
        [
            policy(
                StepDef::task("validate", requests),
                "restaurant.Order/1",
                "restaurant.ValidOrder/1",
                30,
            ),
            policy(
                StepDef::await_step("approve", approvals).interactions(["manager"]),
                "restaurant.ValidOrder/1",
                "restaurant.ApprovedOrder/1",
                approval_secs,
            ),
            policy(
                StepDef::task("notify", requests),
                "restaurant.ApprovedOrder/1",
                "restaurant.KitchenTicket/1",
                30,
            ),
        ],
    )
}

/// The contract the worker is built for.
pub fn contract() -> Contract {
    Contract::of(&pipeline("", "", 1))
}

/// A sample order.
pub fn sample_order(n: usize) -> Value {
    let dishes = ["risotto", "tagliatelle", "tiramisu", "ossobuco"];
    json!({
        "orderId": format!("table-{}", n + 1),
        "table": n + 1,
        "items": [dishes[n % dishes.len()], dishes[(n + 1) % dishes.len()]],
    })
}

/// The worker's steps.
pub struct RestaurantSteps;

#[async_trait]
impl StepFunction for RestaurantSteps {
    async fn run(&self, request: &RequestHeader, input: Value) -> Result<Value, StepError> {
        match request.step_id.as_str() {
            "validate" => {
                let Some(items) = input["items"].as_array().filter(|i| !i.is_empty()) else {
                    let message = "an order needs at least one item";
                    return Err(StepError::new("INVALID_ORDER", message, false));
                };
                Ok(json!({"orderId": input["orderId"], "table": input["table"], "items": items}))
            }
            "notify" => {
                let approver = input["interactions"]["manager"]["by"]
                    .as_str()
                    .unwrap_or("the manager");
                Ok(json!({
                    "orderId": input["orderId"],
                    "ticket": format!("K-{}", &request.launch_id.simple().to_string()[..6]),
                    "message": format!("table {} approved by {approver}: {}", input["table"], input["items"]),
                }))
            }
            other => Err(StepError::new(
                "UNKNOWN_STEP",
                format!("no step {other:?}"),
                false,
            )),
        }
    }
}
