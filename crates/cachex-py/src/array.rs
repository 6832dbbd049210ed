//! numpy arrays in and out: dtype mapping, zero-copy views over store
//! memory, and contiguous byte access to any array-like a caller passes.

use std::any::Any;
use std::ffi::c_void;
use std::marker::PhantomData;

use numpy::npyffi::{self, NPY_ARRAY_C_CONTIGUOUS, NpyTypes, PY_ARRAY_API, npy_intp};
use numpy::{PyArrayDescr, PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use tensor_core::{DType, Shape, TensorView};

use crate::errors;

/// The numpy dtype of each [`DType`] (in `DType::ALL` order), and whether
/// bfloat16 is `ml_dtypes.bfloat16` (else raw `uint16`).
struct DTypeTable {
    descrs: Vec<Py<PyArrayDescr>>,
    bf16_native: bool,
}

static DTYPES: PyOnceLock<DTypeTable> = PyOnceLock::new();

fn table(py: Python<'_>) -> PyResult<&DTypeTable> {
    DTYPES.get_or_try_init(py, || {
        let bf16 = py
            .import("ml_dtypes")
            .and_then(|m| m.getattr("bfloat16"))
            .ok();
        let bf16_native = bf16.is_some();
        let descrs = DType::ALL
            .iter()
            .map(|&d| {
                let descr = match (d, &bf16) {
                    (DType::BF16, Some(t)) => PyArrayDescr::new(py, t)?,
                    (DType::BF16, None) => PyArrayDescr::new(py, "<u2")?,
                    _ => {
                        let s = d.numpy_str().map_err(|e| errors::invalid(e.to_string()))?;
                        PyArrayDescr::new(py, s)?
                    }
                };
                Ok(descr.unbind())
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok::<_, PyErr>(DTypeTable {
            descrs,
            bf16_native,
        })
    })
}

/// The numpy dtype tensors of `dtype` come back as.
pub fn descr(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    // DType::ALL is in discriminant order, so the discriminant indexes it.
    Ok(table(py)?.descrs[dtype as usize].bind(py).clone())
}

/// Whether bfloat16 maps to `ml_dtypes.bfloat16` (true) or raw `uint16`.
pub fn bf16_native(py: Python<'_>) -> PyResult<bool> {
    Ok(table(py)?.bf16_native)
}

/// The store dtype of a numpy dtype, or `InvalidInputError` naming it.
pub fn dtype_of(descr: &Bound<'_, PyArrayDescr>) -> PyResult<DType> {
    let py = descr.py();
    let t = table(py)?;
    for (&d, known) in DType::ALL.iter().zip(&t.descrs) {
        if d == DType::BF16 && !t.bf16_native {
            continue; // raw uint16 is U16
        }
        if descr.is_equiv_to(known.bind(py)) {
            return Ok(d);
        }
    }
    Err(errors::invalid(format!(
        "numpy dtype {} is not one a cache stores (bool, (u)int8-64, float16/32/64, bfloat16; little-endian)",
        descr.str()?
    )))
}

/// A read-only numpy array over `bytes` (C order, `shape`, `dtype`) whose
/// base object is `owner`: the array keeps `owner` (and so the memory)
/// alive, with no copy.
///
/// # Safety
/// `bytes` must stay valid and unchanged for as long as `owner` lives.
pub unsafe fn view<'py>(
    py: Python<'py>,
    dtype: DType,
    shape: &[usize],
    bytes: &[u8],
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let descr = descr(py, dtype)?;
    let mut dims = npy_dims(shape)?;
    // SAFETY: the array type object comes from numpy's own API table;
    // `PyArray_NewFromDescr` steals the descriptor reference we hand it
    // (`into_dtype_ptr`), reads `dims` only during the call, and with
    // null strides and C-contiguous flags describes exactly
    // `shape.product() * itemsize == bytes.len()` bytes (the store checked
    // the length against dtype and shape). Without NPY_ARRAY_WRITEABLE the
    // array is read-only, so numpy never writes into the mapped file.
    // `PyArray_SetBaseObject` steals the owner reference; the caller
    // guarantees `bytes` lives as long as `owner`.
    unsafe {
        let array = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            bytes.as_ptr() as *mut c_void,
            NPY_ARRAY_C_CONTIGUOUS,
            std::ptr::null_mut(),
        );
        let array = Bound::from_owned_ptr_or_err(py, array)?;
        let owner_ptr = owner.clone().into_ptr();
        if PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner_ptr) != 0 {
            // On failure numpy did not take the reference.
            pyo3::ffi::Py_DECREF(owner_ptr);
            return Err(PyErr::fetch(py));
        }
        Ok(array)
    }
}

