//! What a worker process remembers of the launches it saw: cancel notices, and the replies of the last
//! completed launches (in-process deduplication); which launches are running now.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use uuid::Uuid;

use crate::cache::{byte_budget, BoundedCache};

/// What this process knows of launches: cancelled ones, completed ones (with their reply) and the ones
/// running now.
pub(super) struct LaunchMemory {
    pub(super) cancelled: BoundedCache<Uuid, ()>,
    /// Reply bodies, bounded by bytes too: a function's memory is fixed, and outputs can be large.
    pub(super) completed: BoundedCache<Uuid, String>,
    pub(super) in_flight: HashSet<Uuid>,
}

impl LaunchMemory {
    pub(super) fn new(cancel_capacity: usize, dedup_capacity: usize) -> Self {
        Self {
            cancelled: BoundedCache::new(cancel_capacity, byte_budget()),
            completed: BoundedCache::new(dedup_capacity, byte_budget()),
            in_flight: HashSet::new(),
        }
    }
}

/// A launch claimed as running in this process; released when dropped (also by a panic or an abort).
pub(super) struct InFlight {
    pub(super) memory: Arc<Mutex<LaunchMemory>>,
    pub(super) launch_id: Uuid,
}

impl InFlight {
    /// Records the launch's reply, in the same critical section that ends the claim, so a redelivery
    /// sees it either running or completed.
    pub(super) fn complete(self, body: String) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes = body.len();
        memory.completed.insert(self.launch_id, body, bytes);
        memory.in_flight.remove(&self.launch_id);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut memory = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        memory.in_flight.remove(&self.launch_id);
    }
}
