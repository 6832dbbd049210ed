//! `cachex.PageWriter`, `cachex.PageReader` and FFCV `.beton` files
//! (`BetonReader`, `write_beton`) of `page-alloc`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use page_alloc::beton::{self, BetonField, BetonFile, BetonType, BetonValue};
use page_alloc::{FieldType, FieldValue, PageReader, PageWriter, Schema, Value, WriterOptions};
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};
use tensor_core::{DType, Shape, TensorView};

use crate::array::{self, Keeper, RowSink};
use crate::errors::{self, Kind};
use crate::fork::ForkMark;

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
    fork: ForkMark,
}

impl PyPageWriter {
    fn with<R>(&self, f: impl FnOnce(&mut PageWriter) -> PyResult<R>) -> PyResult<R> {
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.path));
        }
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
            fork: ForkMark::new(py),
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
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.path));
        }
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

impl Drop for PyPageWriter {
    fn drop(&mut self) {
        if self.fork.forked() {
            // The parent's writer: dropping it here would delete the
            // parent's temporary file and release its lock.
            std::mem::forget(self.writer.get_mut().take());
        }
    }
}

/// One opening of a page file.
struct Opening {
    reader: Arc<PageReader>,
    /// The `.base` of every array returned from this opening.
    keeper: Py<PyAny>,
    options: page_alloc::ReadOptions,
}

impl Opening {
    fn open(py: Python<'_>, path: &Path, options: page_alloc::ReadOptions) -> PyResult<Arc<Self>> {
        let reader = py
            .detach(|| PageReader::open_with(path, &options))
            .map_err(error)?;
        let reader = Arc::new(reader);
        let keeper = Keeper::wrap(py, reader.clone())?.unbind();
        Ok(Arc::new(Opening {
            reader,
            keeper,
            options,
        }))
    }
}

/// A validated, memory-mapped page file.
#[pyclass(module = "cachex._cachex", name = "PageReader", frozen)]
pub struct PyPageReader {
    path: PathBuf,
    /// Swapped by the reopen in a forked child; arrays returned earlier
    /// keep their own opening alive. Locked only with the GIL held and only
    /// to clone or swap the `Arc`.
    opened: RwLock<Arc<Opening>>,
    fork: ForkMark,
}

impl PyPageReader {
    /// The current opening; in a forked child, first a fresh one from the
    /// path and options (nothing of the parent's is used).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<Opening>> {
        if self.fork.forked() {
            let options = self.opened.read().options.clone();
            *self.opened.write() = Opening::open(py, &self.path, options)?;
            self.fork.reopened();
        }
        Ok(self.opened.read().clone())
    }
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

#[pymethods]
impl PyPageReader {
    #[new]
    #[pyo3(signature = (path, *, populate=false, verify_pages=false))]
    fn new(py: Python<'_>, path: PathBuf, populate: bool, verify_pages: bool) -> PyResult<Self> {
        let options = page_alloc::ReadOptions {
            populate,
            verify_pages,
        };
        let opened = Opening::open(py, &path, options)?;
        Ok(PyPageReader {
            path,
            opened: RwLock::new(opened),
            fork: ForkMark::new(py),
        })
    }

