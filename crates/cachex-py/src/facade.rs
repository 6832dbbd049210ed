//! `cachex.open(config)` (a `Cache` over any backend of `cache-facade`)
//! and the native side of `cachex.CachedFn`.

use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::sync::Arc;

use cache_facade::{CacheBackend, CacheConfig, FacadeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use tensor_core::{SharedBytes, SharedTensor, Value};

use crate::array::{self, Keeper};
use crate::errors::{self, Kind};
use crate::fork::ForkMark;
use crate::{json, memmap, page, shard};

/// A facade error as its `cachex.errors` exception; a failure of the
/// wrapped Python function comes back as the function's own exception.
fn error(e: FacadeError) -> PyErr {
    match e {
        FacadeError::Segment(e) => errors::segment(e),
        FacadeError::Memmap(e) => memmap::error(e),
        FacadeError::Shard(e) => shard::error(e),
        FacadeError::Page(e) => page::error(e),
        FacadeError::Compute(source) => match source.downcast::<PyErr>() {
            Ok(py_err) => *py_err,
            Err(other) => errors::raise(Kind::Other, format!("compute failed: {other}")),
        },
        e => {
            let kind = match &e {
                FacadeError::Stale { .. } => Kind::Stale,
                FacadeError::Io { .. } | FacadeError::MissingRoot(_) => Kind::Io,
                FacadeError::Unsupported { .. } => Kind::ReadOnly,
                FacadeError::InUse { .. } => Kind::Locked,
                FacadeError::Config(_)
                | FacadeError::MissingIds { .. }
                | FacadeError::EmptyId { .. }
                | FacadeError::ComputeCount { .. }
                | FacadeError::KindMismatch { .. }
                | FacadeError::IndexOutOfRange { .. }
                | FacadeError::BadValue { .. } => Kind::InvalidInput,
                _ => Kind::Other,
            };
            errors::raise(kind, e.to_string())
        }
    }
}

/// A value from Python: `bytes` → blob, dict → named values, tuple/list →
/// items, anything array-like → one tensor (copied once, so the store can
/// use it with the GIL released).
fn value_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Blob(SharedBytes::from(b.as_bytes())));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut items = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let name = k
                .cast::<PyString>()
                .map_err(|_| errors::invalid("dict value keys must be str"))?
                .to_str()?
                .to_owned();
            items.push((Arc::<str>::from(name), value_from_py(&v)?));
        }
        return Ok(Value::Dict(items));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return Ok(Value::Tuple(
            t.iter()
                .map(|v| value_from_py(&v))
                .collect::<PyResult<_>>()?,
        ));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return Ok(Value::List(
            l.iter()
                .map(|v| value_from_py(&v))
                .collect::<PyResult<_>>()?,
        ));
    }
    Ok(Value::Tensor(SharedTensor::from(array::tensor_from_py(
        obj,
    )?)))
}

/// A value as numpy views (whose base `owner` keeps the value's memory
/// alive), `bytes`, dicts, tuples and lists.
fn value_view<'py>(
    py: Python<'py>,
    value: &Value,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let items = |values: &[Value]| -> PyResult<Vec<Bound<'py, PyAny>>> {
        values.iter().map(|v| value_view(py, v, owner)).collect()
    };
    Ok(match value {
        // SAFETY: the tensor's bytes belong to a `SharedBytes` owner that
        // `owner` holds (through the value or its batch): heap memory or a
        // mapped store file, never mutated, freed only with the last
        // reference.
        Value::Tensor(t) => unsafe {
            array::view(py, t.dtype(), t.shape().dims(), t.bytes(), owner)?
        },
        Value::Blob(b) => PyBytes::new(py, b.as_slice()).into_any(),
        Value::Dict(named) => {
            let d = PyDict::new(py);
            for (name, v) in named {
                d.set_item(&**name, value_view(py, v, owner)?)?;
            }
            d.into_any()
        }
        Value::Tuple(values) => PyTuple::new(py, items(values)?)?.into_any(),
        Value::List(values) => PyList::new(py, items(values)?)?.into_any(),
    })
}

