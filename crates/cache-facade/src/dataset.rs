//! `Dataset`: the indexed counterpart of `CachedFn`, for data loaders.

use tensor_core::Value;

use crate::{CacheBackend, Operation, Result, Stats};

/// An indexed view of a cache — `get(i)`, `get_many(indices)`, `len()` —
/// over any backend that serves indices (memmap-array, shard-store,
/// page-alloc), so a data loader samples any of them the same way.
/// Negative indices count from the end. Cheap to share across threads.
///
/// ```
/// use cache_facade::{StoreKind, CacheConfig, Dataset, Source, open_with_source};
/// use tensor_core::{Tensor, Value};
///
/// let root = tempfile::tempdir()?;
/// let config = CacheConfig::new(StoreKind::PageAlloc, root.path(), "train")
///     .option("resolution", 2);
/// let source = Source::items(|| {
///     (0..10u8).map(|i| Value::dict([("pixels", Tensor::from_vec([2, 2], vec![i; 4]).unwrap())]))
/// });
/// let data = Dataset::new(open_with_source(&config, source)?)?;
/// assert_eq!(data.len()?, 10);
/// let batch = data.get_many(&[3, -1])?;
/// let last = batch[1].get("pixels").and_then(Value::as_tensor).unwrap();
/// assert_eq!(last.as_slice::<u8>()?, &[9; 4]); // a view into the page file
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Dataset<B> {
    backend: B,
}

impl<B: CacheBackend> Dataset<B> {
    /// An indexed view of `backend`; a backend that serves no indices
    /// (segment-store) is [`crate::FacadeError::Unsupported`].
    pub fn new(backend: B) -> Result<Dataset<B>> {
        if !backend.supports(Operation::GetByIndex) {
            return Err(backend.unsupported(Operation::GetByIndex));
        }
        Ok(Dataset { backend })
    }

    /// The value at `index`.
    pub fn get(&self, index: i64) -> Result<Value> {
        self.backend.get_index(index)
    }

    /// The values at `indices`, in the caller's order.
    pub fn get_many(&self, indices: &[i64]) -> Result<Vec<Value>> {
        self.backend.get_indices(indices)
    }

    /// Hints that `indices` come next (see [`CacheBackend::prefetch`]).
    pub fn prefetch(&self, indices: &[i64]) {
        self.backend.prefetch(indices)
    }

    /// Number of values.
    pub fn len(&self) -> Result<u64> {
        self.backend.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> Result<bool> {
        self.backend.is_empty()
    }

    /// The backend's counters.
    pub fn stats(&self) -> Stats {
        self.backend.stats()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }
}
