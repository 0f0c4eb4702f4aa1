//! Launch function (SQS launch queue and start queue): under the lease its work carries, saves the step
//! as `launching` and sends the request to the step's worker; a StartExecution event starts an execution.

use stepline::handlers::launch;

#[tokio::main]
async fn main() -> Result<(), stepline::lambda::Error> {
    stepline::lambda::serve_sqs(|function, event| async move {
        launch(&function.coordinator, event).await
    })
    .await
}
