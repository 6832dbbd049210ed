//! The fields of page files and `.beton` files as Python gives and gets
//! them: type specs (`"int"`, `"float"`, `"bytes"`, `"json"`, `(dtype,
//! shape)`), sample values converted in field order, and read-only views
//! of a mapped file's bytes.

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use page_alloc::Value;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict};
use tensor_core::{DType, Shape, TensorView};

use crate::array::RowSink;
use crate::{array, errors};

/// What one field's buffer of a batch holds (`fill_batch`): an int64 or
/// float64 per row, a uint8 row of bytes, or the field's array per row.
pub enum Column<'s> {
    /// int64 `(n,)`.
    Int,
    /// float64 `(n,)`.
    Float,
    /// uint8 `(n, width)`, zero padded.
    Bytes,
    /// The field's dtype, `(n, *shape)`.
    Array(DType, &'s [usize]),
}

/// The caller's buffers `out` (`{field name: numpy array}`) for a batch of
/// `n` samples, each checked against what its field holds (`column(name)`:
/// the field's index and [`Column`], or the error for a name it has not):
/// the names with their field indices, and the arrays, in `out`'s order.
#[allow(clippy::type_complexity)]
pub fn batch_buffers<'py, 's>(
    out: &Bound<'py, PyDict>,
    n: usize,
    mut column: impl FnMut(&str) -> PyResult<(usize, Column<'s>)>,
) -> PyResult<(Vec<(String, usize)>, Vec<Bound<'py, PyUntypedArray>>)> {
    let mut names = Vec::with_capacity(out.len());
    let mut buffers = Vec::with_capacity(out.len());
    for (name, buf) in out.iter() {
        let name: String = name.extract()?;
        let (field, kind) = column(&name)?;
        let a = buf
            .cast_into::<PyUntypedArray>()
            .map_err(|_| errors::invalid(format!("out[{name:?}] must be a numpy array")))?;
        let dtype = array::dtype_of(&a.dtype())?;
        let shape = a.shape().to_vec();
        let ok = match kind {
            Column::Int => dtype == DType::I64 && shape.len() == 1,
            Column::Float => dtype == DType::F64 && shape.len() == 1,
            Column::Bytes => dtype == DType::U8 && shape.len() == 2,
            Column::Array(fd, fs) => dtype == fd && shape.get(1..) == Some(fs),
        };
        if !ok || shape.first().copied().unwrap_or(0) < n {
            return Err(errors::invalid(format!(
                "out[{name:?}]: {dtype} {shape:?} does not fit {n} samples of this field"
            )));
        }
        names.push((name, field));
        buffers.push(a);
    }
    Ok((names, buffers))
}

/// One value as a row of a batch buffer takes it.
pub enum Cell<'a> {
    /// An int, written as 8 little-endian bytes.
    Int(i64),
    /// A float, written as 8 little-endian bytes.
    Float(f64),
    /// Bytes or an array's bytes, zero padded to the row.
    Bytes(&'a [u8]),
}

impl Cell<'_> {
    /// Writes the value into row `k` of `sink`: its length in bytes, or
    /// as the error the length that does not fit the row.
    pub fn write_to(&self, sink: &RowSink<'_>, k: usize) -> Result<usize, usize> {
        let inline: [u8; 8];
        let src: &[u8] = match self {
            Cell::Int(x) => {
                inline = x.to_le_bytes();
                &inline
            }
            Cell::Float(x) => {
                inline = x.to_le_bytes();
                &inline
            }
            Cell::Bytes(b) => b,
        };
        if sink.write(k, src) {
            Ok(src.len())
        } else {
            Err(src.len())
        }
    }
}

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
