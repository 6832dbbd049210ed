//! FFCV `.beton` files: `cachex.BetonReader` and `cachex.write_beton`.

use std::path::PathBuf;
use std::sync::Arc;

use cache_facade::{Detected, PeerFormat};
use numpy::{IntoPyArray, PyArray1};
use page_alloc::beton::{self, BetonField, BetonFile, BetonType, BetonValue};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use remote_cache::CacheDir;

use crate::array::Keeper;
use crate::fill::{Cell, Column, Filled, Sink, batch_buffers, fill_rows, report};
use crate::handle::Handle;
use crate::page_fields::{Owned, Spec, bytes_view, index_arg, sample_arg, spec_arg, tensor_view};
use crate::root::{Root, TierArgs};
use crate::{check, errors};

/// A validated FFCV `.beton` file, memory-mapped.
///
/// A URL naming the file under a prefix (`s3://bucket/prefix/data.beton`)
/// is copied whole into a working directory over the local tier first.
#[pyclass(module = "cachex._cachex", name = "BetonReader", frozen)]
pub struct PyBetonReader {
    root: Root,
    /// Swapped by the reopen in a forked child (as `PageReader`'s).
    handle: Handle<OpenedBeton>,
}

/// One opening of a `.beton` file.
struct OpenedBeton {
    file: Arc<BetonFile>,
    /// The `.base` of every array returned from this opening.
    keeper: Py<PyAny>,
    /// The file read.
    path: PathBuf,
    /// For a URL, the working directory the file was copied into, held
    /// while the file is mapped.
    _remote: Option<CacheDir>,
}

impl OpenedBeton {
    fn open(py: Python<'_>, root: &Root) -> PyResult<Arc<Self>> {
        let (path, remote) = errors::enter(py, || root.open_file(None))?;
        let file = Arc::new(errors::enter(py, || beton::read(&path))?);
        let keeper = Keeper::wrap(py, file.clone())?.unbind();
        Ok(Arc::new(OpenedBeton {
            file,
            keeper,
            path,
            _remote: remote,
        }))
    }
}

impl PyBetonReader {
    /// The current opening; in a forked child, first a fresh one (for a
    /// URL, in a working directory of the child's own).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<OpenedBeton>> {
        self.handle
            .get(py, |py, _inherited| OpenedBeton::open(py, &self.root))
    }
}

