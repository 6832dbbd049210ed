//! `cachex.MemmapWriter`, `cachex.MemmapArray`, `cachex.memmap_open_or_build`
//! and the inspect/verify functions of `memmap-array`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fingerprint::SourceStamp;
use memmap_array::{ArrayCache, NewRow, RowWriter, Schema, WriterOptions};
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use parking_lot::{Mutex, RwLock};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tensor_core::{DType, Tensor, TensorView};

use crate::array::{self, Keeper, RowSink};
use crate::errors::{self, Kind};
use crate::fork::ForkMark;
use crate::json;

/// A memmap-array error as its `cachex.errors` exception.
pub fn error(e: memmap_array::Error) -> PyErr {
    use memmap_array::Error as E;
    let kind = match &e {
        E::Io { .. } => Kind::Io,
        E::Locked { .. } => Kind::Locked,
        E::Corrupt { .. }
        | E::Json { .. }
        | E::Parquet { .. }
        | E::Arrow { .. }
        | E::BinSize { .. }
        | E::UnsupportedVersion { .. } => Kind::Corrupt,
        E::SchemaMismatch { .. } => Kind::SchemaMismatch,
        E::FingerprintMismatch { .. } => Kind::Stale,
        E::InvalidSchema { .. }
        | E::InvalidRow { .. }
        | E::RowOutOfRange { .. }
        | E::UnknownName { .. }
        | E::TooLargeForRam { .. } => Kind::InvalidInput,
        _ => Kind::Other,
    };
    errors::raise(kind, e.to_string())
}

/// Parses a numpy dtype spec (`"float32"`, `np.int16`, a dtype object).
fn dtype_arg(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let descr = numpy::PyArrayDescr::new(obj.py(), obj)?;
    array::dtype_of(&descr)
}

/// Builds a schema from `{name: (dtype, shape)}`, the nullable names and
/// the sidecar names.
fn schema_arg(
    arrays: &Bound<'_, PyDict>,
    nullable: &[String],
    sidecars: &[String],
) -> PyResult<Schema> {
    let mut b = Schema::builder();
    for (name, spec) in arrays.iter() {
        let name: String = name.extract()?;
        let (dtype, shape): (Bound<'_, PyAny>, Vec<usize>) = spec.extract().map_err(|_| {
            errors::invalid(format!(
                "array {name:?}: give (dtype, shape), e.g. (\"float32\", (3, 4))"
            ))
        })?;
        let dtype = dtype_arg(&dtype)?;
        b = if nullable.contains(&name) {
            b.nullable_array(&name, dtype, shape)
        } else {
            b.array(&name, dtype, shape)
        };
    }
    for s in sidecars {
        b = b.sidecar(s);
    }
    b.build().map_err(error)
}

fn schema_to_py<'py>(py: Python<'py>, schema: &Schema) -> PyResult<Bound<'py, PyDict>> {
    let arrays = PyDict::new(py);
    for a in schema.arrays() {
        let d = PyDict::new(py);
        d.set_item("dtype", a.dtype().name())?;
        d.set_item("shape", PyTuple::new(py, a.shape().dims())?)?;
        d.set_item("nullable", a.nullable())?;
        arrays.set_item(a.name(), d)?;
    }
    let out = PyDict::new(py);
    out.set_item("arrays", arrays)?;
    out.set_item("sidecars", schema.sidecars().to_vec())?;
    Ok(out)
}

/// Where a writer lives: owned by the Python object, or lent to it by
/// `open_or_build` for the duration of the build callback.
enum WriterSlot {
    Owned(Box<RowWriter>),
    Lent(LentWriter),
    Closed,
}

/// A `RowWriter` that `memmap_open_or_build` lends to its callback.
struct LentWriter(*mut RowWriter);

// SAFETY: the pointer is only dereferenced under the slot's mutex while
// the `open_or_build` call that lent it is blocked in the callback (it
// takes the slot back to `Closed` before returning), and `RowWriter` is
// `Send`.
unsafe impl Send for LentWriter {}

