//! `cachex.PageReader`: a validated, memory-mapped page-alloc file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_facade::CacheKind;
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use page_alloc::{FieldType, FieldValue, PageReader};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use tensor_core::DType;

use crate::array::{self, Keeper, RowSink};
use crate::handle::Handle;
use crate::page_fields::{bytes_view, index_arg, tensor_view};
use crate::{check, errors};

/// One opening of a page file.
struct Opening {
    reader: Arc<PageReader>,
    /// The `.base` of every array returned from this opening.
    keeper: Py<PyAny>,
    options: page_alloc::ReadOptions,
}

impl Opening {
    fn open(py: Python<'_>, path: &Path, options: page_alloc::ReadOptions) -> PyResult<Arc<Self>> {
        let reader = errors::enter(py, || PageReader::open_with(path, &options))?;
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
    /// Swapped by the reopen in a forked child; arrays returned earlier
    /// keep their own opening alive.
    handle: Handle<Opening>,
}

impl PyPageReader {
    /// The current opening; in a forked child, first a fresh one from the
    /// path and options (nothing of the parent's is used).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<Opening>> {
        self.handle.get(py, |py, inherited| {
            Opening::open(py, self.handle.path(), inherited.options.clone())
        })
    }
}

#[pymethods]
impl PyPageReader {
    /// Opens and validates the page file at `path` (`populate` reads it
    /// into the page cache, `verify_pages` checks every page checksum).
    #[new]
    #[pyo3(signature = (path, *, populate=false, verify_pages=false))]
    fn new(py: Python<'_>, path: PathBuf, populate: bool, verify_pages: bool) -> PyResult<Self> {
        let options = page_alloc::ReadOptions {
            populate,
            verify_pages,
        };
        let opened = Opening::open(py, &path, options)?;
        Ok(PyPageReader {
            handle: Handle::new(py, path, opened),
        })
    }

    /// The file.
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The number of samples.
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
        let s = o.reader.sample(i).map_err(errors::to_py)?;
        let owner = o.keeper.bind(py);
        let d = PyDict::new(py);
        for (k, f) in o.reader.schema().fields().iter().enumerate() {
            let v = match s.get(k).map_err(errors::to_py)? {
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
        let lengths: Vec<Vec<usize>> =
            errors::enter(py, move || -> page_alloc::Result<Vec<Vec<usize>>> {
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
            })?;
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
        errors::enter(py, || reader.prefetch(&indices))
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
        errors::enter(py, || {
            reader.quasi_random_share(seed, window_pages, share, shares)
        })
    }

    /// Everything wrong with the file (every page checksum), as `cachex
    /// verify --json` prints it: `{"kind": "page-alloc", "path",
    /// "problems": [{"path", "kind", "detail"}, ...]}`, `problems` empty
    /// when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let path = self.handle.path();
        let problems = py.detach(|| page_alloc::verify(path));
        check::verify_to_py(py, CacheKind::PageAlloc, path, &problems)
    }

    /// What the file holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, sample, run and page counts, sizes, and a table of fields.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let path = self.handle.path();
        let summary = errors::enter(py, || page_alloc::inspect(path))?;
        check::summary_to_py(py, &summary.summary())
    }

    /// Pickles as the path and read options; the copy reopens the file.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let (populate, verify_pages) = this.handle.peek().map_or((false, false), |o| {
            (o.options.populate, o.options.verify_pages)
        });
        let args = (this.handle.path().to_path_buf(), populate, verify_pages).into_pyobject(py)?;
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
