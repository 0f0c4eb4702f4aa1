//! Operator function (invoked directly): re-drive or cancel one execution, replay the execution DLQ,
//! or move a coordinator queue's dead letters back. Payload: `{"action": "redrive" | "cancel" |
//! "replay" | "move", ...}` (see `stepline::handlers::OperatorRequest`).

use stepline::handlers::{operator, OperatorRequest};

#[tokio::main]
async fn main() -> Result<(), stepline::lambda::Error> {
    stepline::lambda::serve_invoke(|function, request: OperatorRequest| async move {
        operator(&function.coordinator, &function.dead_letters, request).await
    })
    .await
}
