//! Worker function of the restaurant-approval example.

use std::sync::Arc;

use restaurant_approval::{contract, RestaurantSteps};
use stepline_worker::lambda::run_worker;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    run_worker(contract(), Arc::new(RestaurantSteps)).await
}
