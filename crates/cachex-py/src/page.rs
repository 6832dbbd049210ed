//! `cachex.PageWriter`, `cachex.PageReader` and FFCV `.beton` files
//! (`BetonReader`, `write_beton`) of `page-alloc`.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use page_alloc::beton::{self, BetonField, BetonFile, BetonType, BetonValue};
use page_alloc::{FieldType, FieldValue, PageReader, PageWriter, Schema, Value, WriterOptions};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};
use tensor_core::{DType, Shape, TensorView};

use crate::array::{self, Keeper};
use crate::errors::{self, Kind};

/// A page-alloc error as its `cachex.errors` exception.
pub fn error(e: page_alloc::Error) -> PyErr {
    use page_alloc::Error as E;
    let kind = match &e {
        E::Io { .. } => Kind::Io,
        E::Locked { .. } => Kind::Locked,
        _ if e.is_bad_file() => Kind::Corrupt,
        E::Invalid { .. }
        | E::BadSample { .. }
        | E::OutOfRange { .. }
        | E::Field { .. }
        | E::PoolTooSmall { .. } => Kind::InvalidInput,
        _ => Kind::Other,
    };
    errors::raise(kind, e.to_string())
}

/// One field kind as given from Python: `"int"`, `"float"`, `"bytes"`,
/// `"json"` (beton only) or `(dtype, shape)`.
enum Spec {
    Int,
    Float,
    Bytes,
    Json,
    Array(DType, Shape),
}

