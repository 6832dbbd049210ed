//! The fields of page files and `.beton` files as Python gives and gets
//! them: type specs (`"int"`, `"float"`, `"bytes"`, `"json"`, `(dtype,
//! shape)`), sample values converted in field order, and read-only views
//! of a mapped file's bytes.

use page_alloc::Value;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};
use tensor_core::{DType, Shape, TensorView};

use crate::{array, errors};

/// One field kind as given from Python: `"int"`, `"float"`, `"bytes"`,
/// `"json"` (beton only) or `(dtype, shape)`.
pub enum Spec {
    /// `"int"`.
    Int,
    /// `"float"`.
    Float,
    /// `"bytes"`.
    Bytes,
    /// `"json"`.
    Json,
    /// `(dtype, shape)`.
    Array(DType, Shape),
}

pub fn spec_arg(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Spec> {
    if let Ok(s) = obj.extract::<String>() {
        return match s.as_str() {
            "int" => Ok(Spec::Int),
            "float" => Ok(Spec::Float),
            "bytes" => Ok(Spec::Bytes),
            "json" => Ok(Spec::Json),
            other => Err(errors::invalid(format!(
                "field {name:?}: unknown type {other:?} (int, float, bytes, json or (dtype, shape))"
            ))),
        };
    }
    let (dtype, shape): (Bound<'_, PyAny>, Vec<usize>) = obj.extract().map_err(|_| {
        errors::invalid(format!(
            "field {name:?}: give a type name or (dtype, shape)"
        ))
    })?;
    let descr = numpy::PyArrayDescr::new(obj.py(), &dtype)?;
    Ok(Spec::Array(array::dtype_of(&descr)?, Shape::new(shape)))
}

/// A field value converted from Python, owning its bytes.
pub enum Owned {
    /// An int field's value.
    Int(i64),
    /// A float field's value.
    Float(f64),
    /// A bytes field's value.
    Bytes(Vec<u8>),
    /// An array field's value.
    Tensor(tensor_core::Tensor),
    /// A JSON field's text.
    Json(String),
}

pub fn bytes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    let a = array::contiguous(obj)?;
    array::with_tensor(&a, |v| v.bytes().to_vec())
}

pub fn value_arg(field: &str, spec: &Spec, obj: &Bound<'_, PyAny>) -> PyResult<Owned> {
    let py = obj.py();
    let wrap = |e: PyErr| errors::invalid(format!("field {field:?}: {}", e.value(py)));
    Ok(match spec {
        Spec::Int => Owned::Int(obj.extract().map_err(wrap)?),
        Spec::Float => Owned::Float(obj.extract().map_err(wrap)?),
        Spec::Bytes => Owned::Bytes(bytes_arg(obj).map_err(wrap)?),
        Spec::Json => Owned::Json(match obj.extract::<String>() {
            Ok(s) => s,
            Err(_) => crate::json::to_text(obj).map_err(wrap)?,
        }),
        Spec::Array(dtype, shape) => {
            let t = array::tensor_from_py(obj).map_err(wrap)?;
            if t.dtype() != *dtype || t.shape() != shape {
                return Err(errors::invalid(format!(
                    "field {field:?}: array {} {} where the schema has {} {}",
                    t.dtype(),
                    t.shape(),
                    dtype,
                    shape
                )));
            }
            Owned::Tensor(t)
        }
    })
}

/// The values of one sample (a dict by field name, or a sequence in field
/// order), converted in field order.
pub fn sample_arg(fields: &[(String, Spec)], sample: &Bound<'_, PyAny>) -> PyResult<Vec<Owned>> {
    if let Ok(d) = sample.cast::<PyDict>() {
        if d.len() != fields.len() {
            return Err(errors::invalid(format!(
                "sample has {} fields, the schema {}",
                d.len(),
                fields.len()
            )));
        }
        fields
            .iter()
            .map(|(name, spec)| match d.get_item(name)? {
                Some(v) => value_arg(name, spec, &v),
                None => Err(errors::invalid(format!("sample lacks field {name:?}"))),
            })
            .collect()
    } else {
        let items: Vec<Bound<'_, PyAny>> = sample.extract()?;
        if items.len() != fields.len() {
            return Err(errors::invalid(format!(
                "sample has {} fields, the schema {}",
                items.len(),
                fields.len()
            )));
        }
        fields
            .iter()
            .zip(&items)
            .map(|((name, spec), v)| value_arg(name, spec, v))
            .collect()
    }
}

pub fn page_value(v: &Owned) -> Value<'_> {
    match v {
        Owned::Int(i) => Value::Int(*i),
        Owned::Float(f) => Value::Float(*f),
        Owned::Bytes(b) => Value::Bytes(b),
        Owned::Json(s) => Value::Bytes(s.as_bytes()),
        Owned::Tensor(t) => Value::Bytes(t.bytes()),
    }
}

/// A view of `bytes` (owned by `owner`) as a read-only uint8 array.
///
/// # Safety
/// As [`array::view`]: `bytes` lives and stays unchanged while `owner` does.
pub unsafe fn bytes_view<'py>(
    py: Python<'py>,
    bytes: &[u8],
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded from the caller.
    unsafe { array::view(py, DType::U8, &[bytes.len()], bytes, owner) }
}

/// A tensor view (owned by `owner`) as a read-only numpy array.
///
/// # Safety
/// As [`array::view`].
pub unsafe fn tensor_view<'py>(
    py: Python<'py>,
    t: &TensorView<'_>,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded from the caller.
    unsafe { array::view(py, t.dtype(), t.shape().dims(), t.bytes(), owner) }
}

pub fn index_arg(len: usize, i: i64) -> PyResult<usize> {
    let j = if i < 0 { i + len as i64 } else { i };
    usize::try_from(j).ok().filter(|&j| j < len).ok_or_else(|| {
        pyo3::exceptions::PyIndexError::new_err(format!("sample {i} out of range ({len} samples)"))
    })
}