#[pymethods]
impl PyBetonReader {
    /// Opens and validates the `.beton` file at `path` (mapped, not read).
    ///
    /// `path` may be a URL naming the file under a prefix, with the tier
    /// keywords of `PageReader`.
    #[new]
    #[pyo3(signature = (path, *, tier_dir=None, tier_budget=None, storage_options=None))]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
        let opened = OpenedBeton::open(py, &root)?;
        let file = opened.path.clone();
        Ok(PyBetonReader {
            root,
            handle: Handle::new(py, file, opened),
        })
    }

    /// The file read (for a URL, its copy in the working directory).
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL the file was opened on, without credentials (`None` for a
    /// local file).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
    }

    /// The number of samples.
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
        let values = o.file.sample(i).map_err(errors::to_py)?;
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

    /// The largest value of each bytes and array field, in bytes (what
    /// `fill_batch` buffers of bytes fields need per sample); read from
    /// every sample's allocation, with the GIL released.
    #[getter]
    fn max_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let file = &o.file;
        let sizes: Vec<(String, usize)> = errors::enter(py, || -> page_alloc::Result<_> {
            let mut sizes = Vec::new();
            for (f, field) in file.fields().iter().enumerate() {
                let mut largest = 0;
                match &field.ty {
                    BetonType::Bytes => {
                        for i in 0..file.len() {
                            if let BetonValue::Bytes(b) = file.get(i, f)? {
                                largest = largest.max(b.len());
                            }
                        }
                    }
                    BetonType::NDArray { dtype, shape } => {
                        largest = dtype.size() * shape.dims().iter().product::<usize>();
                    }
                    _ => continue,
                }
                sizes.push((field.name.clone(), largest));
            }
            Ok(sizes)
        })?;
        let d = PyDict::new(py);
        for (name, size) in sizes {
            d.set_item(name, size)?;
        }
        Ok(d)
    }

    /// Copies samples `indices` into the caller's preallocated buffers,
    /// with the GIL released, as `PageReader.fill_batch` (padded rows or
    /// ragged `(values, offsets)` pairs for bytes fields). JSON and image
    /// fields are read with `sample`.
    fn fill_batch<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<usize>,
        out: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let file = &o.file;
        let n = indices.len();
        if let Some(&i) = indices.iter().find(|&&i| i >= file.len()) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "sample {i} out of range: the file has {} samples",
                file.len()
            )));
        }
        let (names, targets) = batch_buffers(out, n, |name| {
            let field = file
                .fields()
                .iter()
                .position(|f| f.name == name)
                .ok_or_else(|| errors::invalid(format!("no field {name:?} in this file")))?;
            let kind = match &file.fields()[field].ty {
                BetonType::Int => Column::Int,
                BetonType::Float => Column::Float,
                BetonType::Bytes => Column::Bytes,
                BetonType::NDArray { dtype, shape } => Column::Array(*dtype, shape.dims()),
                BetonType::Json | BetonType::RgbImage => {
                    return Err(errors::invalid(format!(
                        "out[{name:?}]: a JSON or image field is read with sample()"
                    )));
                }
            };
            Ok((field, kind))
        })?;
        let sinks = targets
            .iter()
            .zip(&names)
            .map(|(t, (name, _))| Sink::new(name, t))
            .collect::<PyResult<Vec<_>>>()?;
        let (names_ref, indices) = (&names, &indices);
        let filled = errors::enter(py, move || -> page_alloc::Result<Vec<Filled>> {
            fill_rows(
                indices,
                &sinks,
                |i, row: &mut Vec<Cell<'_>>| {
                    for (_, field) in names_ref {
                        row.push(match file.get(i, *field)? {
                            BetonValue::Int(x) => Cell::Int(x),
                            BetonValue::Float(x) => Cell::Float(x),
                            BetonValue::Bytes(b) => Cell::Bytes(b),
                            BetonValue::NDArray(t) => Cell::Bytes(t.bytes()),
                            // Refused above.
                            BetonValue::Json(_) | BetonValue::RgbImage { .. } => Cell::Bytes(&[]),
                        });
                    }
                    Ok(())
                },
                |e| page_alloc::Error::PoolTooSmall {
                    path: file.path().to_path_buf(),
                    reason: format!(
                        "sample {}: field {} holds {} bytes, the buffer row {}",
                        e.sample, names_ref[e.position].0, e.len, e.room
                    ),
                },
            )
        })?;
        report(py, names, filled, |f| {
            file.fields()[f].ty == BetonType::Bytes
        })
    }

    /// The page each sample's stored values lie in (int64, counted from
    /// the file's first data page; -1 for a sample whose fields are all
    /// ints and floats, kept in its metadata row): what FFCV's
    /// quasi-random order shuffles by.
    fn sample_pages<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let o = self.current(py)?;
        let file = &o.file;
        let pages: Vec<i64> = py.detach(|| {
            file.sample_pages()
                .into_iter()
                .map(|p| p.map_or(-1, |p| p as i64))
                .collect()
        });
        Ok(pages.into_pyarray(py))
    }

    /// The sampling plan's blocks (`cachex.sampling.SamplingPlan`): the
    /// lengths of the runs of consecutive samples that lie in one page, in
    /// index order (int64, summing to `len(self)`). A file written by one
    /// worker has one run per page; samples with nothing in a page form
    /// runs of their own.
    fn page_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let o = self.current(py)?;
        let file = &o.file;
        let runs: Vec<i64> = py.detach(|| {
            let mut runs: Vec<i64> = Vec::new();
            let mut last = None;
            for (i, p) in file.sample_pages().into_iter().enumerate() {
                match runs.last_mut() {
                    Some(n) if i > 0 && last == Some(p) => *n += 1,
                    _ => runs.push(1),
                }
                last = Some(p);
            }
            runs
        });
        Ok(runs.into_pyarray(py))
    }

    /// Everything wrong with the file, as `cachex verify --json` prints
    /// it: `{"kind": "beton", "path", "problems": [{"path", "kind",
    /// "detail"}, ...]}`, `problems` empty when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let path = &o.path;
        let problems = py.detach(|| beton::verify(path));
        check::verify_to_py(py, Detected::peer(PeerFormat::Beton), path, &problems)
    }

    /// What the file holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, counts and sizes, and a table of fields.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let summary = self.current(py)?.file.summary();
        check::summary_to_py(py, &summary)
    }

    /// Pickles as the path (or URL) and tier keywords; the copy reopens
    /// the file.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let kwargs = PyDict::new(py);
        this.root.tier().to_kwargs(&kwargs)?;
        let args = (this.root.to_py(py)?, kwargs).into_pyobject(py)?;
        Ok((
            py.import("cachex._cachex")?
                .getattr("_reopen_beton_reader")?,
            args,
        ))
    }
}

/// Unpickles a `BetonReader` (see `BetonReader.__reduce__`).
#[pyfunction]
pub fn _reopen_beton_reader<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PyBetonReader>().call((path,), Some(kwargs))
}

/// Writes `samples` as an FFCV `.beton` at `path` (byte-identical to
/// FFCV's one-worker writer for the same values). `fields` maps names to
/// `"int"`, `"float"`, `"bytes"`, `"json"` or `(dtype, shape)`. `path`
/// may be a URL naming the file under a prefix (with the tier keywords of
/// `PageReader`): the file is written in a working directory over the
/// local tier, then published.
#[pyfunction]
#[pyo3(signature = (path, fields, samples, *, page_size=beton::DEFAULT_PAGE_SIZE, tier_dir=None, tier_budget=None, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub fn write_beton(
    py: Python<'_>,
    path: &Bound<'_, PyAny>,
    fields: &Bound<'_, PyDict>,
    samples: &Bound<'_, PyAny>,
    page_size: u64,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<()> {
    let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
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
    errors::enter(py, || -> remote_cache::Result<()> {
        let (path, remote) = root.open_file(None)?;
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
        beton::write_with_page_size(&path, &beton_fields, &rows, page_size)?;
        if let Some(dir) = remote {
            dir.publish()?;
        }
        Ok(())
    })
}
