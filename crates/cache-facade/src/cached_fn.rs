//! `CachedFn`: call an expensive batch function only for what is not cached.

use std::collections::HashMap;

use parking_lot::Mutex;

use tensor_core::Value;

use crate::{CacheBackend, FacadeError, Operation, Result, Stats};

/// Counters of a [`CachedFn`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Calls of [`CachedFn::call`].
    pub calls: u64,
    /// Inputs answered from the cache.
    pub hits: u64,
    /// Inputs that had to be computed (duplicates within a batch count once).
    pub computed: u64,
    /// Inputs answered by a duplicate in the same batch.
    pub deduplicated: u64,
    /// Calls of the wrapped function.
    pub compute_calls: u64,
}

/// The decorator: wraps a batch function `compute(&[&input]) -> outputs`
/// with any keyed [`CacheBackend`] (segment-store to cache as you go; a
/// built memmap-array cache to serve what it holds — its misses are
/// computed but cannot be stored, so [`CachedFn::call`] then fails with
/// [`FacadeError::Unsupported`]).
///
/// [`CachedFn::call`] looks every input's stable id up, calls `compute`
/// once with the inputs that missed (each distinct id once), stores their
/// outputs and returns all outputs in the caller's order. It may be called
/// from several threads at once; two threads missing the same id at the
/// same moment may both compute it (the last put wins, and both get a
/// correct value).
pub struct CachedFn<B, F> {
    backend: B,
    compute: F,
    stats: Mutex<CallStats>,
}

impl<B: CacheBackend, F> CachedFn<B, F> {
    /// Wraps `compute` with `backend`, which must serve lookups by key
    /// (else [`FacadeError::Unsupported`]: shard-store and page-alloc
    /// address values by index — see [`crate::Dataset`]).
    pub fn new(backend: B, compute: F) -> Result<Self> {
        if !backend.supports(Operation::GetByKey) {
            return Err(backend.unsupported(Operation::GetByKey));
        }
        Ok(CachedFn {
            backend,
            compute,
            stats: Mutex::new(CallStats::default()),
        })
    }

    /// Outputs for `inputs`, whose stable ids are `ids` (same length, none
    /// empty): cached ones read, the rest computed in one call and cached.
    pub fn call<I, E, K>(&self, inputs: &[I], ids: &[K]) -> Result<Vec<Value>>
    where
        F: Fn(&[&I]) -> std::result::Result<Vec<Value>, E>,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
        K: AsRef<str>,
    {
        if ids.len() != inputs.len() {
            return Err(FacadeError::MissingIds {
                inputs: inputs.len(),
                ids: ids.len(),
            });
        }
        if let Some(index) = ids.iter().position(|id| id.as_ref().is_empty()) {
            return Err(FacadeError::EmptyId { index });
        }
        // Each distinct id once, in first-seen order: `slot_of` maps an id to
        // its position in `keys`, `first_input` to the input computed for it.
        let mut slot_of: HashMap<&str, usize> = HashMap::with_capacity(ids.len());
        let mut keys: Vec<&str> = Vec::new();
        let mut first_input: Vec<usize> = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            slot_of.entry(id.as_ref()).or_insert_with(|| {
                keys.push(id.as_ref());
                first_input.push(i);
                keys.len() - 1
            });
        }
        let (mut found, missing) = self.backend.get_batch(&keys)?;
        if found.len() != keys.len() {
            return Err(FacadeError::Backend(format!(
                "get_batch answered {} slots for {} keys",
                found.len(),
                keys.len()
            )));
        }

        let mut compute_calls = 0;
        if !missing.is_empty() {
            let todo: Vec<&I> = missing.iter().map(|&u| &inputs[first_input[u]]).collect();
            let outputs = (self.compute)(&todo).map_err(|e| FacadeError::Compute(e.into()))?;
            compute_calls = 1;
            if outputs.len() != todo.len() {
                return Err(FacadeError::ComputeCount {
                    expected: todo.len(),
                    got: outputs.len(),
                });
            }
            let mut puts = Vec::with_capacity(outputs.len());
            for (&u, out) in missing.iter().zip(outputs) {
                puts.push((keys[u].to_owned(), out.clone()));
                found[u] = Some(out);
            }
            self.backend.put_batch(puts)?;
        }

        let mut results = Vec::with_capacity(inputs.len());
        for id in ids {
            match found[slot_of[id.as_ref()]].clone() {
                Some(v) => results.push(v),
                None => {
                    return Err(FacadeError::Backend(format!(
                        "no value for id {:?} after computing the misses",
                        id.as_ref()
                    )));
                }
            }
        }

        let mut stats = self.stats.lock();
        stats.calls += 1;
        stats.hits += (keys.len() - missing.len()) as u64;
        stats.computed += missing.len() as u64;
        stats.deduplicated += (ids.len() - keys.len()) as u64;
        stats.compute_calls += compute_calls;
        Ok(results)
    }

    /// The counters so far.
    pub fn stats(&self) -> CallStats {
        *self.stats.lock()
    }

    /// The backend's own counters (bytes read and written, flushes).
    pub fn backend_stats(&self) -> Stats {
        self.backend.stats()
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Flushes the backend.
    pub fn flush(&self) -> Result<()> {
        self.backend.flush()
    }
}