fn spec_arg(name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Spec> {
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
enum Owned {
    Int(i64),
    Float(f64),
    Bytes(Vec<u8>),
    Tensor(tensor_core::Tensor),
    Json(String),
}

fn bytes_arg(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    let a = array::contiguous(obj)?;
    array::with_tensor(&a, |v| v.bytes().to_vec())
}

fn value_arg(field: &str, spec: &Spec, obj: &Bound<'_, PyAny>) -> PyResult<Owned> {
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
fn sample_arg(fields: &[(String, Spec)], sample: &Bound<'_, PyAny>) -> PyResult<Vec<Owned>> {
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

fn page_value(v: &Owned) -> Value<'_> {
    match v {
        Owned::Int(i) => Value::Int(*i),
        Owned::Float(f) => Value::Float(*f),
        Owned::Bytes(b) => Value::Bytes(b),
        Owned::Json(s) => Value::Bytes(s.as_bytes()),
        Owned::Tensor(t) => Value::Bytes(t.bytes()),
    }
}

/// The writer of a page file.
#[pyclass(module = "cachex._cachex", name = "PageWriter", frozen)]
pub struct PyPageWriter {
    path: PathBuf,
    fields: Vec<(String, Spec)>,
    writer: Mutex<Option<PageWriter>>,
}

impl PyPageWriter {
    fn with<R>(&self, f: impl FnOnce(&mut PageWriter) -> PyResult<R>) -> PyResult<R> {
        match self.writer.lock().as_mut() {
            Some(w) => f(w),
            None => Err(errors::raise(
                Kind::Other,
                format!("{}: writer is finalized", self.path.display()),
            )),
        }
    }

    fn convert(&self, samples: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<Owned>>> {
        samples
            .try_iter()?
            .enumerate()
            .map(|(k, s)| {
                sample_arg(&self.fields, &s?)
                    .map_err(|e| errors::invalid(format!("sample {k}: {}", e.value(samples.py()))))
            })
            .collect()
    }
}

#[pymethods]
impl PyPageWriter {
    #[new]
    #[pyo3(signature = (path, fields, *, page_size=None, alignment=None, direct_io=false))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        fields: &Bound<'_, PyDict>,
        page_size: Option<u64>,
        alignment: Option<u32>,
        direct_io: bool,
    ) -> PyResult<Self> {
        let mut specs = Vec::with_capacity(fields.len());
        let mut schema = Schema::new();
        for (name, spec) in fields.iter() {
            let name: String = name.extract()?;
            let spec = spec_arg(&name, &spec)?;
            schema = schema.field(
                name.clone(),
                match &spec {
                    Spec::Int => FieldType::Int,
                    Spec::Float => FieldType::Float,
                    Spec::Bytes => FieldType::Bytes,
                    Spec::Json => {
                        return Err(errors::invalid(format!(
                            "field {name:?}: json fields are for .beton files; use bytes"
                        )));
                    }
                    Spec::Array(d, s) => FieldType::Array {
                        dtype: *d,
                        shape: s.clone(),
                    },
                },
            );
            specs.push((name, spec));
        }
        let mut opts = WriterOptions::default().direct_io(direct_io);
        if let Some(p) = page_size {
            opts = opts.page_size(p);
        }
        if let Some(a) = alignment {
            opts = opts.alignment(a);
        }
        let w = py
            .detach(|| PageWriter::create(&path, schema, opts))
            .map_err(error)?;
        Ok(PyPageWriter {
            path,
            fields: specs,
            writer: Mutex::new(Some(w)),
        })
    }

    /// Samples written so far.
    fn __len__(&self) -> PyResult<usize> {
        self.with(|w| Ok(w.len() as usize))
    }

    /// Appends one sample; returns its index.
    fn append(&self, py: Python<'_>, sample: &Bound<'_, PyAny>) -> PyResult<u64> {
        let values = sample_arg(&self.fields, sample)?;
        self.with(|w| {
            py.detach(|| {
                let vals: Vec<Value<'_>> = values.iter().map(page_value).collect();
                w.append(&vals)
            })
            .map_err(error)
        })
    }

    /// Appends many samples, filling pages from `threads` threads (the
    /// file's bytes do not depend on the thread count).
    #[pyo3(signature = (samples, threads=2))]
    fn write_many(
        &self,
        py: Python<'_>,
        samples: &Bound<'_, PyAny>,
        threads: usize,
    ) -> PyResult<()> {
        let owned = self.convert(samples)?;
        self.with(|w| {
            py.detach(|| {
                let rows: Vec<Vec<Value<'_>>> = owned
                    .iter()
                    .map(|s| s.iter().map(page_value).collect())
                    .collect();
                w.write_parallel(&rows[..], threads.max(1))
            })
            .map(drop)
            .map_err(error)
        })
    }

    /// Writes the tables and the footer, fsyncs and renames the file into
    /// place; returns a summary. The writer is closed after.
    fn finalize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.writer.lock().take().ok_or_else(|| {
            errors::raise(
                Kind::Other,
                format!("{}: writer is finalized", self.path.display()),
            )
        })?;
        let s = py.detach(|| w.finalize()).map_err(error)?;
        let d = PyDict::new(py);
        d.set_item("path", &s.path)?;
        d.set_item("num_samples", s.num_samples)?;
        d.set_item("num_runs", s.num_runs)?;
        d.set_item("num_pages", s.num_pages)?;
        d.set_item("data_bytes", s.data_bytes)?;
        d.set_item("file_len", s.file_len)?;
        d.set_item("direct_io", s.direct_io)?;
        Ok(d)
    }
}

/// A validated, memory-mapped page file.
#[pyclass(module = "cachex._cachex", name = "PageReader", frozen)]
pub struct PyPageReader {
    reader: Arc<PageReader>,
    keeper: Py<PyAny>,
}

/// A view of `bytes` (owned by `owner`) as a read-only uint8 array.
///
/// # Safety
/// As [`array::view`]: `bytes` lives and stays unchanged while `owner` does.
unsafe fn bytes_view<'py>(
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
unsafe fn tensor_view<'py>(
    py: Python<'py>,
    t: &TensorView<'_>,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded from the caller.
    unsafe { array::view(py, t.dtype(), t.shape().dims(), t.bytes(), owner) }
}

fn index_arg(len: usize, i: i64) -> PyResult<usize> {
    let j = if i < 0 { i + len as i64 } else { i };
    usize::try_from(j).ok().filter(|&j| j < len).ok_or_else(|| {
        pyo3::exceptions::PyIndexError::new_err(format!("sample {i} out of range ({len} samples)"))
    })
}

/// One writable destination of `fill_batch`: a C-contiguous numpy buffer.
struct Dest {
    field: usize,
    kind: DestKind,
    ptr: *mut u8,
    /// Bytes per sample in the buffer.
    stride: usize,
}

enum DestKind {
    Int,
    Float,
    Bytes,
    Array,
}

/// The destinations, carried into the GIL-free copy loop.
struct Dests(Vec<Dest>);

// SAFETY: the pointers address numpy buffers that the caller's `out`
// dict keeps alive for the whole `fill_batch` call (we hold references to
// the arrays in the enclosing frame), and only this thread writes through
// them during the call.
unsafe impl Send for Dests {}

#[pymethods]
impl PyPageReader {
    #[new]
    #[pyo3(signature = (path, *, populate=false, verify_pages=false))]
    fn new(py: Python<'_>, path: PathBuf, populate: bool, verify_pages: bool) -> PyResult<Self> {
        let opts = page_alloc::ReadOptions {
            populate,
            verify_pages,
        };
        let reader = py
            .detach(|| PageReader::open_with(&path, &opts))
            .map_err(error)?;
        let reader = Arc::new(reader);
        let keeper = Keeper::wrap(py, reader.clone())?.unbind();
        Ok(PyPageReader { reader, keeper })
    }

    /// The file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.reader.path().to_path_buf()
    }

    fn __len__(&self) -> usize {
        self.reader.len()
    }

    /// Field names and types: `{name: "int" | "float" | "bytes" | (dtype, shape)}`.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for f in self.reader.schema().fields() {
            match &f.ty {
                FieldType::Int => d.set_item(&f.name, "int")?,
                FieldType::Float => d.set_item(&f.name, "float")?,
                FieldType::Bytes => d.set_item(&f.name, "bytes")?,
                FieldType::Array { dtype, shape } => {
                    d.set_item(&f.name, (dtype.name(), PyTuple::new(py, shape.dims())?))?
                }
            }
        }
        Ok(d)
    }

    /// The largest value of each field, in bytes (what `fill_batch`
    /// buffers of bytes fields need per sample).
    #[getter]
    fn max_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (f, size) in self
            .reader
            .schema()
            .fields()
            .iter()
            .zip(self.reader.max_sizes())
        {
            d.set_item(&f.name, size)?;
        }
        Ok(d)
    }

    /// Sample `i`: ints and floats by value, bytes fields as read-only
    /// uint8 views and array fields as read-only views of the mapped file.
    fn sample<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let i = index_arg(self.reader.len(), i)?;
        let s = self.reader.sample(i).map_err(error)?;
        let owner = self.keeper.bind(py);
        let d = PyDict::new(py);
        for (k, f) in self.reader.schema().fields().iter().enumerate() {
            let v = match s.get(k).map_err(error)? {
                FieldValue::Int(x) => x.into_pyobject(py)?.into_any(),
                FieldValue::Float(x) => x.into_pyobject(py)?.into_any(),
                // SAFETY: the slices borrow the reader's mapping, which
                // `owner` (an `Arc<PageReader>`) keeps alive; the file is
                // never modified in place (writers rename new files over).
                FieldValue::Bytes(b) => unsafe { bytes_view(py, b, owner)? },
                // SAFETY: as above.
                FieldValue::Array(t) => unsafe { tensor_view(py, &t, owner)? },
            };
            d.set_item(&f.name, v)?;
        }
        Ok(d)
    }

    /// Copies samples `indices` into the caller's preallocated buffers,
    /// with the GIL released and no allocation: `out` maps field names to
    /// writable C-contiguous arrays with at least `len(indices)` rows —
    /// int64 for int fields, float64 for floats, the field's dtype and
    /// `(n, *shape)` for arrays, uint8 `(n, width)` for bytes (zero
    /// padded). Fields not in `out` are skipped. Returns the byte lengths
    /// of each bytes field's values (`{name: [len, ...]}`).
    fn fill_batch<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<usize>,
        out: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let n = indices.len();
        let schema = self.reader.schema();
        let mut arrays: Vec<Bound<'py, PyUntypedArray>> = Vec::new();
        let mut dests = Vec::new();
        for (name, buf) in out.iter() {
            let name: String = name.extract()?;
            let field = schema
                .index_of(&name)
                .ok_or_else(|| errors::invalid(format!("no field {name:?} in this file")))?;
            let a = buf
                .cast_into::<PyUntypedArray>()
                .map_err(|_| errors::invalid(format!("out[{name:?}] must be a numpy array")))?;
            let writable = a
                .getattr("flags")?
                .getattr("writeable")?
                .extract::<bool>()?;
            if !a.is_c_contiguous() || !writable {
                return Err(errors::invalid(format!(
                    "out[{name:?}] must be writable and C-contiguous"
                )));
            }
            let dtype = array::dtype_of(&a.dtype())?;
            let shape = a.shape().to_vec();
            let rows = shape.first().copied().unwrap_or(0);
            let per_row: usize = shape.iter().skip(1).product::<usize>() * dtype.size();
            let (kind, ok) = match &schema.fields()[field].ty {
                FieldType::Int => (DestKind::Int, dtype == DType::I64 && shape.len() == 1),
                FieldType::Float => (DestKind::Float, dtype == DType::F64 && shape.len() == 1),
                FieldType::Bytes => (DestKind::Bytes, dtype == DType::U8 && shape.len() == 2),
                FieldType::Array {
                    dtype: fd,
                    shape: fs,
                } => (
                    DestKind::Array,
                    dtype == *fd && shape.get(1..) == Some(fs.dims()),
                ),
            };
            if !ok || rows < n {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: {} {:?} does not fit {n} samples of this field",
                    dtype, shape
                )));
            }
            // SAFETY: reading the data pointer of a live array.
            let ptr = unsafe { (*a.as_array_ptr()).fields.data as *mut u8 };
            dests.push(Dest {
                field,
                kind,
                ptr,
                stride: per_row,
            });
            arrays.push(a);
        }
        let dests = Dests(dests);
        let reader = &self.reader;
        let lengths: Vec<Vec<usize>> = py
            .detach(move || -> page_alloc::Result<Vec<Vec<usize>>> {
                let dests = dests;
                let mut lengths = vec![Vec::new(); dests.0.len()];
                for (k, &i) in indices.iter().enumerate() {
                    let s = reader.sample(i)?;
                    for (d, lens) in dests.0.iter().zip(lengths.iter_mut()) {
                        let value = s.get(d.field)?;
                        let inline: [u8; 8];
                        let src: &[u8] = match (&d.kind, &value) {
                            (DestKind::Int, FieldValue::Int(x)) => {
                                inline = x.to_le_bytes();
                                &inline
                            }
                            (DestKind::Float, FieldValue::Float(x)) => {
                                inline = x.to_le_bytes();
                                &inline
                            }
                            (DestKind::Bytes, FieldValue::Bytes(b)) => b,
                            (DestKind::Array, FieldValue::Array(t)) => t.bytes(),
                            _ => &[],
                        };
                        if src.len() > d.stride {
                            return Err(page_alloc::Error::PoolTooSmall {
                                path: reader.path().to_path_buf(),
                                reason: format!(
                                    "sample {i}: field {} holds {} bytes, the buffer row {}",
                                    d.field,
                                    src.len(),
                                    d.stride
                                ),
                            });
                        }
                        lens.push(src.len());
                        // SAFETY: row k of a buffer with at least n rows of
                        // `stride` bytes (checked above); `src` fits it.
                        unsafe {
                            let row = d.ptr.add(k * d.stride);
                            std::ptr::copy_nonoverlapping(src.as_ptr(), row, src.len());
                            std::ptr::write_bytes(row.add(src.len()), 0, d.stride - src.len());
                        }
                    }
                }
                Ok(lengths)
            })
            .map_err(error)?;
        drop(arrays);
        let result = PyDict::new(py);
        for (name, lens) in out.keys().iter().zip(lengths) {
            let name: String = name.extract()?;
            if let Some(f) = schema.index_of(&name)
                && schema.fields()[f].ty == FieldType::Bytes
            {
                result.set_item(name, lens)?;
            }
        }
        Ok(result)
    }

    /// Asks the kernel to read ahead the pages of these samples.
    fn prefetch(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<()> {
        let reader = &self.reader;
        py.detach(|| reader.prefetch(&indices)).map_err(error)
    }

    /// FFCV's quasi-random epoch order: shuffled pages, samples shuffled
    /// within windows of `window_pages` pages.
    #[pyo3(signature = (seed, window_pages=8))]
    fn quasi_random_order(&self, seed: u64, window_pages: usize) -> Vec<usize> {
        self.reader.quasi_random_order(seed, window_pages)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let args = (slf.get().reader.path().to_path_buf(),).into_pyobject(py)?;
        Ok((slf.get_type().into_any(), args))
    }
}

