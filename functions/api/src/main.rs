//! API function (Lambda function URL, IAM auth; payload format 2.0): the HTTP API of
//! `stepline::http::handle` (executions, interactions, releases).

#[tokio::main]
async fn main() -> Result<(), stepline::lambda::Error> {
    stepline::lambda::serve_http().await
}
