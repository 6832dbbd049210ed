//! Module-level `memmap_inspect`, `memmap_verify`, `page_verify` and
//! `beton_verify`, kept for callers written before every store class had
//! `verify()` and `inspect()`: each warns (`DeprecationWarning`) and
//! returns the classes' shapes, the command line's JSON. They take a path,
//! so they also check what the classes cannot open (a half-built
//! memmap-array cache, a damaged file).

use std::path::PathBuf;

use cache_facade::{Detected, PeerFormat, StoreKind};
use page_alloc::beton;
use pyo3::exceptions::PyDeprecationWarning;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{check, errors};

fn deprecated(py: Python<'_>, old: &str, new: &str) -> PyResult<()> {
    let message = std::ffi::CString::new(format!("cachex.{old} is deprecated: use {new}"))
        .map_err(|e| errors::invalid(e.to_string()))?;
    PyErr::warn(py, &py.get_type::<PyDeprecationWarning>(), &message, 1)
}

/// Deprecated: `MemmapArray(path).inspect()`. What the memmap-array cache
/// in `path` holds (complete or not), as `cachex inspect --json` prints it.
#[pyfunction]
pub fn memmap_inspect<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    deprecated(py, "memmap_inspect", "MemmapArray(path).inspect()")?;
    let report = errors::enter(py, || memmap_array::inspect(&path))?;
    check::summary_to_py(py, &report.summary())
}

/// Deprecated: `MemmapArray(path).verify()`. Everything wrong with the
/// memmap-array cache in `path`, as `cachex verify --json` prints it.
#[pyfunction]
pub fn memmap_verify<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    deprecated(py, "memmap_verify", "MemmapArray(path).verify()")?;
    let problems = py.detach(|| memmap_array::verify(&path));
    check::verify_to_py(py, StoreKind::MemmapArray, &path, &problems)
}

/// Deprecated: `PageReader(path).verify()`. Everything wrong with the page
/// file at `path`, as `cachex verify --json` prints it.
#[pyfunction]
pub fn page_verify<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    deprecated(py, "page_verify", "PageReader(path).verify()")?;
    let problems = py.detach(|| page_alloc::verify(&path));
    check::verify_to_py(py, StoreKind::PageAlloc, &path, &problems)
}

/// Deprecated: `BetonReader(path).verify()`. Everything wrong with the
/// `.beton` file at `path`, as `cachex verify --json` prints it.
#[pyfunction]
pub fn beton_verify<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    deprecated(py, "beton_verify", "BetonReader(path).verify()")?;
    let problems = py.detach(|| beton::verify(&path));
    check::verify_to_py(py, Detected::peer(PeerFormat::Beton), &path, &problems)
}