/// A validated FFCV `.beton` file, memory-mapped.
#[pyclass(module = "cachex._cachex", name = "BetonReader", frozen)]
pub struct PyBetonReader {
    file: Arc<BetonFile>,
    keeper: Py<PyAny>,
}

#[pymethods]
impl PyBetonReader {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let file = Arc::new(py.detach(|| beton::read(&path)).map_err(error)?);
        let keeper = Keeper::wrap(py, file.clone())?.unbind();
        Ok(PyBetonReader { file, keeper })
    }

    /// The file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }

    fn __len__(&self) -> usize {
        self.file.len()
    }

    /// Field names and FFCV types: `{name: "float" | "int" | "rgb_image" |
    /// "bytes" | "json" | (dtype, shape)}`.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for f in self.file.fields() {
            match &f.ty {
                BetonType::Float => d.set_item(&f.name, "float")?,
                BetonType::Int => d.set_item(&f.name, "int")?,
                BetonType::RgbImage => d.set_item(&f.name, "rgb_image")?,
                BetonType::Bytes => d.set_item(&f.name, "bytes")?,
                BetonType::Json => d.set_item(&f.name, "json")?,
                BetonType::NDArray { dtype, shape } => {
                    d.set_item(&f.name, (dtype.name(), PyTuple::new(py, shape.dims())?))?
                }
            }
        }
        Ok(d)
    }

    /// Sample `i`: ints, floats and JSON text by value; bytes as read-only
    /// uint8 views; NDArrays as read-only views; RGB images as
    /// `{"mode", "width", "height", "data"}` (never decoded).
    fn sample<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let i = index_arg(self.file.len(), i)?;
        let values = self.file.sample(i).map_err(error)?;
        let owner = self.keeper.bind(py);
        let d = PyDict::new(py);
        for (f, v) in self.file.fields().iter().zip(values) {
            let v = match v {
                BetonValue::Float(x) => x.into_pyobject(py)?.into_any(),
                BetonValue::Int(x) => x.into_pyobject(py)?.into_any(),
                BetonValue::Json(s) => s.into_pyobject(py)?.into_any(),
                // SAFETY: the slices borrow the file's mapping, kept alive
                // by `owner` (an `Arc<BetonFile>`).
                BetonValue::Bytes(b) => unsafe { bytes_view(py, b, owner)? },
                // SAFETY: as above.
                BetonValue::NDArray(t) => unsafe { tensor_view(py, &t, owner)? },
                BetonValue::RgbImage {
                    mode,
                    width,
                    height,
                    data,
                } => {
                    let img = PyDict::new(py);
                    img.set_item("mode", mode)?;
                    img.set_item("width", width)?;
                    img.set_item("height", height)?;
                    // SAFETY: as above.
                    img.set_item("data", unsafe { bytes_view(py, data, owner)? })?;
                    img.into_any()
                }
            };
            d.set_item(&f.name, v)?;
        }
        Ok(d)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let args = (slf.get().file.path().to_path_buf(),).into_pyobject(py)?;
        Ok((slf.get_type().into_any(), args))
    }
}