/// The values of one batch (`None` where absent) as a list; one
/// `MappedValue` holding the whole batch is the base of every array in it.
fn values_to_py(py: Python<'_>, values: Vec<Option<Value>>) -> PyResult<Bound<'_, PyList>> {
    let values = Arc::new(values);
    let owner = Keeper::wrap(py, values.clone())?;
    let out = PyList::empty(py);
    for v in values.iter() {
        match v {
            Some(v) => out.append(value_view(py, v, &owner)?)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// One backend shared by a `Cache` handle and the `CachedFn`s over it.
type Shared = Arc<dyn CacheBackend>;

fn config_arg(obj: &Bound<'_, PyAny>) -> PyResult<CacheConfig> {
    if let Ok(path) = obj.extract::<PathBuf>()
        && !obj.is_instance_of::<PyDict>()
    {
        return CacheConfig::from_file(&path).map_err(error);
    }
    let value = json::from_py(obj)?;
    serde_json::from_value(value).map_err(|e| errors::invalid(format!("cache config: {e}")))
}

/// A cache opened from a config by `cachex.open`.
#[pyclass(module = "cachex._cachex", name = "Cache", frozen)]
pub struct PyCache {
    backend: Shared,
    config: CacheConfig,
    /// Set in a forked child: writes are refused there (the backend's
    /// buffers, lock and writer thread are the parent's) and the inherited
    /// backend is leaked, never flushed or joined, when the handle goes.
    fork: ForkMark,
}

impl PyCache {
    fn writable(&self) -> PyResult<()> {
        if self.fork.forked() {
            return Err(errors::forked_writer(self.backend.path()));
        }
        Ok(())
    }
}

impl Drop for PyCache {
    fn drop(&mut self) {
        if self.fork.forked() {
            std::mem::forget(self.backend.clone());
        }
    }
}

#[pymethods]
impl PyCache {
    /// The cache directory (`root/<name>/<key>`).
    #[getter]
    fn path(&self) -> PathBuf {
        self.backend.path().to_path_buf()
    }

    /// The config, as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = serde_json::to_value(&self.config)
            .map_err(|e| errors::raise(Kind::Other, e.to_string()))?;
        json::to_py(py, &v)
    }

    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let b = &self.backend;
        let (values, missing) = py
            .detach(|| {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                b.get_batch(&refs)
            })
            .map_err(error)?;
        Ok((values_to_py(py, values)?, missing))
    }

    /// Values by index (negative counts from the end), for backends that
    /// serve indices (memmap-array, shard-store, page-alloc).
    fn get_indices<'py>(&self, py: Python<'py>, indices: Vec<i64>) -> PyResult<Bound<'py, PyList>> {
        let b = &self.backend;
        let values = py.detach(|| b.get_indices(&indices)).map_err(error)?;
        values_to_py(py, values.into_iter().map(Some).collect())
    }

    /// The backend's name (`"segment-store"`, ...).
    #[getter]
    fn backend(&self) -> &'static str {
        self.backend.kind().name()
    }

    fn put_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let pairs = match items.cast::<PyDict>() {
            Ok(d) => d.items().into_any(),
            Err(_) => items.clone(),
        };
        let mut batch = Vec::new();
        for pair in pairs.try_iter()? {
            let (k, v): (String, Bound<'_, PyAny>) = pair?.extract()?;
            batch.push((k, value_from_py(&v)?));
        }
        self.writable()?;
        let b = &self.backend;
        py.detach(|| b.put_batch(batch)).map_err(error)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.writable()?;
        let b = &self.backend;
        py.detach(|| b.flush()).map_err(error)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let b = &self.backend;
        let n = py.detach(|| b.len()).map_err(error)?;
        usize::try_from(n)
            .map_err(|_| errors::invalid(format!("{n} entries do not fit a Python length")))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.backend.stats();
        let d = PyDict::new(py);
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("bytes_read", s.bytes_read)?;
        d.set_item("bytes_written", s.bytes_written)?;
        d.set_item("flushes", s.flushes)?;
        d.set_item("hit_rate", s.hit_rate())?;
        Ok(d)
    }
}

/// Opens (or creates) the cache a config names: a dict such as
/// `{"backend": "segment-store", "root": "cache", "name": "features",
/// "options": {...}, "sources": {...}, "create_root": true, "on_stale":
/// "rebuild"}`, or the path of a JSON file holding one.
#[pyfunction]
pub fn open(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<PyCache> {
    let config = config_arg(config)?;
    let backend = py.detach(|| cache_facade::open(&config)).map_err(error)?;
    Ok(PyCache {
        backend: Arc::from(backend),
        config,
        fork: ForkMark::new(py),
    })
}

type ComputeFn = Box<dyn Fn(&[&Py<PyAny>]) -> Result<Vec<Value>, PyErr> + Send + Sync>;

/// The native half of `cachex.CachedFn`: looks ids up, calls the Python
/// batch function once for the misses, stores and returns every output.
#[pyclass(module = "cachex._cachex", name = "_CachedFn", frozen)]
pub struct PyCachedFn {
    inner: ManuallyDrop<cache_facade::CachedFn<Shared, ComputeFn>>,
    /// The cache directory, for errors.
    path: PathBuf,
    /// Set in a forked child, where calls (which store what they compute)
    /// are refused and the inherited state is leaked on drop.
    fork: ForkMark,
}

impl PyCachedFn {
    fn writable(&self) -> PyResult<()> {
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.path));
        }
        Ok(())
    }
}

impl Drop for PyCachedFn {
    fn drop(&mut self) {
        // In a forked child the inherited state (the parent's backend) is
        // leaked: dropping it could flush or join what is the parent's.
        if !self.fork.forked() {
            // SAFETY: `inner` is dropped once, here, and not used after.
            unsafe { ManuallyDrop::drop(&mut self.inner) }
        }
    }
}

#[pymethods]
impl PyCachedFn {
    #[new]
    fn new(cache: &Bound<'_, PyCache>, func: Py<PyAny>) -> PyResult<Self> {
        let compute: ComputeFn = Box::new(move |inputs: &[&Py<PyAny>]| {
            Python::attach(|py| {
                let batch = PyList::new(py, inputs.iter().map(|i| i.bind(py)))?;
                let outputs = func.bind(py).call1((batch,))?;
                outputs
                    .try_iter()?
                    .map(|o| value_from_py(&o?))
                    .collect::<PyResult<Vec<Value>>>()
            })
        });
        let backend = &cache.get().backend;
        Ok(PyCachedFn {
            inner: ManuallyDrop::new(
                cache_facade::CachedFn::new(backend.clone(), compute).map_err(error)?,
            ),
            path: backend.path().to_path_buf(),
            fork: ForkMark::new(cache.py()),
        })
    }

    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Py<PyAny>>,
        ids: Vec<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        self.writable()?;
        let inner = &*self.inner;
        let outputs = py.detach(|| inner.call(&inputs, &ids)).map_err(error)?;
        values_to_py(py, outputs.into_iter().map(Some).collect())
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats();
        let d = PyDict::new(py);
        d.set_item("calls", s.calls)?;
        d.set_item("hits", s.hits)?;
        d.set_item("computed", s.computed)?;
        d.set_item("deduplicated", s.deduplicated)?;
        d.set_item("compute_calls", s.compute_calls)?;
        Ok(d)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.writable()?;
        let inner = &*self.inner;
        py.detach(|| inner.flush()).map_err(error)
    }
}
