//! `cachex.open(config)` (a `Cache` over any backend of `cache-facade`)
//! and the native side of `cachex.CachedFn`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cache_facade::{CacheBackend, CacheConfig, FacadeError, Lookup, Stats};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use segment_store::Record;

use crate::errors::{self, Kind};
use crate::segment::{record_from_py, records_to_py};
use crate::{json, memmap};

/// A facade error as its `cachex.errors` exception; a failure of the
/// wrapped Python function comes back as the function's own exception.
fn error(e: FacadeError) -> PyErr {
    match e {
        FacadeError::Segment(e) => errors::segment(e),
        FacadeError::Memmap(e) => memmap::error(e),
        FacadeError::Compute(source) => match source.downcast::<PyErr>() {
            Ok(py_err) => *py_err,
            Err(other) => errors::raise(Kind::Other, format!("compute failed: {other}")),
        },
        e => {
            let kind = match &e {
                FacadeError::Stale { .. } => Kind::Stale,
                FacadeError::Io { .. } | FacadeError::MissingRoot(_) => Kind::Io,
                FacadeError::ReadOnly { .. } => Kind::ReadOnly,
                FacadeError::Config(_)
                | FacadeError::MissingIds { .. }
                | FacadeError::EmptyId { .. }
                | FacadeError::ComputeCount { .. }
                | FacadeError::KindMismatch { .. } => Kind::InvalidInput,
                _ => Kind::Other,
            };
            errors::raise(kind, e.to_string())
        }
    }
}

/// One backend shared by a `Cache` handle and the `CachedFn`s over it.
#[derive(Clone)]
struct Shared(Arc<dyn CacheBackend<Value = Record>>);

impl CacheBackend for Shared {
    type Value = Record;
    fn get_batch(&self, keys: &[&str]) -> cache_facade::Result<Lookup<Record>> {
        self.0.get_batch(keys)
    }
    fn put_batch(&self, items: Vec<(String, Record)>) -> cache_facade::Result<()> {
        self.0.put_batch(items)
    }
    fn flush(&self) -> cache_facade::Result<()> {
        self.0.flush()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

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
        Ok((records_to_py(py, values)?, missing))
    }

    fn put_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let pairs = match items.cast::<PyDict>() {
            Ok(d) => d.items().into_any(),
            Err(_) => items.clone(),
        };
        let mut batch = Vec::new();
        for pair in pairs.try_iter()? {
            let (k, v): (String, Bound<'_, PyAny>) = pair?.extract()?;
            batch.push((k, record_from_py(&v)?));
        }
        let b = &self.backend;
        py.detach(|| b.put_batch(batch)).map_err(error)
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let b = &self.backend;
        py.detach(|| b.flush()).map_err(error)
    }

    fn __len__(&self) -> usize {
        self.backend.len()
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
        backend: Shared(Arc::from(backend)),
        config,
    })
}

type ComputeFn = Box<dyn Fn(&[&Py<PyAny>]) -> Result<Vec<Record>, PyErr> + Send + Sync>;

/// The native half of `cachex.CachedFn`: looks ids up, calls the Python
/// batch function once for the misses, stores and returns every output.
#[pyclass(module = "cachex._cachex", name = "_CachedFn", frozen)]
pub struct PyCachedFn {
    inner: cache_facade::CachedFn<Shared, ComputeFn>,
}

#[pymethods]
impl PyCachedFn {
    #[new]
    fn new(cache: &Bound<'_, PyCache>, func: Py<PyAny>) -> Self {
        let compute: ComputeFn = Box::new(move |inputs: &[&Py<PyAny>]| {
            Python::attach(|py| {
                let batch = PyList::new(py, inputs.iter().map(|i| i.bind(py)))?;
                let outputs = func.bind(py).call1((batch,))?;
                outputs
                    .try_iter()?
                    .map(|o| record_from_py(&o?))
                    .collect::<PyResult<Vec<Record>>>()
            })
        });
        PyCachedFn {
            inner: cache_facade::CachedFn::new(cache.get().backend.clone(), compute),
        }
    }

    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Py<PyAny>>,
        ids: Vec<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inner = &self.inner;
        let outputs = py.detach(|| inner.call(&inputs, &ids)).map_err(error)?;
        records_to_py(py, outputs.into_iter().map(Some).collect())
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
        let inner = &self.inner;
        py.detach(|| inner.flush()).map_err(error)
    }
}
