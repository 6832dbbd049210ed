//! `cachex.MemmapArray`: a finished memmap-array cache, open for reading.

use std::path::PathBuf;
use std::sync::Arc;

use cache_facade::StoreKind;
use memmap_array::MemmapArray;
use numpy::{PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use remote_cache::{ArraysAt, Location};
use tensor_core::TensorView;

use crate::array::{self, Keeper, RowSink};
use crate::handle::Handle;
use crate::memmap_schema::schema_to_py;
use crate::prefetch::PyPrefetch;
use crate::root::{Root, TierArgs};
use crate::{check, errors, json};

/// A cache as opened, wherever it lies: a local directory is read where
/// it is, a URL's `.bin` arrays by the blocks the rows asked for lie in
/// (fetched through the local tier before they are read: bytes not
/// fetched read as zeros). One store handle either way
/// ([`ArraysAt`]).
struct Arrays(ArraysAt);

impl Arrays {
    fn cache(&self) -> &MemmapArray {
        self.0.cache()
    }

    /// Makes the rows `rows` local, one fetch per run of consecutive rows.
    fn ensure_each(&self, rows: &[u64]) -> remote_cache::Result<()> {
        let mut k = 0;
        while k < rows.len() {
            let start = rows[k];
            let mut end = start + 1;
            k += 1;
            while k < rows.len() && rows[k] == end {
                end += 1;
                k += 1;
            }
            self.0.ensure_rows(start..end)?;
        }
        Ok(())
    }
}

/// One opening of a memmap-array cache.
struct Opening {
    arrays: Arc<Arrays>,
    /// The `.base` of every array returned from this opening: it holds the
    /// cache (and so its mappings) alive.
    keeper: Py<PyAny>,
    load_in_memory: bool,
    ram_fraction: f64,
}

impl Opening {
    fn new(py: Python<'_>, arrays: Arrays, load: bool, fraction: f64) -> PyResult<Arc<Self>> {
        let arrays = Arc::new(arrays);
        let keeper = Keeper::wrap(py, arrays.clone())?.unbind();
        Ok(Arc::new(Opening {
            arrays,
            keeper,
            load_in_memory: load,
            ram_fraction: fraction,
        }))
    }

    fn cache(&self) -> &MemmapArray {
        self.arrays.cache()
    }

    fn row_index(&self, i: i64) -> PyResult<u64> {
        let n = self.cache().len();
        let j = if i < 0 { i + n as i64 } else { i };
        u64::try_from(j).ok().filter(|&j| j < n).ok_or_else(|| {
            pyo3::exceptions::PyIndexError::new_err(format!(
                "row {i} out of range: the cache has {n} rows"
            ))
        })
    }
}

/// A finished memmap-array cache, open for reading.
///
/// On a URL the `.bin` arrays stay sparse files in the machine's local
/// tier, fetched by the blocks the rows read lie in; every process of the
/// machine (DataLoader workers too) shares the tier's one copy of each.
#[pyclass(module = "cachex._cachex", name = "MemmapArray", frozen)]
pub struct PyMemmapArray {
    root: Root,
    /// Swapped whole by `load_in_memory` and by the reopen in a forked
    /// child; arrays returned earlier keep their own opening alive.
    handle: Handle<Opening>,
}

impl PyMemmapArray {
    fn wrap(
        py: Python<'_>,
        root: Root,
        arrays: Arrays,
        load: bool,
        fraction: f64,
    ) -> PyResult<Self> {
        let dir = arrays.cache().dir().to_path_buf();
        Ok(PyMemmapArray {
            root,
            handle: Handle::new(py, dir, Opening::new(py, arrays, load, fraction)?),
        })
    }

    /// A reader of the finished cache `cache` in a local directory.
    pub(crate) fn local(py: Python<'_>, cache: MemmapArray) -> PyResult<Self> {
        let root = Root::new(
            &cache.dir().into_pyobject(py)?.into_any(),
            TierArgs::default(),
        )?;
        let fraction = memmap_array::DEFAULT_RAM_FRACTION;
        PyMemmapArray::wrap(
            py,
            root,
            Arrays(ArraysAt::from_local(cache).map_err(errors::to_py)?),
            false,
            fraction,
        )
    }

    /// A reader of the finished cache at the URL root `root`.
    pub(crate) fn remote(py: Python<'_>, root: Root) -> PyResult<Self> {
        let fraction = memmap_array::DEFAULT_RAM_FRACTION;
        let location = root.location();
        let arrays = errors::enter(py, || open_arrays(location, false, fraction))?;
        PyMemmapArray::wrap(py, root, arrays, false, fraction)
    }

    /// The current opening; in a forked child, first a fresh one from the
    /// root and options (nothing of the parent's is used; for a URL, a
    /// working directory of the child's own over the same tier).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<Opening>> {
        self.handle.get(py, |py, inherited| {
            let (load, fraction) = (inherited.load_in_memory, inherited.ram_fraction);
            let location = self.root.location();
            let arrays = errors::enter(py, || open_arrays(location, load, fraction))?;
            Opening::new(py, arrays, load, fraction)
        })
    }

    /// The opening with rows `rows` made local (GIL released).
    fn ready(&self, py: Python<'_>, rows: &[u64]) -> PyResult<Arc<Opening>> {
        let o = self.current(py)?;
        let arrays = &o.arrays;
        errors::enter(py, || arrays.ensure_each(rows))?;
        Ok(o)
    }
}

