//! The `CacheBackend` trait: keyed batch caching over any store.

use std::path::Path;

use crate::Result;

/// The answer to [`CacheBackend::get_batch`]: one slot per key in the
/// caller's order, and the positions of the keys that were not found.
pub type Lookup<V> = (Vec<Option<V>>, Vec<usize>);

/// Counters every backend keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Keys found by `get_batch`.
    pub hits: u64,
    /// Keys not found by `get_batch`.
    pub misses: u64,
    /// Payload bytes returned by `get_batch`.
    pub bytes_read: u64,
    /// Payload bytes accepted by `put_batch`.
    pub bytes_written: u64,
    /// Calls of `flush` (explicit or triggered by the store's policy).
    pub flushes: u64,
}

impl Stats {
    /// Hits over lookups, 0 when nothing was looked up.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// A persistent key -> value cache that works in batches.
///
/// Every method takes `&self`: implementations synchronise internally, so
/// one backend serves many threads (readers never wait on each other; a
/// put waits for the store's writer).
pub trait CacheBackend: Send + Sync {
    /// What the cache holds per key.
    type Value: Clone + Send + Sync;

    /// Looks `keys` up; see [`Lookup`].
    fn get_batch(&self, keys: &[&str]) -> Result<Lookup<Self::Value>>;

    /// Stores `items`; a later `get_batch` in this process sees them at once,
    /// other processes after [`CacheBackend::flush`].
    fn put_batch(&self, items: Vec<(String, Self::Value)>) -> Result<()>;

    /// Makes every put durable.
    fn flush(&self) -> Result<()>;

    /// Number of distinct keys held.
    fn len(&self) -> usize;

    /// Whether no key is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters so far.
    fn stats(&self) -> Stats;

    /// The cache's directory (or file).
    fn path(&self) -> &Path;
}
