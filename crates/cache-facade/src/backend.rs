//! The `CacheBackend` trait: one interface over the four stores.

use std::path::Path;
use std::sync::Arc;

use tensor_core::Value;

use crate::{FacadeError, Result, StoreKind};

/// The answer to [`CacheBackend::get_batch`]: one slot per key in the
/// caller's order, and the positions of the keys that were not found.
pub type Lookup = (Vec<Option<Value>>, Vec<usize>);

/// Counters every backend keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Keys or indices found.
    pub hits: u64,
    /// Keys not found by `get_batch`.
    pub misses: u64,
    /// Payload bytes returned.
    pub bytes_read: u64,
    /// Payload bytes accepted by `put_batch`.
    pub bytes_written: u64,
    /// Calls of `flush`.
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

/// One operation a backend may be asked for, named in
/// [`FacadeError::Unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// Lookups by string id ([`CacheBackend::get_batch`]).
    GetByKey,
    /// Reads by integer index ([`CacheBackend::get_indices`]).
    GetByIndex,
    /// Writes ([`CacheBackend::put_batch`]).
    Put,
}

impl Operation {
    /// The operation as the user calls it.
    pub fn name(self) -> &'static str {
        match self {
            Operation::GetByKey => "get by string key",
            Operation::GetByIndex => "get by index",
            Operation::Put => "put",
        }
    }
}

/// A persistent cache of [`Value`]s over one of the stores, opened with
/// [`crate::open`].
///
/// Every method takes `&self`: implementations synchronise internally, so
/// one backend serves many threads. A call the store cannot serve (a put
/// on a built page file, a string key on a shard store) returns
/// [`FacadeError::Unsupported`], which says why; [`supports`](Self::supports)
/// asks first. Values are views into the store's files wherever it has
/// them (see the table in the crate docs).
pub trait CacheBackend: Send + Sync {
    /// The store underneath.
    fn kind(&self) -> StoreKind;

    /// Whether `op` is served.
    fn supports(&self, op: Operation) -> bool;

    /// Looks string ids up; see [`Lookup`].
    fn get_batch(&self, keys: &[&str]) -> Result<Lookup> {
        let _ = keys;
        Err(self.unsupported(Operation::GetByKey))
    }

    /// The values at `indices`, in the caller's order; a negative index
    /// counts from the end; one out of range is
    /// [`FacadeError::IndexOutOfRange`].
    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        let _ = indices;
        Err(self.unsupported(Operation::GetByIndex))
    }

    /// Stores `items`; a later `get_batch` in this process sees them at
    /// once, other processes after [`CacheBackend::flush`].
    fn put_batch(&self, items: Vec<(String, Value)>) -> Result<()> {
        let _ = items;
        Err(self.unsupported(Operation::Put))
    }

    /// Hints that the values at `indices` will be read soon, so the store
    /// starts loading them (memmap-array and page-alloc; a no-op elsewhere
    /// and for indices out of range). A loader calls it with the next
    /// batch while it works on the current one.
    fn prefetch(&self, indices: &[i64]) {
        let _ = indices;
    }

    /// Makes every put durable (a no-op for read-only backends).
    fn flush(&self) -> Result<()>;

    /// Number of values held (for shard-store, drives the source to its
    /// end when the length is not yet known).
    fn len(&self) -> Result<u64>;

    /// Whether no value is held.
    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The counters so far.
    fn stats(&self) -> Stats;

    /// The cache's directory.
    fn path(&self) -> &Path;

    /// The error for an operation this backend does not serve.
    fn unsupported(&self, op: Operation) -> FacadeError {
        FacadeError::Unsupported {
            dir: self.path().to_path_buf(),
            backend: self.kind().name(),
            op: op.name(),
            why: crate::backends::why_unsupported(self.kind(), op),
        }
    }

    /// The value of one string id, or `None`.
    fn get(&self, key: &str) -> Result<Option<Value>> {
        let (mut values, _) = self.get_batch(&[key])?;
        Ok(values.pop().flatten())
    }

    /// The value at one index.
    fn get_index(&self, index: i64) -> Result<Value> {
        let mut values = self.get_indices(&[index])?;
        values
            .pop()
            .ok_or_else(|| FacadeError::Backend("get_indices answered no value".into()))
    }
}

/// Forwards every method through a pointer to a backend, so a boxed
/// backend (what [`crate::open`] returns) and a shared one (`Arc`, e.g.
/// one backend behind several handles) are backends too.
macro_rules! forward_backend {
    ($($ptr:ident),*) => {$(
impl<B: CacheBackend + ?Sized> CacheBackend for $ptr<B> {
    fn kind(&self) -> StoreKind {
        (**self).kind()
    }
    fn supports(&self, op: Operation) -> bool {
        (**self).supports(op)
    }
    fn get_batch(&self, keys: &[&str]) -> Result<Lookup> {
        (**self).get_batch(keys)
    }
    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        (**self).get_indices(indices)
    }
    fn put_batch(&self, items: Vec<(String, Value)>) -> Result<()> {
        (**self).put_batch(items)
    }
    fn prefetch(&self, indices: &[i64]) {
        (**self).prefetch(indices)
    }
    fn flush(&self) -> Result<()> {
        (**self).flush()
    }
    fn len(&self) -> Result<u64> {
        (**self).len()
    }
    fn stats(&self) -> Stats {
        (**self).stats()
    }
    fn path(&self) -> &Path {
        (**self).path()
    }
}
    )*};
}

forward_backend!(Box, Arc);