/// Opens the finished cache at `location`; `load` copies a local one into
/// RAM (refused for a URL, whose arrays are read by blocks).
fn open_arrays(location: &Location, load: bool, fraction: f64) -> remote_cache::Result<Arrays> {
    Ok(Arrays(if load {
        ArraysAt::open_loaded(location, fraction)?
    } else {
        ArraysAt::open(location)?
    }))
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
    /// Opens the finished cache in `path`; with `load_in_memory` its arrays
    /// are copied into RAM (refused beyond `ram_fraction` of physical RAM).
    ///
    /// `path` may be a URL (`s3://bucket/prefix`, ...), read through the
    /// local tier at `tier_dir` within `tier_budget` (bytes, or a size
    /// such as `"20G"`), with `storage_options` for the object store
    /// (credentials stay in the environment).
    #[new]
    #[pyo3(signature = (path, *, load_in_memory=false, ram_fraction=memmap_array::DEFAULT_RAM_FRACTION, tier_dir=None, tier_budget=None, storage_options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        load_in_memory: bool,
        ram_fraction: f64,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
        let location = root.location();
        let arrays = errors::enter(py, || open_arrays(location, load_in_memory, ram_fraction))?;
        Self::wrap(py, root, arrays, load_in_memory, ram_fraction)
    }

    /// The directory read: the cache directory, or for a URL the working
    /// directory over the local tier.
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL the cache was opened on, without credentials (`None` for a
    /// local directory).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
    }

    /// Opens the cache again as published now (a rebuilt cache; on a URL,
    /// a new commit). Arrays returned before keep the old opening.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let o = self.current(py)?;
        let (load, fraction) = (o.load_in_memory, o.ram_fraction);
        let location = self.root.location();
        let arrays = errors::enter(py, || open_arrays(location, load, fraction))?;
        self.handle
            .replace(py, Opening::new(py, arrays, load, fraction)?);
        Ok(())
    }

    /// The number of rows.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.current(py)?.cache().len() as usize)
    }

    /// The schema: `{"arrays": {name: {dtype, shape, nullable}}, "sidecars": [...]}`.
    #[getter]
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        schema_to_py(py, self.current(py)?.cache().schema())
    }

    /// `fingerprint.json` as a Python value.
    #[getter]
    fn fingerprint<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::to_py(py, self.current(py)?.cache().fingerprint())
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
        let location = self.root.location();
        let arrays = errors::enter(py, || open_arrays(location, true, ram_fraction))?;
        self.handle
            .replace(py, Opening::new(py, arrays, true, ram_fraction)?);
        Ok(())
    }

    /// Row `i`'s arrays as read-only numpy views of the mapped files
    /// (`None` for a null entry of a nullable array).
    fn get_row<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let i = self.current(py)?.row_index(i)?;
        let o = self.ready(py, &[i])?;
        let row = o.cache().row(i).map_err(errors::to_py)?;
        let owner = o.keeper.bind(py);
        let out = PyDict::new(py);
        for (spec, view) in o.cache().schema().arrays().iter().zip(row.arrays()) {
            let value = match view {
                // SAFETY: the view borrows the cache's mapping (or its
                // in-memory copy), which `owner` (an `Arc<MemmapArray>`)
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
        let i = self.current(py)?.row_index(i)?;
        let o = self.ready(py, &[i])?;
        match o.cache().array(i, name).map_err(errors::to_py)? {
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
        let arrays = &o.arrays;
        let cache = o.cache();
        let rows: Vec<u64> = indices
            .iter()
            .map(|&i| o.row_index(i))
            .collect::<PyResult<_>>()?;
        let mut names = Vec::with_capacity(out.len());
        let mut buffers = Vec::with_capacity(out.len());
        for (name, buf) in out.iter() {
            let name: String = name.extract()?;
            let k = cache.schema().array_index(&name).ok_or_else(|| {
                errors::invalid(format!(
                    "{}: no array {name:?}",
                    self.handle.path().display()
                ))
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
        let present = errors::enter(py, move || -> remote_cache::Result<Vec<Vec<bool>>> {
            arrays.ensure_each(rows)?;
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
        })?;
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
        Ok(o.cache()
            .source(o.row_index(i)?)
            .map_err(errors::to_py)?
            .to_owned())
    }

    /// The metadata JSON of row `i`, parsed (or `None`).
    fn meta<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyAny>> {
        let o = self.current(py)?;
        let row = o.cache().row(o.row_index(i)?).map_err(errors::to_py)?;
        match row.meta_json() {
            Some(text) => json::text_to_py(py, text),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Sidecar `name`'s value for row `i` (or `None`).
    fn sidecar(&self, py: Python<'_>, name: &str, i: i64) -> PyResult<Option<String>> {
        let o = self.current(py)?;
        Ok(o.cache()
            .sidecar(name, o.row_index(i)?)
            .map_err(errors::to_py)?
            .map(str::to_owned))
    }

    /// Every distinct value of sidecar `name`, indexed by key.
    fn sidecar_values(&self, py: Python<'_>, name: &str) -> PyResult<Vec<String>> {
        let o = self.current(py)?;
        let cache = o.cache();
        errors::enter(py, || cache.sidecar_values(name).map(<[String]>::to_vec))
    }

    /// The row whose source id is `source`, or `None`.
    fn find(&self, py: Python<'_>, source: &str) -> PyResult<Option<u64>> {
        let o = self.current(py)?;
        let cache = o.cache();
        Ok(py.detach(|| cache.find(source)))
    }

    /// Warms row `rows` (an index, or a sequence of them in the order
    /// the next epoch reads them) and returns a `Prefetch` at once.
    ///
    /// On a URL the rows' blocks are fetched into the local tier in the
    /// background, within the tier's budget (MosaicML's `predownload`);
    /// reads meanwhile fetch what they need first. On a local cache the
    /// kernel is asked to read them ahead (`madvise(WILLNEED)`) and the
    /// `Prefetch` returned is already done, every count zero.
    fn prefetch(&self, py: Python<'_>, rows: &Bound<'_, PyAny>) -> PyResult<PyPrefetch> {
        let o = self.current(py)?;
        let asked: Vec<i64> = match rows.extract::<i64>() {
            Ok(i) => vec![i],
            Err(_) => rows.extract()?,
        };
        let rows = asked
            .into_iter()
            .map(|i| o.row_index(i))
            .collect::<PyResult<Vec<u64>>>()?;
        let arrays = &o.arrays;
        Ok(PyPrefetch::new(py.detach(|| arrays.0.prefetch(&rows))))
    }

    /// The row index as a list of entries: `{"row", "source", "meta",
    /// "sidecars": {name: value}}` (meta parsed from JSON).
    fn index<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let o = self.current(py)?;
        let out = PyList::empty(py);
        let sidecars = o.cache().schema().sidecars();
        for i in 0..o.cache().len() {
            let row = o.cache().row(i).map_err(errors::to_py)?;
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
                side.set_item(s, row.sidecar(s).map_err(errors::to_py)?)?;
            }
            d.set_item("sidecars", side)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// `index.parquet` as a `pyarrow.Table` (needs pyarrow installed).
    fn index_table<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let path = self
            .current(py)?
            .cache()
            .dir()
            .join(memmap_array::INDEX_FILE);
        py.import("pyarrow.parquet")?
            .call_method1("read_table", (path,))
    }

    /// Everything wrong with the cache (reads every file), as `cachex
    /// verify --json` prints it: `{"kind": "memmap-array", "path",
    /// "problems": [{"path", "kind", "detail"}, ...]}`, `problems` empty
    /// when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let arrays = &o.arrays;
        // The check reads every row: on a URL, fetched first.
        let n = o.cache().len();
        errors::enter(py, || arrays.0.ensure_rows(0..n))?;
        let dir = o.cache().dir();
        let problems = py.detach(|| memmap_array::verify(dir));
        check::verify_to_py(py, StoreKind::MemmapArray, dir, &problems)
    }

    /// What the cache holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, rows, completeness, sizes and the RAM a load would take, and
    /// tables of arrays, sidecars and files.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let dir = o.cache().dir();
        let report = errors::enter(py, || memmap_array::inspect(dir))?;
        check::summary_to_py(py, &report.summary())
    }

    /// Pickles as the path (or URL), load options and tier keywords; the
    /// copy reopens the cache.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let (load, fraction) = this
            .handle
            .peek()
            .map_or((false, memmap_array::DEFAULT_RAM_FRACTION), |o| {
                (o.load_in_memory, o.ram_fraction)
            });
        let reopen = py
            .import("cachex._cachex")?
            .getattr("_reopen_memmap_array")?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("load_in_memory", load)?;
        kwargs.set_item("ram_fraction", fraction)?;
        this.root.tier().to_kwargs(&kwargs)?;
        let args = (this.root.to_py(py)?, kwargs).into_pyobject(py)?;
        Ok((reopen, args))
    }

    /// `MemmapArray(path, rows=n)` (a URL shown without credentials).
    fn __repr__(&self) -> String {
        let rows = self.handle.peek().map_or(0, |o| o.cache().len());
        format!("MemmapArray({:?}, rows={rows})", self.root.shown())
    }
}

/// Unpickles a `MemmapArray` (see `MemmapArray.__reduce__`).
#[pyfunction]
pub fn _reopen_memmap_array<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PyMemmapArray>().call((path,), Some(kwargs))
}