/// The streaming, resumable writer of a memmap-array cache.
#[pyclass(module = "cachex._cachex", name = "MemmapWriter", frozen)]
pub struct PyMemmapWriter {
    dir: PathBuf,
    slot: Mutex<WriterSlot>,
    fork: ForkMark,
}

impl PyMemmapWriter {
    fn with<R>(&self, f: impl FnOnce(&mut RowWriter) -> PyResult<R>) -> PyResult<R> {
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.dir));
        }
        let mut slot = self.slot.lock();
        match &mut *slot {
            WriterSlot::Owned(w) => f(w),
            // SAFETY: see `LentWriter`: the lender is blocked in the
            // callback while the slot is `Lent`, and we hold the mutex.
            WriterSlot::Lent(p) => f(unsafe { &mut *p.0 }),
            WriterSlot::Closed => Err(errors::raise(
                Kind::Other,
                format!("{}: writer is finalized or closed", self.dir.display()),
            )),
        }
    }
}

#[pymethods]
impl PyMemmapWriter {
    #[new]
    #[pyo3(signature = (path, arrays, *, nullable=Vec::new(), sidecars=Vec::new(), fingerprint=None, sync_every=WriterOptions::DEFAULT_SYNC_EVERY))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        arrays: &Bound<'_, PyDict>,
        nullable: Vec<String>,
        sidecars: Vec<String>,
        fingerprint: Option<&Bound<'_, PyAny>>,
        sync_every: usize,
    ) -> PyResult<Self> {
        let schema = schema_arg(arrays, &nullable, &sidecars)?;
        let fp = match fingerprint {
            Some(f) => json::from_py(f)?,
            None => serde_json::Value::Null,
        };
        let opts = WriterOptions { sync_every };
        let w = py
            .detach(|| RowWriter::create_or_resume_with(&path, &schema, &fp, opts))
            .map_err(error)?;
        Ok(PyMemmapWriter {
            dir: path,
            slot: Mutex::new(WriterSlot::Owned(Box::new(w))),
            fork: ForkMark::new(py),
        })
    }

    /// The cache directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    /// Sources already committed by an earlier writer (skip them on resume).
    #[getter]
    fn resume_keys(&self) -> PyResult<Vec<String>> {
        self.with(|w| Ok(w.resume_keys().to_vec()))
    }

    /// Rows written so far (committed or not).
    #[getter]
    fn rows(&self) -> PyResult<u64> {
        self.with(|w| Ok(w.rows()))
    }

    /// Rows durably committed.
    #[getter]
    fn committed_rows(&self) -> PyResult<u64> {
        self.with(|w| Ok(w.committed_rows()))
    }

    /// The schema: `{"arrays": {name: {dtype, shape, nullable}}, "sidecars": [...]}`.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let schema = self.with(|w| Ok(w.schema().clone()))?;
        schema_to_py(py, &schema)
    }

    #[pyo3(signature = (source, arrays, sidecars=None, meta=None))]
    fn write(
        &self,
        py: Python<'_>,
        source: String,
        arrays: &Bound<'_, PyDict>,
        sidecars: Option<&Bound<'_, PyDict>>,
        meta: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mut tensors: Vec<(String, Option<Tensor>)> = Vec::with_capacity(arrays.len());
        for (name, value) in arrays.iter() {
            let name: String = name.extract()?;
            let t = if value.is_none() {
                None
            } else {
                Some(array::tensor_from_py(&value).map_err(|e| {
                    errors::invalid(format!("row {source:?}: array {name:?}: {}", e.value(py)))
                })?)
            };
            tensors.push((name, t));
        }
        let mut side: Vec<(String, String)> = Vec::new();
        if let Some(s) = sidecars {
            for (k, v) in s.iter() {
                side.push((k.extract()?, v.extract()?));
            }
        }
        let meta = match meta {
            None => None,
            Some(m) => Some(match m.extract::<String>() {
                Ok(s) => s,
                Err(_) => json::to_text(m)?,
            }),
        };
        self.with(|w| {
            py.detach(|| {
                let mut row = NewRow::new(&source);
                for (name, t) in &tensors {
                    row = match t {
                        Some(t) => row.array(name, t.view()),
                        None => row.null(name),
                    };
                }
                for (k, v) in &side {
                    row = row.sidecar(k, v);
                }
                if let Some(m) = &meta {
                    row = row.meta(m);
                }
                w.write(&row)
            })
            .map_err(error)
        })
    }

    /// Commits every row written so far (fsync data, then the manifest).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|w| py.detach(|| w.flush()).map_err(error))
    }

    /// Writes the index, sidecars and `shapes.json`, marks the cache
    /// complete, and returns its row count. The writer is closed after.
    fn finalize(&self, py: Python<'_>) -> PyResult<u64> {
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.dir));
        }
        let mut slot = self.slot.lock();
        match std::mem::replace(&mut *slot, WriterSlot::Closed) {
            WriterSlot::Owned(w) => py.detach(|| w.finalize()).map_err(error),
            lent @ WriterSlot::Lent(_) => {
                *slot = lent;
                Err(errors::invalid(
                    "open_or_build finalizes the cache itself when the build function returns",
                ))
            }
            WriterSlot::Closed => Err(errors::raise(
                Kind::Other,
                format!("{}: writer is finalized or closed", self.dir.display()),
            )),
        }
    }

    fn __repr__(&self) -> String {
        format!("MemmapWriter({:?})", self.dir.display().to_string())
    }
}

