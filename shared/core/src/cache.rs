//! In-process caches bounded by bytes as well as entries. A Lambda function has a fixed memory size
//! (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`, 128 MB in the template): a cache bounded only by count holds a
//! thousand large outputs as readily as a thousand small ones, and an out-of-memory kill between a
//! commit and its send is exactly the crash the design must then recover from. So each cache gets a
//! share of the function's memory and forgets its oldest entries beyond it.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// The share of the function's memory one cache may hold.
const SHARE_OF_MEMORY: u64 = 8;
/// Memory assumed outside Lambda (the template's size).
const DEFAULT_MEMORY_MB: u64 = 128;

/// A cache's byte budget: an eighth of the function's memory (16 MiB at 128 MB).
pub fn byte_budget() -> usize {
    byte_budget_for(
        std::env::var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE")
            .ok()
            .and_then(|mb| mb.parse().ok()),
    )
}

fn byte_budget_for(memory_mb: Option<u64>) -> usize {
    (memory_mb.unwrap_or(DEFAULT_MEMORY_MB).max(1) * 1024 * 1024 / SHARE_OF_MEMORY) as usize
}

/// A map that forgets its oldest insertions beyond `max_entries` or `max_bytes` (the sum of the
/// weights given at insertion).
#[derive(Debug)]
pub struct BoundedCache<K, V> {
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    entries: HashMap<K, (V, usize)>,
    order: VecDeque<K>,
}

impl<K: Eq + Hash + Clone, V> BoundedCache<K, V> {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            max_entries,
            max_bytes,
            bytes: 0,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(value, _)| value)
    }

    /// Inserts (or replaces) `key`, weighing `bytes`; an entry heavier than the whole budget is not
    /// kept at all.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) {
        if let Some((_, old)) = self.entries.remove(&key) {
            self.bytes -= old;
            self.order.retain(|k| k != &key);
        }
        if bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        self.bytes += bytes;
        self.entries.insert(key.clone(), (value, bytes));
        self.order.push_back(key);
        self.trim();
    }

    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries;
        self.trim();
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The weight of what is held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn trim(&mut self) {
        while self.order.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, weight)) = self.entries.remove(&oldest) {
                self.bytes -= weight;
            }
        }
    }
}

/// The size of a value's JSON text, counted without building it.
pub fn json_size<T: serde::Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest_beyond_its_bytes_or_entries() {
        let mut cache = BoundedCache::new(3, 100);
        cache.insert(1, "a", 40);
        cache.insert(2, "b", 40);
        cache.insert(3, "c", 40);
        assert_eq!((cache.len(), cache.bytes()), (2, 80), "over 100 bytes");
        assert_eq!(cache.get(&1), None);
        cache.insert(4, "d", 1);
        cache.insert(5, "e", 1);
        assert_eq!(cache.len(), 3, "over 3 entries");
        assert_eq!(cache.get(&2), None);
        cache.insert(5, "e2", 10);
        assert_eq!((cache.get(&5), cache.bytes()), (Some(&"e2"), 51));
        cache.insert(6, "too big", 101);
        assert_eq!(cache.get(&6), None);
        cache.set_max_entries(0);
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn the_budget_is_a_share_of_the_functions_memory() {
        assert_eq!(byte_budget_for(Some(128)), 16 * 1024 * 1024);
        assert_eq!(byte_budget_for(Some(1024)), 128 * 1024 * 1024);
        assert_eq!(byte_budget_for(None), 16 * 1024 * 1024);
    }

    #[test]
    fn json_size_is_the_length_of_the_json_text() {
        let value = serde_json::json!({"a": [1, 2, 3], "b": "x"});
        assert_eq!(json_size(&value), value.to_string().len());
    }
}
