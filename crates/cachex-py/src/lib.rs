//! The native module of the `cachex` Python package (`cachex._cachex`).
//!
//! A thin binding: each class converts Python values to the stores' types,
//! releases the GIL (`Python::detach`) around file I/O and decoding, calls
//! the store, and converts back. Arrays read from mapped files come back as
//! read-only numpy views whose `.base` (a `MappedValue`) owns the mapping,
//! so they stay valid after the store handle is closed or deleted. Errors
//! are raised as the `cachex.errors` hierarchy with the store's message.
//! The binding writes no format of its own: each store's on-disk layout is
//! documented in its crate.
//!
//! ```text
//! crates/cachex-py/
//!   Cargo.toml, pyproject.toml   cdylib `_cachex` (abi3-py310), built by maturin
//!   src/lib.rs                   the module: classes and functions below
//!   src/array.rs                 numpy dtypes, zero-copy views, array-likes in
//!   src/errors.rs                store errors -> cachex.errors classes
//!   src/fork.rs                  the fork hook: marks every live handle in a forked child
//!   src/json.rs                  JSON-able Python values (configs, metadata)
//!   src/segment.rs shard.rs memmap.rs page.rs fingerprint.rs facade.rs seq.rs
//!                                one store (or crate) each
//!   python/cachex/               the package: __init__, errors, facade, workload, data, loadit/,
//!                                _cachex.pyi stubs, py.typed
//!   tests/                       pytest, grouped by store
//! ```
//!
//! Install with `pip install ./crates/cachex-py`; then, in Python (this
//! session is the README's, run as written by `tests/test_readme.py`):
//!
//! ```text
//! import numpy as np
//! import cachex
//!
//! with cachex.SegmentStore("feature-cache") as store:
//!     store.put_batch({f"sample_{i}": np.full((2, 3), i, np.float32) for i in range(4)})
//!     store.flush()
//!
//! store = cachex.SegmentStore("feature-cache", read_only=True)
//! values, missing = store.get_batch(["sample_2", "sample_9"])
//! assert missing == [1] and values[0].shape == (2, 3) and values[0][0, 0] == 2.0
//! ```
//!
//! A Rust doc-test cannot run this (an extension module has no interpreter
//! to link), so the crate's tests are the pytest suite that `scripts/test`
//! runs after building the module with `maturin develop`.

mod array;
mod errors;
mod facade;
mod fingerprint;
mod fork;
mod json;
mod memmap;
mod page;
mod segment;
mod seq;
mod shard;

use pyo3::prelude::*;

/// `cachex._cachex`: the Rust engine of the `cachex` package.
#[pymodule]
fn _cachex(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<segment::PySegmentStore>()?;
    m.add_class::<array::Keeper>()?;
    m.add_class::<memmap::PyMemmapWriter>()?;
    m.add_class::<memmap::PyMemmapArray>()?;
    m.add_function(wrap_pyfunction!(memmap::_reopen_memmap_array, m)?)?;
    m.add_function(wrap_pyfunction!(memmap::memmap_open_or_build, m)?)?;
    m.add_function(wrap_pyfunction!(memmap::memmap_inspect, m)?)?;
    m.add_function(wrap_pyfunction!(memmap::memmap_verify, m)?)?;
    m.add_class::<facade::PyCache>()?;
    m.add_class::<facade::PyCachedFn>()?;
    m.add_function(wrap_pyfunction!(facade::open, m)?)?;
    m.add_class::<shard::PyShardStore>()?;
    m.add_function(wrap_pyfunction!(shard::_reopen_shard_store, m)?)?;
    m.add_class::<seq::PyInterleaveIndex>()?;
    m.add_function(wrap_pyfunction!(seq::chunk_shuffle_indices, m)?)?;
    m.add_function(wrap_pyfunction!(seq::concat_locate, m)?)?;
    m.add_function(wrap_pyfunction!(seq::repeat_index, m)?)?;
    m.add_class::<page::PyPageWriter>()?;
    m.add_class::<page::PyPageReader>()?;
    m.add_function(wrap_pyfunction!(page::_reopen_page_reader, m)?)?;
    m.add_class::<page::PyBetonReader>()?;
    m.add_function(wrap_pyfunction!(page::write_beton, m)?)?;
    m.add_function(wrap_pyfunction!(page::page_verify, m)?)?;
    m.add_function(wrap_pyfunction!(page::beton_verify, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::compute_key, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::compute_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::stale_reason, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::validate, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::check_dir, m)?)?;
    m.add_function(wrap_pyfunction!(bfloat16_is_native, m)?)?;
    m.add_function(wrap_pyfunction!(fork::_after_fork_in_child, m)?)?;
    Ok(())
}

/// Whether bfloat16 tensors come back as `ml_dtypes.bfloat16` (true) or as
/// raw `uint16` (false, when `ml_dtypes` is not installed).
#[pyfunction]
fn bfloat16_is_native(py: Python<'_>) -> PyResult<bool> {
    array::bf16_native(py)
}