impl Drop for PyMemmapWriter {
    fn drop(&mut self) {
        if self.fork.forked() {
            // The parent's writer: dropping it here would commit or truncate
            // the parent's rows and release the parent's lock.
            std::mem::forget(std::mem::replace(self.slot.get_mut(), WriterSlot::Closed));
        }
    }
}

/// One opening of a memmap-array cache.
struct Opening {
    cache: Arc<ArrayCache>,
    /// The `.base` of every array returned from this opening: it holds the
    /// cache (and so its mappings) alive.
    keeper: Py<PyAny>,
    load_in_memory: bool,
    ram_fraction: f64,
}

impl Opening {
    fn new(py: Python<'_>, cache: ArrayCache, load: bool, fraction: f64) -> PyResult<Arc<Self>> {
        let cache = Arc::new(cache);
        let keeper = Keeper::wrap(py, cache.clone())?.unbind();
        Ok(Arc::new(Opening {
            cache,
            keeper,
            load_in_memory: load,
            ram_fraction: fraction,
        }))
    }

    fn row_index(&self, i: i64) -> PyResult<u64> {
        let n = self.cache.len();
        let j = if i < 0 { i + n as i64 } else { i };
        u64::try_from(j).ok().filter(|&j| j < n).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err(format!(
                "row {i} out of range: the cache has {n} rows"
            ))
        })
    }
}

/// A finished memmap-array cache, open for reading.
#[pyclass(module = "cachex._cachex", name = "MemmapArray", frozen)]
pub struct PyMemmapArray {
    dir: PathBuf,
    /// Swapped whole by `load_in_memory` and by the reopen in a forked
    /// child; arrays returned earlier keep their own opening alive. Locked
    /// only with the GIL held and only to clone or swap the `Arc`.
    opened: RwLock<Arc<Opening>>,
    fork: ForkMark,
}

impl PyMemmapArray {
    fn wrap(py: Python<'_>, cache: ArrayCache, load: bool, fraction: f64) -> PyResult<Self> {
        Ok(PyMemmapArray {
            dir: cache.dir().to_path_buf(),
            opened: RwLock::new(Opening::new(py, cache, load, fraction)?),
            fork: ForkMark::new(py),
        })
    }

    /// The current opening; in a forked child, first a fresh one from the
    /// path and options (nothing of the parent's is used).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<Opening>> {
        if self.fork.forked() {
            let (load, fraction) = {
                let o = self.opened.read();
                (o.load_in_memory, o.ram_fraction)
            };
            let dir = &self.dir;
            let cache = py
                .detach(|| open_cache(dir, load, fraction))
                .map_err(error)?;
            *self.opened.write() = Opening::new(py, cache, load, fraction)?;
            self.fork.reopened();
        }
        Ok(self.opened.read().clone())
    }
}

