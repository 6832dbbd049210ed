//! The index arithmetic of shard-store's sequence utilities, for
//! `cachex.loadit.util`: the Python wrappers index Python sequences, Rust
//! decides which part and offset an index lands on (one copy of the math,
//! shared with `shard_store::{Concat, Interleave, Repeat, chunk_shuffle}`).

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use shard_store::ConcatStep;

use crate::errors;

/// The permutation of `chunk_shuffle` (int64 array): each chunk of
/// `chunk_size` indices (and the shorter last one) permuted in place,
/// the same for a seed in Rust and Python, on every platform.
#[pyfunction]
pub fn chunk_shuffle_indices(
    py: Python<'_>,
    chunk_size: usize,
    length: usize,
    seed: u64,
) -> Bound<'_, PyArray1<i64>> {
    let idx = py.detach(|| shard_store::chunk_shuffle_indices(chunk_size, length, seed));
    idx.into_iter()
        .map(|i| i as i64)
        .collect::<Vec<i64>>()
        .into_pyarray(py)
}

/// A block-shuffled permutation (int64 array) of `0..sum(blocks)`: the
/// blocks (runs of consecutive indices of the given sizes) in a random
/// order, the indices within each block shuffled; the same for a seed on
/// every platform (`cachex.streams`' passes; shard-store's
/// `block_shuffle_indices`). A negative size is an `InvalidInputError`.
#[pyfunction]
pub fn block_shuffle_indices<'py>(
    py: Python<'py>,
    blocks: PyReadonlyArray1<'_, i64>,
    seed: u64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let sizes = blocks
        .as_array()
        .iter()
        .map(|&n| usize::try_from(n).map_err(|_| n))
        .collect::<Result<Vec<usize>, i64>>()
        .map_err(|n| errors::invalid(format!("block size {n}: sizes are at least 0")))?;
    let idx = py.detach(|| shard_store::block_shuffle_indices(&sizes, seed));
    // In place: usize and i64 have one size, so the collect reuses the buffer.
    Ok(idx
        .into_iter()
        .map(|i| i as i64)
        .collect::<Vec<i64>>()
        .into_pyarray(py))
}

/// Where item `index` of a concatenation lies, given the part lengths
/// learnt so far (`None` unknown): `(part, offset, probe)` — `probe` means
/// the part's length is unknown, so an IndexError from it means "learn
/// its length and ask again" — or `None` past the end.
#[pyfunction]
pub fn concat_locate(known: Vec<Option<usize>>, index: usize) -> Option<(usize, usize, bool)> {
    match shard_store::concat_locate(known.len(), |k| known[k], index) {
        ConcatStep::At { part, offset } => Some((part, offset, false)),
        ConcatStep::Probe { part, offset } => Some((part, offset, true)),
        _ => None,
    }
}

/// Item `index` of a sequence of length `len` repeated `times` times
/// (forever when `None`) is the sequence's item `repeat_index(...)`; `None`
/// past the end.
#[pyfunction]
#[pyo3(signature = (index, len, times=None))]
pub fn repeat_index(index: usize, len: usize, times: Option<usize>) -> Option<usize> {
    shard_store::repeat_index(index, len, times)
}

/// Round-robin placement of items over parts of the given lengths.
#[pyclass(module = "cachex._cachex", name = "InterleaveIndex", frozen)]
pub struct PyInterleaveIndex(shard_store::InterleaveIndex);

#[pymethods]
impl PyInterleaveIndex {
    /// The placement over parts of lengths `lens`.
    #[new]
    fn new(lens: Vec<usize>) -> Self {
        PyInterleaveIndex(shard_store::InterleaveIndex::new(&lens))
    }

    /// The number of items over all parts.
    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// `(part, offset)` of item `index`; IndexError past the end.
    fn locate(&self, index: usize) -> PyResult<(usize, usize)> {
        self.0.locate(index).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "index {index} out of range for length {}",
                self.0.len()
            ))
        })
    }
}