    /// The file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.current(py)?.reader.len())
    }

    /// Field names and types: `{name: "int" | "float" | "bytes" | (dtype, shape)}`.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let d = PyDict::new(py);
        for f in o.reader.schema().fields() {
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
        let o = self.current(py)?;
        let d = PyDict::new(py);
        for (f, size) in o.reader.schema().fields().iter().zip(o.reader.max_sizes()) {
            d.set_item(&f.name, size)?;
        }
        Ok(d)
    }

    /// Sample `i`: ints and floats by value, bytes fields as read-only
    /// uint8 views and array fields as read-only views of the mapped file.
    fn sample<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let i = index_arg(o.reader.len(), i)?;
        let s = o.reader.sample(i).map_err(error)?;
        let owner = o.keeper.bind(py);
        let d = PyDict::new(py);
        for (k, f) in o.reader.schema().fields().iter().enumerate() {
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
        let o = self.current(py)?;
        let reader = &o.reader;
        let n = indices.len();
        let schema = reader.schema();
        let mut names = Vec::with_capacity(out.len());
        let mut buffers = Vec::with_capacity(out.len());
        for (name, buf) in out.iter() {
            let name: String = name.extract()?;
            let field = schema
                .index_of(&name)
                .ok_or_else(|| errors::invalid(format!("no field {name:?} in this file")))?;
            let a = buf
                .cast_into::<PyUntypedArray>()
                .map_err(|_| errors::invalid(format!("out[{name:?}] must be a numpy array")))?;
            let dtype = array::dtype_of(&a.dtype())?;
            let shape = a.shape().to_vec();
            let ok = match &schema.fields()[field].ty {
                FieldType::Int => dtype == DType::I64 && shape.len() == 1,
                FieldType::Float => dtype == DType::F64 && shape.len() == 1,
                FieldType::Bytes => dtype == DType::U8 && shape.len() == 2,
                FieldType::Array {
                    dtype: fd,
                    shape: fs,
                } => dtype == *fd && shape.get(1..) == Some(fs.dims()),
            };
            if !ok || shape.first().copied().unwrap_or(0) < n {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: {dtype} {shape:?} does not fit {n} samples of this field"
                )));
            }
            names.push((name, field));
            buffers.push(a);
        }
        let sinks = buffers
            .iter()
            .zip(&names)
            .map(|(a, (name, _))| RowSink::new(&format!("out[{name:?}]"), a))
            .collect::<PyResult<Vec<_>>>()?;
        let fields: Vec<usize> = names.iter().map(|(_, f)| *f).collect();
        let (fields, indices) = (&fields, &indices);
        let lengths: Vec<Vec<usize>> = py
            .detach(move || -> page_alloc::Result<Vec<Vec<usize>>> {
                let mut lengths = vec![Vec::with_capacity(n); sinks.len()];
                for (k, &i) in indices.iter().enumerate() {
                    let s = reader.sample(i)?;
                    for ((sink, &field), lens) in sinks.iter().zip(fields).zip(&mut lengths) {
                        let value = s.get(field)?;
                        let inline: [u8; 8];
                        let src: &[u8] = match &value {
                            FieldValue::Int(x) => {
                                inline = x.to_le_bytes();
                                &inline
                            }
                            FieldValue::Float(x) => {
                                inline = x.to_le_bytes();
                                &inline
                            }
                            FieldValue::Bytes(b) => b,
                            FieldValue::Array(t) => t.bytes(),
                        };
                        if !sink.write(k, src) {
                            return Err(page_alloc::Error::PoolTooSmall {
                                path: reader.path().to_path_buf(),
                                reason: format!(
                                    "sample {i}: field {} holds {} bytes, the buffer row {}",
                                    schema.fields()[field].name,
                                    src.len(),
                                    sink.stride()
                                ),
                            });
                        }
                        lens.push(src.len());
                    }
                }
                Ok(lengths)
            })
            .map_err(error)?;
        let result = PyDict::new(py);
        for ((name, field), lens) in names.into_iter().zip(lengths) {
            if schema.fields()[field].ty == FieldType::Bytes {
                result.set_item(name, lens)?;
            }
        }
        Ok(result)
    }

    /// Asks the kernel to read ahead the pages of these samples.
    fn prefetch(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<()> {
        let o = self.current(py)?;
        let reader = &o.reader;
        py.detach(|| reader.prefetch(&indices)).map_err(error)
    }

    /// FFCV's quasi-random epoch order: shuffled pages, samples shuffled
    /// within windows of `window_pages` pages. With `shares > 1`, only
    /// share `share` of it: whole pages dealt out so that the shares of
    /// one seed are disjoint and together hold every sample once (one per
    /// DataLoader worker, each computing its own).
    #[pyo3(signature = (seed, window_pages=8, *, share=0, shares=1))]
    fn quasi_random_order(
        &self,
        py: Python<'_>,
        seed: u64,
        window_pages: usize,
        share: usize,
        shares: usize,
    ) -> PyResult<Vec<usize>> {
        let o = self.current(py)?;
        let reader = &o.reader;
        py.detach(|| reader.quasi_random_share(seed, window_pages, share, shares))
            .map_err(error)
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let options = this.opened.read().options.clone();
        let args = (this.path.clone(), options.populate, options.verify_pages).into_pyobject(py)?;
        Ok((
            py.import("cachex._cachex")?
                .getattr("_reopen_page_reader")?,
            args,
        ))
    }
}

/// Unpickles a `PageReader` (see `PageReader.__reduce__`).
#[pyfunction]
pub fn _reopen_page_reader(
    py: Python<'_>,
    path: PathBuf,
    populate: bool,
    verify_pages: bool,
) -> PyResult<PyPageReader> {
    PyPageReader::new(py, path, populate, verify_pages)
}

/// A validated FFCV `.beton` file, memory-mapped.
#[pyclass(module = "cachex._cachex", name = "BetonReader", frozen)]
pub struct PyBetonReader {
    path: PathBuf,
    /// Swapped by the reopen in a forked child (as `PageReader`'s).
    opened: RwLock<Arc<OpenedBeton>>,
    fork: ForkMark,
}

/// One opening of a `.beton` file.
struct OpenedBeton {
    file: Arc<BetonFile>,
    /// The `.base` of every array returned from this opening.
    keeper: Py<PyAny>,
}

impl OpenedBeton {
    fn open(py: Python<'_>, path: &Path) -> PyResult<Arc<Self>> {
        let file = Arc::new(py.detach(|| beton::read(path)).map_err(error)?);
        let keeper = Keeper::wrap(py, file.clone())?.unbind();
        Ok(Arc::new(OpenedBeton { file, keeper }))
    }
}

impl PyBetonReader {
    /// The current opening; in a forked child, first a fresh one.
    fn current(&self, py: Python<'_>) -> PyResult<Arc<OpenedBeton>> {
        if self.fork.forked() {
            *self.opened.write() = OpenedBeton::open(py, &self.path)?;
            self.fork.reopened();
        }
        Ok(self.opened.read().clone())
    }
}

#[pymethods]
impl PyBetonReader {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let opened = OpenedBeton::open(py, &path)?;
        Ok(PyBetonReader {
            path,
            opened: RwLock::new(opened),
            fork: ForkMark::new(py),
        })
    }

    /// The file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.current(py)?.file.len())
    }

    /// Field names and FFCV types: `{name: "float" | "int" | "rgb_image" |
    /// "bytes" | "json" | (dtype, shape)}`.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let d = PyDict::new(py);
        for f in o.file.fields() {
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
        let o = self.current(py)?;
        let i = index_arg(o.file.len(), i)?;
        let values = o.file.sample(i).map_err(error)?;
        let owner = o.keeper.bind(py);
        let d = PyDict::new(py);
        for (f, v) in o.file.fields().iter().zip(values) {
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
        let args = (slf.get().path.clone(),).into_pyobject(py)?;
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