/// Writes `samples` as an FFCV `.beton` at `path` (byte-identical to
/// FFCV's one-worker writer for the same values). `fields` maps names to
/// `"int"`, `"float"`, `"bytes"`, `"json"` or `(dtype, shape)`.
#[pyfunction]
#[pyo3(signature = (path, fields, samples, *, page_size=beton::DEFAULT_PAGE_SIZE))]
pub fn write_beton(
    py: Python<'_>,
    path: PathBuf,
    fields: &Bound<'_, PyDict>,
    samples: &Bound<'_, PyAny>,
    page_size: u64,
) -> PyResult<()> {
    let mut specs = Vec::with_capacity(fields.len());
    let mut beton_fields = Vec::with_capacity(fields.len());
    for (name, spec) in fields.iter() {
        let name: String = name.extract()?;
        let spec = spec_arg(&name, &spec)?;
        let ty = match &spec {
            Spec::Int => BetonType::Int,
            Spec::Float => BetonType::Float,
            Spec::Bytes => BetonType::Bytes,
            Spec::Json => BetonType::Json,
            Spec::Array(d, s) => BetonType::NDArray {
                dtype: *d,
                shape: s.clone(),
            },
        };
        beton_fields.push(BetonField::new(name.clone(), ty));
        specs.push((name, spec));
    }
    let owned: Vec<Vec<Owned>> = samples
        .try_iter()?
        .enumerate()
        .map(|(k, s)| {
            sample_arg(&specs, &s?)
                .map_err(|e| errors::invalid(format!("sample {k}: {}", e.value(py))))
        })
        .collect::<PyResult<_>>()?;
    py.detach(|| {
        let rows: Vec<Vec<BetonValue<'_>>> = owned
            .iter()
            .map(|s| {
                s.iter()
                    .map(|v| match v {
                        Owned::Int(i) => BetonValue::Int(*i),
                        Owned::Float(f) => BetonValue::Float(*f),
                        Owned::Bytes(b) => BetonValue::Bytes(b),
                        Owned::Json(s) => BetonValue::Json(s),
                        Owned::Tensor(t) => BetonValue::NDArray(t.view()),
                    })
                    .collect()
            })
            .collect();
        beton::write_with_page_size(&path, &beton_fields, &rows, page_size)
    })
    .map_err(error)
}

/// Every problem found in the page file at `path` (`[]` when sound).
#[pyfunction]
pub fn page_verify(py: Python<'_>, path: PathBuf) -> Vec<String> {
    py.detach(|| page_alloc::verify(&path))
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Every problem found in the `.beton` at `path` (`[]` when sound).
#[pyfunction]
pub fn beton_verify(py: Python<'_>, path: PathBuf) -> Vec<String> {
    py.detach(|| beton::verify(&path))
        .iter()
        .map(ToString::to_string)
        .collect()
}
