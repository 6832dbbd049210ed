//! `cachex.compute_key`, `compute_fingerprint`, `stale_reason`, `validate`.

use std::path::PathBuf;

use fingerprint::{Fingerprint, Mode};
use pyo3::prelude::*;

use crate::errors::{self, Kind};
use crate::json;

fn fingerprint_arg(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Fingerprint> {
    let value = json::from_py(obj)?;
    serde_json::from_value(value)
        .map_err(|e| errors::invalid(format!("{what} is not a fingerprint: {e}")))
}

/// The 16-hex-character key naming the cache directory of `config`
/// (any JSON-able value; dict key order does not matter).
#[pyfunction]
pub fn compute_key(config: &Bound<'_, PyAny>) -> PyResult<String> {
    let value = json::from_py(config)?;
    Ok(fingerprint::compute_key(&value)
        .map_err(errors::to_py)?
        .as_str()
        .to_owned())
}

/// The fingerprint of `config` built from `sources` (paths under `root`)
/// by a store at `cache_version`, as a dict (what `fingerprint.json` holds).
#[pyfunction]
#[pyo3(signature = (config, sources=Vec::new(), *, root=None, content_hash=false, cache_version=0))]
pub fn compute_fingerprint<'py>(
    py: Python<'py>,
    config: &Bound<'py, PyAny>,
    sources: Vec<PathBuf>,
    root: Option<PathBuf>,
    content_hash: bool,
    cache_version: u32,
) -> PyResult<Bound<'py, PyAny>> {
    let value = json::from_py(config)?;
    let root = root.unwrap_or_else(|| PathBuf::from("."));
    let mode = if content_hash {
        Mode::Content
    } else {
        Mode::Metadata
    };
    let fp = errors::enter(py, || {
        let stamps = fingerprint::stamp_sources(&root, &sources, mode)?;
        fingerprint::compute_fingerprint(&value, stamps, cache_version)
    })?;
    let value = serde_json::to_value(&fp)
        .map_err(|e| errors::raise(Kind::Other, format!("fingerprint: {e}")))?;
    json::to_py(py, &value)
}

/// Why a cache built with `stored` is stale for `current` (both as
/// returned by `compute_fingerprint`), or `None` when it is not.
#[pyfunction]
pub fn stale_reason(
    stored: &Bound<'_, PyAny>,
    current: &Bound<'_, PyAny>,
) -> PyResult<Option<String>> {
    let stored = fingerprint_arg(stored, "stored")?;
    let current = fingerprint_arg(current, "current")?;
    Ok(stored.stale_reason(&current).map(|s| s.to_string()))
}

/// Raises `StaleError` saying why, when `stored` does not match `current`.
#[pyfunction]
pub fn validate(stored: &Bound<'_, PyAny>, current: &Bound<'_, PyAny>) -> PyResult<()> {
    let stored = fingerprint_arg(stored, "stored")?;
    let current = fingerprint_arg(current, "current")?;
    fingerprint::validate(&stored, &current).map_err(errors::to_py)
}

/// Raises `StaleError` when the cache directory `path`'s `fingerprint.json`
/// is missing, unreadable or does not match `current`.
#[pyfunction]
pub fn check_dir(py: Python<'_>, path: PathBuf, current: &Bound<'_, PyAny>) -> PyResult<()> {
    let current = fingerprint_arg(current, "current")?;
    errors::enter(py, || fingerprint::check_dir(&path, &current))
}
