//! Python values as JSON (configs, fingerprints, row metadata) through the
//! standard `json` module, so any JSON-able Python value is accepted.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use crate::errors;

static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `obj` as a JSON value, or `InvalidInputError` naming what is not JSON.
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text = to_text(obj)?;
    serde_json::from_str(&text).map_err(|e| errors::invalid(format!("not JSON: {e}")))
}

/// `obj` as JSON text (`json.dumps`, keys sorted, no NaN).
pub fn to_text(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = obj.py();
    let dumps = DUMPS.import(py, "json", "dumps")?;
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("sort_keys", true)?;
    kwargs.set_item("allow_nan", false)?;
    dumps
        .call((obj,), Some(&kwargs))
        .map_err(|e| errors::invalid(format!("not JSON-serializable: {}", e.value(py))))?
        .extract()
}

/// JSON text as a Python value (`json.loads`).
pub fn text_to_py<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    LOADS.import(py, "json", "loads")?.call1((text,))
}

/// A JSON value as a Python value.
pub fn to_py<'py>(py: Python<'py>, value: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    text_to_py(py, &value.to_string())
}