/// `shape` as numpy's dimension type (a dimension past `npy_intp` is an
/// invalid input, not a wrap).
fn npy_dims(shape: &[usize]) -> PyResult<Vec<npy_intp>> {
    shape
        .iter()
        .map(|&d| npy_intp::try_from(d).map_err(|_| errors::invalid("dimension too large")))
        .collect()
}

/// A writable numpy array of `dtype` and `shape` that owns a copy of
/// `bytes` (C order).
pub fn copy<'py>(
    py: Python<'py>,
    dtype: DType,
    shape: &[usize],
    bytes: &[u8],
) -> PyResult<Bound<'py, PyAny>> {
    let descr = descr(py, dtype)?;
    let mut dims = npy_dims(shape)?;
    // SAFETY: numpy's own array type and API table; `PyArray_NewFromDescr`
    // steals the descriptor reference (`into_dtype_ptr`), reads `dims` only
    // during the call, and with a null data pointer allocates a fresh
    // C-contiguous buffer of `product(dims) * itemsize` bytes, which equals
    // `bytes.len()` (the store checked the value's length against its
    // dtype and shape). Nothing else refers to the new array while we fill
    // it, and source and destination are distinct allocations.
    unsafe {
        let a = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            dims.len() as std::ffi::c_int,
            dims.as_mut_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
        );
        let a = Bound::from_owned_ptr_or_err(py, a)?;
        if !bytes.is_empty() {
            let raw = a.as_ptr() as *mut npyffi::PyArrayObject;
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (*raw).fields.data as *mut u8,
                bytes.len(),
            );
        }
        Ok(a)
    }
}

/// What keeps the memory of returned arrays alive: a store value (a
/// record of a mapped segment, a row of mapped arrays) held by reference.
/// It is the `.base` of every array built over that value.
#[pyclass(module = "cachex._cachex", name = "MappedValue", frozen)]
pub struct Keeper {
    _value: Box<dyn Any + Send + Sync>,
}

impl Keeper {
    /// A Python object owning `value`.
    pub fn wrap<T: Any + Send + Sync>(py: Python<'_>, value: T) -> PyResult<Bound<'_, PyAny>> {
        Ok(Bound::new(
            py,
            Keeper {
                _value: Box::new(value),
            },
        )?
        .into_any())
    }
}

/// A C-contiguous numpy array of any array-like: numpy arrays as they are
/// when already contiguous, anything else through `numpy.ascontiguousarray`
/// (buffer-protocol objects and `__array__` implementers such as CPU torch
/// tensors convert without a Python list).
pub fn contiguous<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(a) = obj.cast::<PyUntypedArray>()
        && a.is_c_contiguous()
    {
        return Ok(a.clone());
    }
    static ASCONTIGUOUS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let f = ASCONTIGUOUS.get_or_try_init(obj.py(), || {
        Ok::<_, PyErr>(
            obj.py()
                .import("numpy")?
                .getattr("ascontiguousarray")?
                .unbind(),
        )
    })?;
    let a = f.bind(obj.py()).call1((obj,))?;
    a.cast_into::<PyUntypedArray>().map_err(|e| {
        errors::invalid(format!(
            "cannot read a {} as an array",
            e.into_inner().get_type()
        ))
    })
}