fn open_cache(dir: &Path, load: bool, fraction: f64) -> memmap_array::Result<ArrayCache> {
    let mut cache = ArrayCache::open(dir)?;
    if load {
        cache.load_in_memory_with(fraction)?;
    }
    Ok(cache)
}

/// A numpy array of `dtype` over `view`'s bytes, owned by `owner`.
///
/// # Safety
/// As [`array::view`]: `view` borrows memory `owner` keeps alive unchanged.
unsafe fn numpy_view<'py>(
    py: Python<'py>,
    view: &TensorView<'_>,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded from the caller.
    unsafe { array::view(py, view.dtype(), view.shape().dims(), view.bytes(), owner) }
}

#[pymethods]
impl PyMemmapArray {
    #[new]
    #[pyo3(signature = (path, *, load_in_memory=false, ram_fraction=memmap_array::DEFAULT_RAM_FRACTION))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        load_in_memory: bool,
        ram_fraction: f64,
    ) -> PyResult<Self> {
        let cache = py
            .detach(|| open_cache(&path, load_in_memory, ram_fraction))
            .map_err(error)?;
        Self::wrap(py, cache, load_in_memory, ram_fraction)
    }

    /// The cache directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.dir.clone()
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.current(py)?.cache.len() as usize)
    }

    /// The schema: `{"arrays": {name: {dtype, shape, nullable}}, "sidecars": [...]}`.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        schema_to_py(py, self.current(py)?.cache.schema())
    }

    /// `fingerprint.json` as a Python value.
    #[getter]
    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::to_py(py, self.current(py)?.cache.fingerprint())
    }

    /// Whether the arrays are read from RAM (`load_in_memory`) rather than
    /// from the mapped files.
    #[getter]
    fn in_memory(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.current(py)?.load_in_memory)
    }

    /// Copies every array into RAM and reads from there from now on;
    /// refused with `InvalidInputError` (nothing changed) when the arrays
    /// exceed `ram_fraction` of physical RAM. Arrays returned before keep
    /// viewing the mapped files. A pickled copy loads too.
    #[pyo3(signature = (ram_fraction=memmap_array::DEFAULT_RAM_FRACTION))]
    fn load_in_memory(&self, py: Python<'_>, ram_fraction: f64) -> PyResult<()> {
        self.current(py)?;
        let dir = &self.dir;
        let cache = py
            .detach(|| open_cache(dir, true, ram_fraction))
            .map_err(error)?;
        *self.opened.write() = Opening::new(py, cache, true, ram_fraction)?;
        Ok(())
    }

    /// Row `i`'s arrays as read-only numpy views of the mapped files
    /// (`None` for a null entry of a nullable array).
    fn get_row<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let row = o.cache.row(o.row_index(i)?).map_err(error)?;
        let owner = o.keeper.bind(py);
        let out = PyDict::new(py);
        for (spec, view) in o.cache.schema().arrays().iter().zip(row.arrays()) {
            let value = match view {
                // SAFETY: the view borrows the cache's mapping (or its
                // in-memory copy), which `owner` (an `Arc<ArrayCache>`)
                // keeps alive and never mutates.
                Some(v) => unsafe { numpy_view(py, v, owner)? },
                None => py.None().into_bound(py),
            };
            out.set_item(spec.name(), value)?;
        }
        Ok(out)
    }

    /// Array `name` of row `i` as a read-only view (or `None`).
    fn get<'py>(&self, py: Python<'py>, i: i64, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let o = self.current(py)?;
        match o.cache.array(o.row_index(i)?, name).map_err(error)? {
            // SAFETY: as in `get_row`.
            Some(v) => unsafe { numpy_view(py, &v, o.keeper.bind(py)) },
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Copies rows `indices` (negative from the end) into the caller's
    /// preallocated buffers, with the GIL released and no allocation per
    /// row: `out` maps array names to writable C-contiguous arrays of the
    /// array's dtype and shape `(n, *shape)` with `n >= len(indices)`.
    /// Arrays not in `out` are skipped; a null entry is zero-filled.
    /// Returns, for each nullable array in `out`, which rows were present
    /// (`{name: [bool, ...]}`).
    fn fill_batch<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<i64>,
        out: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let cache = &o.cache;
        let rows: Vec<u64> = indices
            .iter()
            .map(|&i| o.row_index(i))
            .collect::<PyResult<_>>()?;
        let mut names = Vec::with_capacity(out.len());
        let mut buffers = Vec::with_capacity(out.len());
        for (name, buf) in out.iter() {
            let name: String = name.extract()?;
            let k = cache.schema().array_index(&name).ok_or_else(|| {
                errors::invalid(format!("{}: no array {name:?}", self.dir.display()))
            })?;
            let a = buf
                .cast_into::<PyUntypedArray>()
                .map_err(|_| errors::invalid(format!("out[{name:?}] must be a numpy array")))?;
            let spec = &cache.schema().arrays()[k];
            let dims = a.shape().to_vec();
            if array::dtype_of(&a.dtype())? != spec.dtype()
                || dims.get(1..) != Some(spec.shape().dims())
                || dims[0] < rows.len()
            {
                return Err(errors::invalid(format!(
                    "out[{name:?}]: {} {dims:?} does not hold {} rows of {} {}",
                    a.dtype().str()?,
                    rows.len(),
                    spec.dtype(),
                    spec.shape()
                )));
            }
            names.push((name, k, spec.nullable()));
            buffers.push(a);
        }
        let sinks = buffers
            .iter()
            .zip(&names)
            .map(|(a, (name, _, _))| RowSink::new(&format!("out[{name:?}]"), a))
            .collect::<PyResult<Vec<_>>>()?;
        let positions: Vec<usize> = names.iter().map(|(_, k, _)| *k).collect();
        let (rows, positions) = (&rows, &positions);
        let present = py
            .detach(move || -> memmap_array::Result<Vec<Vec<bool>>> {
                let mut present = vec![Vec::with_capacity(rows.len()); sinks.len()];
                for (r, &i) in rows.iter().enumerate() {
                    for ((sink, &k), p) in sinks.iter().zip(positions).zip(&mut present) {
                        let view = cache.array_at(i, k)?;
                        // Shapes were checked above: a row always fits.
                        sink.write(r, view.as_ref().map_or(&[], |v| v.bytes()));
                        p.push(view.is_some());
                    }
                }
                Ok(present)
            })
            .map_err(error)?;
        let result = PyDict::new(py);
        for ((name, _, nullable), p) in names.into_iter().zip(present) {
            if nullable {
                result.set_item(name, p)?;
            }
        }
        Ok(result)
    }

    /// The source id of row `i`.
    fn source(&self, py: Python<'_>, i: i64) -> PyResult<String> {
        let o = self.current(py)?;
        Ok(o.cache.source(o.row_index(i)?).map_err(error)?.to_owned())
    }

    /// The metadata JSON of row `i`, parsed (or `None`).
    fn meta<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyAny>> {
        let o = self.current(py)?;
        let row = o.cache.row(o.row_index(i)?).map_err(error)?;
        match row.meta_json() {
            Some(text) => json::text_to_py(py, text),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Sidecar `name`'s value for row `i` (or `None`).
    fn sidecar(&self, py: Python<'_>, name: &str, i: i64) -> PyResult<Option<String>> {
        let o = self.current(py)?;
        Ok(o.cache
            .sidecar(name, o.row_index(i)?)
            .map_err(error)?
            .map(str::to_owned))
    }

    /// Every distinct value of sidecar `name`, indexed by key.
    fn sidecar_values(&self, py: Python<'_>, name: &str) -> PyResult<Vec<String>> {
        let o = self.current(py)?;
        let cache = &o.cache;
        py.detach(|| cache.sidecar_values(name).map(<[String]>::to_vec))
            .map_err(error)
    }

    /// The row whose source id is `source`, or `None`.
    fn find(&self, py: Python<'_>, source: &str) -> PyResult<Option<u64>> {
        let o = self.current(py)?;
        let cache = &o.cache;
        Ok(py.detach(|| cache.find(source)))
    }

    /// Asks the kernel to read row `i` ahead (`madvise(WILLNEED)`).
    fn prefetch(&self, py: Python<'_>, i: i64) -> PyResult<()> {
        let o = self.current(py)?;
        o.cache.prefetch(o.row_index(i)?);
        Ok(())
    }

    /// The row index as a list of entries: `{"row", "source", "meta",
    /// "sidecars": {name: value}}` (meta parsed from JSON).
    fn index<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let o = self.current(py)?;
        let out = PyList::empty(py);
        let sidecars = o.cache.schema().sidecars();
        for i in 0..o.cache.len() {
            let row = o.cache.row(i).map_err(error)?;
            let d = PyDict::new(py);
            d.set_item("row", i)?;
            d.set_item("source", row.source())?;
            let meta = match row.meta_json() {
                Some(t) => json::text_to_py(py, t)?,
                None => py.None().into_bound(py),
            };
            d.set_item("meta", meta)?;
            let side = PyDict::new(py);
            for s in sidecars {
                side.set_item(s, row.sidecar(s).map_err(error)?)?;
            }
            d.set_item("sidecars", side)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// `index.parquet` as a `pyarrow.Table` (needs pyarrow installed).
    fn index_table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let path = self.dir.join(memmap_array::INDEX_FILE);
        py.import("pyarrow.parquet")?
            .call_method1("read_table", (path,))
    }

    /// Pickles as the path and load options; the copy reopens the cache.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let (load, fraction) = {
            let o = this.opened.read();
            (o.load_in_memory, o.ram_fraction)
        };
        let reopen = py
            .import("cachex._cachex")?
            .getattr("_reopen_memmap_array")?;
        let args = (this.dir.clone(), load, fraction).into_pyobject(py)?;
        Ok((reopen, args))
    }

    fn __repr__(&self) -> String {
        let rows = self.opened.read().cache.len();
        format!(
            "MemmapArray({:?}, rows={rows})",
            self.dir.display().to_string(),
        )
    }
}

