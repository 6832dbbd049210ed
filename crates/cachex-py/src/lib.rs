//! The native module of the `cachex` Python package (`cachex._cachex`).
//!
//! A thin binding: each class converts Python values to the stores' types,
//! releases the GIL (`Python::detach`) around file I/O and decoding, calls
//! the store, and converts back. Arrays read from mapped files come back as
//! read-only numpy views whose `.base` owns the mapping, so they stay valid
//! after the store handle is closed or deleted. Errors are raised as the
//! `cachex.errors` hierarchy with the store's message.
//!
//! The Python package (`python/cachex/`) re-exports these classes with type
//! stubs (`_cachex.pyi`) and documentation; build it with
//! `pip install ./crates/cachex-py` (maturin).

mod array;
mod errors;
mod facade;
mod fingerprint;
mod json;
mod memmap;
mod page;
mod segment;
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
    m.add_class::<page::PyPageWriter>()?;
    m.add_class::<page::PyPageReader>()?;
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
    Ok(())
}

/// Whether bfloat16 tensors come back as `ml_dtypes.bfloat16` (true) or as
/// raw `uint16` (false, when `ml_dtypes` is not installed).
#[pyfunction]
fn bfloat16_is_native(py: Python<'_>) -> PyResult<bool> {
    array::bf16_native(py)
}
