//! Completion function (SQS reply queue): commits a step's outcome and dispatches the next step.

use stepline::handlers::completion;

#[tokio::main]
async fn main() -> Result<(), stepline::lambda::Error> {
    stepline::lambda::serve_sqs(|function, event| async move {
        completion(&function.coordinator, event).await
    })
    .await
}
