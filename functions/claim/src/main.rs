//! Claim function (EventBridge schedule): sweeps the due-time index and takes leases on due executions.

use stepline::handlers::claim_within;

#[tokio::main]
async fn main() -> Result<(), stepline::lambda::Error> {
    // The sweep stops in time to send what it claimed before the invocation's deadline.
    stepline::lambda::serve_schedule(|function, event, deadline| async move {
        claim_within(&function.coordinator, event, deadline).await
    })
    .await
}
