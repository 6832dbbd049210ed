//! Python values <-> `tensor_core::Value`, the one conversion every store
//! class uses (segment-store records and the facade's values are both a
//! [`Value`]).
//!
//! In: `bytes` and `bytearray` are a blob (both are byte strings in
//! Python, and a blob comes back as `bytes`, which compares equal to the
//! `bytearray` put); a dict with `str` keys is named values, a tuple or a
//! list is items, in order; anything else array-like (a numpy array, a
//! CPU torch tensor, a `memoryview`, a scalar) is one tensor, copied once
//! so the store can use it with the GIL released. A store that holds only
//! one level (segment-store) refuses a nested dict, tuple or list itself.
//!
//! Out: tensors come back as read-only numpy views of the store's memory
//! (a mapped segment or a heap buffer) whose `.base` is a `MappedValue`
//! holding the value, or as writable copies ([`owned_values_to_py`]);
//! blobs as `bytes`; dicts, tuples and lists as themselves.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyString, PyTuple};
use tensor_core::{SharedBytes, SharedTensor, Value};

use crate::array::{self, Keeper};
use crate::errors;

/// A value from Python (see the module docs for what becomes what).
pub fn value_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Blob(SharedBytes::from(b.as_bytes())));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Blob(SharedBytes::from(b.to_vec())));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut items = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let name = k
                .cast::<PyString>()
                .map_err(|_| errors::invalid("dict value keys must be str"))?
                .to_str()?
                .to_owned();
            items.push((Arc::<str>::from(name), value_from_py(&v)?));
        }
        return Ok(Value::Dict(items));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(Value::Tuple(
            t.iter()
                .map(|v| value_from_py(&v))
                .collect::<PyResult<_>>()?,
        ));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(Value::List(
            l.iter()
                .map(|v| value_from_py(&v))
                .collect::<PyResult<_>>()?,
        ));
    }
    Ok(Value::Tensor(SharedTensor::from(array::tensor_from_py(
        obj,
    )?)))
}

/// A value as numpy views (whose base `owner` keeps the value's memory
/// alive), `bytes`, dicts, tuples and lists.
fn value_view<'py>(
    py: Python<'py>,
    value: &Value,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let items = |values: &[Value]| -> PyResult<Vec<Bound<'py, PyAny>>> {
        values.iter().map(|v| value_view(py, v, owner)).collect()
    };
    Ok(match value {
        // SAFETY: the tensor's bytes belong to a `SharedBytes` owner that
        // `owner` holds (through the value or its batch): heap memory or a
        // mapped store file, never mutated, freed only with the last
        // reference.
        Value::Tensor(t) => unsafe {
            array::view(py, t.dtype(), t.shape().dims(), t.bytes(), owner)?
        },
        Value::Blob(b) => PyBytes::new(py, b.as_slice()).into_any(),
        Value::Dict(named) => {
            let d = PyDict::new(py);
            for (name, v) in named {
                d.set_item(&**name, value_view(py, v, owner)?)?;
            }
            d.into_any()
        }
        Value::Tuple(values) => PyTuple::new(py, items(values)?)?.into_any(),
        Value::List(values) => PyList::new(py, items(values)?)?.into_any(),
    })
}

/// One value as views; a `MappedValue` holding it is their base.
pub fn value_to_py(py: Python<'_>, value: Value) -> PyResult<Bound<'_, PyAny>> {
    let owner = Keeper::wrap(py, value.clone())?;
    value_view(py, &value, &owner)
}

/// The values of one batch (`None` where absent) as a list. One
/// `MappedValue` holds the whole batch and is the base of every array in
/// it (one Python object per batch, not per value): an array keeps its
/// batch alive.
pub fn values_to_py(py: Python<'_>, values: Vec<Option<Value>>) -> PyResult<Bound<'_, PyList>> {
    let values = Arc::new(values);
    let owner = Keeper::wrap(py, values.clone())?;
    let out = PyList::empty(py);
    for v in values.iter() {
        match v {
            Some(v) => out.append(value_view(py, v, &owner)?)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// The values of one batch as Python objects that own their bytes:
/// writable arrays, `bytes`, and dicts, tuples and lists of them.
pub fn owned_values_to_py<'py>(
    py: Python<'py>,
    values: &[Option<Value>],
) -> PyResult<Bound<'py, PyList>> {
    let mut out = Vec::with_capacity(values.len());
    for v in values {
        out.push(match v {
            None => py.None().into_bound(py),
            Some(v) => owned_value_to_py(py, v)?,
        });
    }
    PyList::new(py, out)
}

fn owned_value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    let all = |values: &[Value]| -> PyResult<Vec<Bound<'py, PyAny>>> {
        values.iter().map(|v| owned_value_to_py(py, v)).collect()
    };
    Ok(match v {
        Value::Tensor(t) => array::copy(py, t.dtype(), t.shape().dims(), t.bytes())?,
        Value::Blob(b) => PyBytes::new(py, b.as_slice()).into_any(),
        Value::Dict(named) => {
            let d = PyDict::new(py);
            for (name, v) in named {
                d.set_item(&**name, owned_value_to_py(py, v)?)?;
            }
            d.into_any()
        }
        Value::Tuple(values) => PyTuple::new(py, all(values)?)?.into_any(),
        Value::List(values) => PyList::new(py, all(values)?)?.into_any(),
    })
}
