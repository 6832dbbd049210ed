//! The native module of the `cachex` Python package (`cachex._cachex`).
//!
//! A thin binding: each class converts Python values to the stores' types,
//! releases the GIL (`Python::detach`) around file I/O and decoding, calls
//! the store, and converts back. Every class holds its store in one
//! fork-safe `handle::Handle`, converts values through `convert`, and
//! raises store errors through `errors`. Arrays read from mapped files come back as
//! read-only numpy views whose `.base` (a `MappedValue`) owns the mapping,
//! so they stay valid after the store handle is closed or deleted. Errors
//! are raised as the `cachex.errors` hierarchy with the store's message.
//! Every class that takes a cache path also takes a URL: `root.rs` turns
//! it, with the tier keywords, into a `remote_cache::Location` (remote-cache
//! is the one road from a URL to an opened store), and each class opens
//! its store through that road, local or remote alike.
//! The binding writes no format of its own, and neither does the package:
//! each store's on-disk layout, and each commit protocol (a Ray job's
//! included), is written once, in its crate.
//!
//! ```text
//! crates/cachex-py/
//!   Cargo.toml, pyproject.toml   cdylib `_cachex` (abi3-py310), built by maturin;
//!                                README.md is the Python guide (the wheel's long description)
//!   src/lib.rs                   the module: classes and functions below
//!   src/errors.rs                the one error path: store error -> its kind -> its
//!                                cachex.errors class; `enter` (release the GIL, call, map)
//!   src/fork.rs                  the fork hook: marks every live handle in a forked child
//!   src/handle.rs                `Handle`: the one fork-safe holder of an open store
//!   src/array.rs                 numpy dtypes, zero-copy views and copies, array-likes in
//!   src/convert.rs               the one conversion: Python values <-> tensor_core::Value
//!   src/root.rs                  cache roots: a path, or a URL with the tier keywords
//!   src/json.rs                  JSON-able Python values (configs, metadata)
//!   src/check.rs                 verify()/inspect() dicts in the command line's JSON shapes
//!   src/segment.rs (+ segment/stack.rs)          SegmentStore
//!   src/shard.rs                                 ShardStore
//!   src/memmap_{schema,writer,reader,build}.rs   MemmapWriter, MemmapArray, memmap_open_or_build
//!   src/page_{fields,writer,reader}.rs beton.rs  PageWriter, PageReader, BetonReader
//!   src/threaded.rs              ThreadedFill: native threads filling a ring of batch buffers
//!   src/prefetch.rs              Prefetch: a remote reader's background fill of the tier
//!   src/plan_handle.rs           PlanHandle: a reader's plan registered in the tier
//!   src/tier_stats.rs            tier_stats: the counters of a machine's local tier
//!   src/publish.rs               the exit publish of writers on URLs, failures as warnings
//!   src/staged.rs staging.rs     cachex.ray's commits (remote-cache's protocol) and the
//!                                drop-ins' durable write (durable-fs)
//!   src/facade.rs                cachex.open's Cache and CachedFn
//!   src/fingerprint.rs seq.rs    cache keys and fingerprints; loadit's index arithmetic
//!   python/cachex/               the package, by concern:
//!     __init__.py                  the stores (from `_cachex`), errors, open / cached
//!     _cachex.pyi, py.typed        stubs of this module
//!     errors.py facade.py          the error classes; cachex.cached
//!     sampling.py                  the sampling plan (numpy; no torch)
//!     torch/                       datasets.py, loader.py (ResumableDataLoader), ddp.py,
//!                                  _buffers.py: training loops, torch optional
//!     dropins/                     torchcachex.py, loadit/: the drop-ins
//!     ray/                         Ray Data sinks and sources (cachex[ray])
//!     torchcachex/ loadit.py       the drop-ins' import paths (the same modules)
//!     _remote.py                   URL roots and tier keywords
//!   conftest.py                  pytest's shared fixtures (beside pyproject.toml)
//!   tests/                       pytest by concern: stores/ torch/ ray/ dropins/ remote/
//!                                docs/ benches/, helpers in support/
//! ```
//!
//! Install with `pip install ./crates/cachex-py`; then, in Python (this
//! session is the guide's, `README.md`, run as written by
//! `tests/docs/test_readme.py`):
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
mod beton;
mod check;
mod convert;
mod errors;
mod facade;
mod fill;
mod fingerprint;
mod fork;
mod handle;
mod json;
mod memmap_build;
mod memmap_reader;
mod memmap_schema;
mod memmap_writer;
mod page_fields;
mod page_reader;
mod page_writer;
mod plan_handle;
mod prefetch;
mod publish;
mod root;
mod segment;
mod seq;
mod shard;
mod staged;
mod staging;
mod threaded;
mod tier_stats;

use pyo3::prelude::*;

/// `cachex._cachex`: the Rust engine of the `cachex` package.
#[pymodule]
fn _cachex(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<segment::PySegmentStore>()?;
    m.add_function(wrap_pyfunction!(segment::_reopen_segment_store, m)?)?;
    m.add_class::<array::Keeper>()?;
    m.add_class::<memmap_writer::PyMemmapWriter>()?;
    m.add_class::<memmap_reader::PyMemmapArray>()?;
    m.add_function(wrap_pyfunction!(memmap_reader::_reopen_memmap_array, m)?)?;
    m.add_function(wrap_pyfunction!(memmap_build::memmap_open_or_build, m)?)?;
    m.add_class::<facade::PyCache>()?;
    m.add_class::<facade::PyCachedFn>()?;
    m.add_function(wrap_pyfunction!(facade::open, m)?)?;
    m.add_class::<shard::PyShardStore>()?;
    m.add_function(wrap_pyfunction!(shard::_reopen_shard_store, m)?)?;
    m.add_class::<seq::PyInterleaveIndex>()?;
    m.add_function(wrap_pyfunction!(seq::chunk_shuffle_indices, m)?)?;
    m.add_function(wrap_pyfunction!(seq::block_shuffle_indices, m)?)?;
    m.add_function(wrap_pyfunction!(seq::concat_locate, m)?)?;
    m.add_function(wrap_pyfunction!(seq::repeat_index, m)?)?;
    m.add_class::<page_writer::PyPageWriter>()?;
    m.add_class::<page_reader::PyPageReader>()?;
    m.add_class::<prefetch::PyPrefetch>()?;
    m.add_class::<plan_handle::PyPlanHandle>()?;
    m.add_function(wrap_pyfunction!(tier_stats::tier_stats, m)?)?;
    m.add_function(wrap_pyfunction!(page_reader::_reopen_page_reader, m)?)?;
    m.add_class::<threaded::PyThreadedFill>()?;
    m.add_class::<beton::PyBetonReader>()?;
    m.add_function(wrap_pyfunction!(beton::_reopen_beton_reader, m)?)?;
    m.add_function(wrap_pyfunction!(beton::write_beton, m)?)?;
    m.add_function(wrap_pyfunction!(check::verify, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::compute_key, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::compute_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::stale_reason, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::validate, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::check_dir, m)?)?;
    m.add_function(wrap_pyfunction!(bfloat16_is_native, m)?)?;
    m.add_function(wrap_pyfunction!(fork::_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(publish::_publish_at_exit, m)?)?;
    publish::collect_failures();
    staged::register(m)?;
    staging::register(m)?;
    Ok(())
}

/// Whether bfloat16 tensors come back as `ml_dtypes.bfloat16` (true) or as
/// raw `uint16` (false, when `ml_dtypes` is not installed).
#[pyfunction]
fn bfloat16_is_native(py: Python<'_>) -> PyResult<bool> {
    array::bf16_native(py)
}
