//! Worker function of the restaurant-approval example.

use std::sync::Arc;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    stepline_worker::lambda::run_worker(
        restaurant_approval::contract(),
        Arc::new(restaurant_approval::RestaurantSteps),
    )
    .await
}
