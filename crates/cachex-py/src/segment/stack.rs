//! Batches as fresh arrays: `SegmentStore.get_stacked` (one array per
//! tensor part, row `i` is key `i`, copied with the GIL released, so a
//! batch costs a few Python objects instead of one or more per record).

use std::path::Path;

use numpy::npyffi;
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use tensor_core::{DType, SharedTensor, Value};

use crate::array;
use crate::errors;

/// One part of a record, as the batch sees it.
enum PartRef<'a> {
    Tensor(&'a SharedTensor),
    Blob(&'a [u8]),
    /// A dict, tuple or list inside a record: the store refuses to write
    /// one, so a batch that has one cannot be stacked.
    Nested,
}

fn part_ref(p: &Value) -> PartRef<'_> {
    match p {
        Value::Tensor(t) => PartRef::Tensor(t),
        Value::Blob(b) => PartRef::Blob(b.as_slice()),
        _ => PartRef::Nested,
    }
}

fn parts_of(r: &Value) -> Vec<PartRef<'_>> {
    match r {
        Value::Tensor(t) => vec![PartRef::Tensor(t)],
        Value::Blob(b) => vec![PartRef::Blob(b.as_slice())],
        Value::Dict(ps) => ps.iter().map(|(_, p)| part_ref(p)).collect(),
        Value::Tuple(ps) | Value::List(ps) => ps.iter().map(part_ref).collect(),
    }
}

/// What part `j` of every record of the batch is.
enum Column {
    Tensor {
        dtype: DType,
        dims: Vec<usize>,
        row_bytes: usize,
    },
    Blob,
}

/// A fresh array's first byte and row size, as plain numbers so the copy
/// can run with the GIL released.
#[derive(Clone, Copy)]
struct Dest {
    addr: usize,
    row_bytes: usize,
}

