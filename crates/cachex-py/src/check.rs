//! `verify()` and `inspect()` of every store class, in the `cachex` command
//! line's JSON shapes: both are built here from the same
//! `cache_check::{Problem, Summary}` the command line prints, the same way
//! (`cachex verify --json` and `cachex inspect --json`), then handed to
//! Python as dicts, so the two cannot differ.

use std::path::{Path, PathBuf};

use cache_check::{Problem, Summary};
use cache_facade::Detected;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::json;

use crate::{errors, json};

/// `cachex.verify(path)`: everything wrong with the cache or file at
/// `path`, whatever its kind, as `cachex verify --json` prints it. It
/// takes a path, not an open store, so it also checks what cannot open (a
/// damaged file, a half-built memmap-array cache).
#[pyfunction]
pub fn verify(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let Some(kind) = cache_facade::detect(&path) else {
        return Err(errors::invalid(format!(
            "{}: no cache or file cachex knows (a segment store, memmap array, shard \
             store, page file, torchcachex directory or .beton file)",
            path.display()
        )));
    };
    let problems = py.detach(|| cache_facade::verify(kind, &path));
    verify_to_py(py, kind, &path, &problems)
}

/// `{"kind", "path", "problems": [{"path", "kind", "detail"}, ...]}`, as
/// `cachex verify --json` prints it (`problems` empty when sound; each
/// `kind` a name such as `"checksum-mismatch"`).
pub fn verify_to_py<'py>(
    py: Python<'py>,
    kind: impl Into<Detected>,
    path: &Path,
    problems: &[Problem],
) -> PyResult<Bound<'py, PyDict>> {
    let value = json!({"kind": kind.into().name(), "path": path, "problems": problems});
    Ok(json::to_py(py, &value)?.cast_into::<PyDict>()?)
}

/// `summary` as `cachex inspect --json` prints it: `kind`, `path`, every
/// fact, and every table as a list of row dicts under its name.
pub fn summary_to_py<'py>(py: Python<'py>, summary: &Summary) -> PyResult<Bound<'py, PyDict>> {
    Ok(json::to_py(py, &summary.to_json())?.cast_into::<PyDict>()?)
}

/// `problems` as the list `verify_to_py` holds under `"problems"`.
pub fn problems_to_py<'py>(
    py: Python<'py>,
    problems: &[Problem],
) -> PyResult<Bound<'py, pyo3::types::PyList>> {
    Ok(json::to_py(py, &json!(problems))?.cast_into::<pyo3::types::PyList>()?)
}