/// Unpickles a `MemmapArray` (see `MemmapArray.__reduce__`).
#[pyfunction]
pub fn _reopen_memmap_array(
    py: Python<'_>,
    path: PathBuf,
    load_in_memory: bool,
    ram_fraction: f64,
) -> PyResult<PyMemmapArray> {
    PyMemmapArray::new(py, path, load_in_memory, ram_fraction)
}

/// Why a build failed: the store's error or the build callback's exception.
enum BuildError {
    Store(memmap_array::Error),
    Py(PyErr),
}

impl From<memmap_array::Error> for BuildError {
    fn from(e: memmap_array::Error) -> Self {
        BuildError::Store(e)
    }
}

/// Opens the cache `root/<name>/<key of config>` (the layout the facade
/// uses for the same name and config), calling `build(writer)` to
/// (re)build it when missing, half-built or stale; returns the reader and
/// what was done (`"cache hit"`, `"cache rebuilt (stale: ...)"`, ...).
#[pyfunction]
#[pyo3(signature = (root, name, config, build, arrays, *, nullable=Vec::new(), sidecars=Vec::new(), sources=Vec::new(), content_hash=false, sync_every=WriterOptions::DEFAULT_SYNC_EVERY))]
#[allow(clippy::too_many_arguments)]
pub fn memmap_open_or_build<'py>(
    py: Python<'py>,
    root: PathBuf,
    name: &str,
    config: &Bound<'py, PyAny>,
    build: Bound<'py, PyAny>,
    arrays: &Bound<'py, PyDict>,
    nullable: Vec<String>,
    sidecars: Vec<String>,
    sources: Vec<PathBuf>,
    content_hash: bool,
    sync_every: usize,
) -> PyResult<(PyMemmapArray, String)> {
    let schema = schema_arg(arrays, &nullable, &sidecars)?;
    let config = json::from_py(config)?;
    let mode = if content_hash {
        fingerprint::Mode::Content
    } else {
        fingerprint::Mode::Metadata
    };
    let stamps: Vec<SourceStamp> = py
        .detach(|| fingerprint::stamp_sources(&root, &sources, mode))
        .map_err(|e| errors::invalid(e.to_string()))?;
    let build = build.unbind();
    let root_for_writer = root.clone();
    let opened: Result<memmap_array::Opened, BuildError> = py.detach(|| {
        memmap_array::open_or_build_with(
            &root,
            name,
            &config,
            stamps,
            &schema,
            WriterOptions { sync_every },
            |w: &mut RowWriter| -> Result<(), BuildError> {
                Python::attach(|py| {
                    let writer = Bound::new(
                        py,
                        PyMemmapWriter {
                            dir: root_for_writer.clone(),
                            slot: Mutex::new(WriterSlot::Lent(LentWriter(w as *mut RowWriter))),
                            fork: ForkMark::new(py),
                        },
                    )
                    .map_err(BuildError::Py)?;
                    let result = build.bind(py).call1((writer.clone(),));
                    // Take the writer back before `w`'s borrow ends: the
                    // Python object may outlive this call.
                    *writer.get().slot.lock() = WriterSlot::Closed;
                    result.map(drop).map_err(BuildError::Py)
                })
            },
        )
    });
    match opened {
        Ok(o) => {
            let outcome = o.outcome.to_string();
            Ok((
                PyMemmapArray::wrap(py, o.cache, false, memmap_array::DEFAULT_RAM_FRACTION)?,
                outcome,
            ))
        }
        Err(BuildError::Store(e)) => Err(error(e)),
        Err(BuildError::Py(e)) => Err(e),
    }
}