/// The batch's value for `get_stacked`: `None` when no key was found, else
/// shaped like one record (an array, a dict, a tuple or a list of columns;
/// a blob part is a list of `bytes`/`None`) with a leading batch axis.
/// Rows of missing keys are zero.
pub(crate) fn stacked_to_py<'py>(
    py: Python<'py>,
    dir: &Path,
    records: &[Option<Value>],
) -> PyResult<Bound<'py, PyAny>> {
    let Some(first) = records.iter().flatten().next() else {
        return Ok(py.None().into_bound(py));
    };
    let columns: Vec<Column> = parts_of(first)
        .iter()
        .map(|p| match p {
            PartRef::Tensor(t) => Ok(Column::Tensor {
                dtype: t.dtype(),
                dims: t.shape().dims().to_vec(),
                row_bytes: t.bytes().len(),
            }),
            PartRef::Blob(_) => Ok(Column::Blob),
            PartRef::Nested => Err(differ(dir, "nesting (a value inside a value)")),
        })
        .collect::<PyResult<_>>()?;
    for r in records.iter().flatten() {
        if std::mem::discriminant(r) != std::mem::discriminant(first) {
            return Err(differ(dir, "structure"));
        }
        let parts = parts_of(r);
        if parts.len() != columns.len() {
            return Err(differ(dir, "number of parts"));
        }
        for (p, c) in parts.iter().zip(&columns) {
            match (p, c) {
                (PartRef::Tensor(t), Column::Tensor { dtype, dims, .. })
                    if t.dtype() == *dtype && t.shape().dims() == dims.as_slice() => {}
                (PartRef::Blob(_), Column::Blob) => {}
                _ => return Err(differ(dir, "shape or dtype")),
            }
        }
    }

    let n = records.len();
    let mut arrays: Vec<Option<Bound<'py, PyUntypedArray>>> = Vec::with_capacity(columns.len());
    let mut dests: Vec<Option<Dest>> = Vec::with_capacity(columns.len());
    for c in &columns {
        match c {
            Column::Tensor {
                dtype,
                dims,
                row_bytes,
            } => {
                let a = empty(py, n, dims, *dtype)?;
                let raw: *mut npyffi::PyArrayObject = a.as_array_ptr();
                // SAFETY: `a` is a live array we just created; reading its
                // data pointer field does not touch the data.
                let addr = unsafe { (*raw).fields.data } as usize;
                dests.push(Some(Dest {
                    addr,
                    row_bytes: *row_bytes,
                }));
                arrays.push(Some(a));
            }
            Column::Blob => {
                dests.push(None);
                arrays.push(None);
            }
        }
    }
    py.detach(|| {
        for (i, r) in records.iter().enumerate() {
            let parts = r.as_ref().map(parts_of);
            for (j, d) in dests.iter().enumerate() {
                let Some(d) = d else { continue };
                let dst = (d.addr + i * d.row_bytes) as *mut u8;
                match parts.as_ref().map(|ps| &ps[j]) {
                    Some(PartRef::Tensor(t)) => {
                        // SAFETY: the array was allocated above as `n`
                        // C-contiguous rows of `row_bytes` bytes, and every
                        // record's part was checked to have exactly that
                        // many bytes; no Python object but the one we hold
                        // refers to the array yet, so nothing else reads or
                        // writes it while the GIL is released; the source is
                        // a record buffer distinct from the fresh array.
                        unsafe {
                            std::ptr::copy_nonoverlapping(t.bytes().as_ptr(), dst, d.row_bytes)
                        }
                    }
                    // SAFETY: as above: row `i` of the fresh array, in bounds.
                    _ => unsafe { std::ptr::write_bytes(dst, 0, d.row_bytes) },
                }
            }
        }
    });

    let mut cols: Vec<Bound<'py, PyAny>> = Vec::with_capacity(columns.len());
    for (j, a) in arrays.into_iter().enumerate() {
        match a {
            Some(a) => cols.push(a.into_any()),
            None => {
                let list = PyList::empty(py);
                for r in records {
                    match r.as_ref().map(parts_of) {
                        Some(ps) => match ps[j] {
                            PartRef::Blob(b) => list.append(PyBytes::new(py, b))?,
                            // Every record's parts were checked against the
                            // columns above; a mismatch here is still an
                            // error, never a panic.
                            _ => return Err(differ(dir, "shape or dtype")),
                        },
                        None => list.append(py.None())?,
                    }
                }
                cols.push(list.into_any());
            }
        }
    }
    Ok(match first {
        Value::Tensor(_) | Value::Blob(_) => cols.swap_remove(0),
        Value::Dict(ps) => {
            let d = PyDict::new(py);
            for ((name, _), col) in ps.iter().zip(cols) {
                d.set_item(&**name, col)?;
            }
            d.into_any()
        }
        Value::Tuple(_) => PyTuple::new(py, cols)?.into_any(),
        Value::List(_) => PyList::new(py, cols)?.into_any(),
    })
}

fn differ(dir: &Path, what: &str) -> PyErr {
    errors::invalid(format!(
        "{}: the records of this batch differ in {what}; read them with get_batch",
        dir.display()
    ))
}

/// A fresh, writable, C-contiguous `(n, *dims)` numpy array of `dtype`.
fn empty<'py>(
    py: Python<'py>,
    n: usize,
    dims: &[usize],
    dtype: DType,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    static EMPTY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let f = EMPTY.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("numpy")?.getattr("empty")?.unbind())
    })?;
    let shape: Vec<usize> = std::iter::once(n).chain(dims.iter().copied()).collect();
    let shape = PyTuple::new(py, shape)?;
    let a = f.bind(py).call1((shape, array::descr(py, dtype)?))?;
    let a = a.cast_into::<PyUntypedArray>().map_err(|e| {
        errors::invalid(format!(
            "numpy.empty returned {}",
            e.into_inner().get_type()
        ))
    })?;
    if !a.is_c_contiguous() {
        return Err(errors::invalid(
            "numpy.empty returned a non-contiguous array",
        ));
    }
    Ok(a)
}