/// Calls `f` with a tensor view of a contiguous array's bytes.
pub fn with_tensor<R>(
    array: &Bound<'_, PyUntypedArray>,
    f: impl FnOnce(TensorView<'_>) -> R,
) -> PyResult<R> {
    let dtype = dtype_of(&array.dtype())?;
    let shape = Shape::new(array.shape().iter().copied());
    let len = shape
        .byte_len(dtype)
        .map_err(|e| errors::invalid(e.to_string()))?;
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: the array is C-contiguous with `len` bytes of `dtype`
        // elements at `data`; `array` holds a reference for the whole call,
        // and we hold the GIL, so no Python code resizes or frees it while
        // `f` reads the slice.
        unsafe {
            let raw: *mut npyffi::PyArrayObject = array.as_array_ptr();
            std::slice::from_raw_parts((*raw).fields.data as *const u8, len)
        }
    };
    let view = TensorView::new(dtype, shape, bytes).map_err(|e| errors::invalid(e.to_string()))?;
    Ok(f(view))
}

/// An owned copy of any array-like (see [`contiguous`]), so the store can
/// use it with the GIL released while the caller keeps the original.
pub fn tensor_from_py(obj: &Bound<'_, PyAny>) -> PyResult<tensor_core::Tensor> {
    let a = contiguous(obj)?;
    with_tensor(&a, |v| v.to_tensor())
}

/// The rows of a caller's writable, C-contiguous numpy buffer, which a
/// batch is copied into with the GIL released (`fill_batch`): row `k` is
/// `stride` bytes at `k * stride`.
pub struct RowSink<'a> {
    ptr: *mut u8,
    stride: usize,
    rows: usize,
    _array: PhantomData<&'a ()>,
}

// SAFETY: the sink borrows (`'a`) a reference to the array that the
// caller holds for the whole copy, so its buffer is neither freed nor
// resized (numpy refuses to resize an array with other references); only
// the thread that holds the sink writes through it.
unsafe impl Send for RowSink<'_> {}

impl<'a> RowSink<'a> {
    /// The rows of `array`, after checking it is writable and C-contiguous
    /// (`what` names it in the error).
    pub fn new(what: &str, array: &'a Bound<'_, PyUntypedArray>) -> PyResult<RowSink<'a>> {
        let writable = array
            .getattr("flags")?
            .getattr("writeable")?
            .extract::<bool>()?;
        if !array.is_c_contiguous() || !writable {
            return Err(errors::invalid(format!(
                "{what} must be a writable, C-contiguous numpy array"
            )));
        }
        let dtype = dtype_of(&array.dtype())?;
        let shape = array.shape();
        let rows = shape.first().copied().unwrap_or(0);
        let stride = shape.iter().skip(1).product::<usize>() * dtype.size();
        // SAFETY: reading the data pointer of a live array.
        let ptr = unsafe { (*array.as_array_ptr()).fields.data as *mut u8 };
        Ok(RowSink {
            ptr,
            stride,
            rows,
            _array: PhantomData,
        })
    }

    /// Bytes per row.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Copies `src` to byte `start` of the buffer, leaving the bytes
    /// around it as they are; false (nothing written) when it does not fit.
    pub fn copy_at(&self, start: usize, src: &[u8]) -> bool {
        let end = start.checked_add(src.len());
        if end.is_none_or(|end| end > self.rows * self.stride) {
            return false;
        }
        // SAFETY: `start + src.len()` lies inside the buffer of `rows *
        // stride` bytes (checked above and at construction); `copy` allows
        // the ranges to overlap.
        unsafe { std::ptr::copy(src.as_ptr(), self.ptr.add(start), src.len()) };
        true
    }

    /// Copies `src` into row `k` and zero-fills the rest of the row; false
    /// (nothing written) when `k` is past the end or `src` longer than a row.
    pub fn write(&self, k: usize, src: &[u8]) -> bool {
        if k >= self.rows || src.len() > self.stride {
            return false;
        }
        // SAFETY: row `k` lies inside the buffer (`k < rows`, rows of
        // `stride` bytes, checked at construction from the array's shape),
        // `src.len() <= stride`; `copy` allows the ranges to overlap.
        unsafe {
            let row = self.ptr.add(k * self.stride);
            std::ptr::copy(src.as_ptr(), row, src.len());
            std::ptr::write_bytes(row.add(src.len()), 0, self.stride - src.len());
        }
        true
    }
}