/// A report of the cache in `path`: sizes, schema, sidecar dedup ratios
/// and the RAM a load would take.
#[pyfunction]
pub fn memmap_inspect<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let r = py.detach(|| memmap_array::inspect(&path)).map_err(error)?;
    let d = PyDict::new(py);
    d.set_item("dir", &r.dir)?;
    d.set_item("complete", r.complete)?;
    d.set_item("rows", r.rows)?;
    d.set_item("schema", schema_to_py(py, &r.schema)?)?;
    let arrays = PyList::empty(py);
    for a in &r.arrays {
        let ad = PyDict::new(py);
        ad.set_item("name", &a.name)?;
        ad.set_item("dtype", a.dtype.name())?;
        ad.set_item("shape", a.shape.clone())?;
        ad.set_item("nullable", a.nullable)?;
        ad.set_item("row_bytes", a.row_bytes)?;
        ad.set_item("absent_rows", a.absent_rows)?;
        ad.set_item("file_bytes", a.file_bytes)?;
        arrays.append(ad)?;
    }
    d.set_item("arrays", arrays)?;
    let sides = PyList::empty(py);
    for s in &r.sidecars {
        let sd = PyDict::new(py);
        sd.set_item("name", &s.name)?;
        sd.set_item("rows_with_value", s.rows_with_value)?;
        sd.set_item("unique_values", s.unique_values)?;
        sd.set_item("unique_bytes", s.unique_bytes)?;
        sd.set_item("logical_bytes", s.logical_bytes)?;
        sd.set_item("dedup_ratio", s.dedup_ratio())?;
        sides.append(sd)?;
    }
    d.set_item("sidecars", sides)?;
    let files = PyDict::new(py);
    for f in &r.files {
        files.set_item(&f.name, f.bytes)?;
    }
    d.set_item("files", files)?;
    d.set_item("disk_bytes", r.disk_bytes())?;
    d.set_item("projected_ram_bytes", r.projected_ram_bytes)?;
    d.set_item("physical_ram_bytes", r.physical_ram_bytes)?;
    d.set_item("fits_in_memory", r.fits_in_memory())?;
    Ok(d)
}

/// Every problem in the cache in `path` (`[]` when sound), each
/// `{"path", "detail"}`.
#[pyfunction]
pub fn memmap_verify<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyList>> {
    let problems = py.detach(|| memmap_array::verify(&path));
    let out = PyList::empty(py);
    for p in &problems {
        let d = PyDict::new(py);
        d.set_item("path", &p.path)?;
        d.set_item("kind", format!("{:?}", p.kind))?;
        d.set_item("detail", &p.detail)?;
        out.append(d)?;
    }
    Ok(out)
}
