//! `cachex.open(config)` (a `Cache` over any backend of `cache-facade`)
//! and the native side of `cachex.CachedFn`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cache_facade::{CacheBackend, CacheConfig};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value as Json;
use tensor_core::Value;

use crate::errors::{self, Kind};
use crate::handle::Handle;
use crate::root::TierArgs;
use crate::{convert, json};

/// One backend shared by a `Cache` handle and the `CachedFn`s over it.
type Shared = Arc<dyn CacheBackend>;

fn config_arg(obj: &Bound<'_, PyAny>) -> PyResult<CacheConfig> {
    if let Ok(path) = obj.extract::<PathBuf>()
        && !obj.is_instance_of::<PyDict>()
    {
        return CacheConfig::from_file(&path).map_err(errors::to_py);
    }
    let value = json::from_py(obj)?;
    serde_json::from_value(value).map_err(|e| errors::invalid(format!("cache config: {e}")))
}

/// A cache opened from a config by `cachex.open`: values by key
/// (`get_batch`, `put_batch`) or by index (`get_indices`), whatever the
/// backend serves.
#[pyclass(module = "cachex._cachex", name = "Cache", frozen)]
pub struct PyCache {
    /// In a forked child the cache is reopened read-only on first use
    /// (the parent's backend may hold locks a parent thread took).
    handle: Handle<dyn CacheBackend>,
    config: CacheConfig,
    /// Set once the handle reopened in a forked child: writes are refused
    /// there (the writer, its buffers and lock are the parent's).
    in_child: AtomicBool,
}

impl PyCache {
    fn backend(&self, py: Python<'_>) -> PyResult<Shared> {
        self.handle.get(py, |py, _inherited| {
            self.in_child.store(true, Ordering::Release);
            let config = self.config.clone().read_only(true);
            let reader = errors::enter(py, || cache_facade::open(&config))?;
            Ok(Arc::from(reader))
        })
    }

    /// The backend, for calls that write: refused in a forked child.
    fn writer(&self) -> PyResult<Shared> {
        if self.in_child.load(Ordering::Acquire) {
            return Err(errors::forked_writer(self.handle.path()));
        }
        self.handle.get_writer()
    }
}

#[pymethods]
impl PyCache {
    /// The cache directory (`root/<name>/<key>`).
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The config, as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v: Json = serde_json::to_value(&self.config)
            .map_err(|e| errors::raise(Kind::Other, e.to_string()))?;
        json::to_py(py, &v)
    }

    /// The values of `keys` and the positions of the missing ones:
    /// `(values, missing)`, `None` in `values` where missing.
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let b = self.backend(py)?;
        let (values, missing) = errors::enter(py, || {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            b.get_batch(&refs)
        })?;
        Ok((convert::values_to_py(py, values)?, missing))
    }

    /// Values by index (negative counts from the end), for backends that
    /// serve indices (memmap-array, shard-store, page-alloc).
    fn get_indices<'py>(&self, py: Python<'py>, indices: Vec<i64>) -> PyResult<Bound<'py, PyList>> {
        let b = self.backend(py)?;
        let values = errors::enter(py, || b.get_indices(&indices))?;
        convert::values_to_py(py, values.into_iter().map(Some).collect())
    }

    /// The backend's name (`"segment-store"`, ...).
    #[getter(backend)]
    fn backend_name(&self) -> &'static str {
        self.config.backend.name()
    }

    /// Puts `items` (a dict, or an iterable of `(key, value)` pairs), for
    /// backends filled by puts (segment-store).
    fn put_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let pairs = match items.cast::<PyDict>() {
            Ok(d) => d.items().into_any(),
            Err(_) => items.clone(),
        };
        let mut batch: Vec<(String, Value)> = Vec::new();
        for pair in pairs.try_iter()? {
            let (k, v): (String, Bound<'_, PyAny>) = pair?.extract()?;
            batch.push((k, convert::value_from_py(&v)?));
        }
        let b = self.writer()?;
        errors::enter(py, || b.put_batch(batch))
    }

    /// Persists what was put (on a URL root, then publishes it).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let b = self.writer()?;
        errors::enter(py, || b.flush())
    }

    /// Reopens the cache from its config, so that it sees what other
    /// writers published (on a URL root) or flushed since. A writer
    /// flushes first, and its old handle is closed before the new one
    /// opens (a `CachedFn` over it keeps the old one: use its own
    /// `refresh()`). In a forked child the cache reopens read-only.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let current = self.backend(py)?;
        let config = &self.config;
        if self.in_child.load(Ordering::Acquire) {
            drop(current);
            let reader = errors::enter(py, || cache_facade::open(&config.clone().read_only(true)))?;
            self.handle.replace(py, Arc::from(reader));
            return Ok(());
        }
        drop(current);
        if let Some(old) = self.handle.close() {
            errors::enter(py, move || {
                let flushed = if old.supports(cache_facade::Operation::Put) {
                    old.flush()
                } else {
                    Ok(())
                };
                drop(old);
                flushed
            })?;
        }
        let fresh = errors::enter(py, || cache_facade::open(config))?;
        self.handle.replace(py, Arc::from(fresh));
        Ok(())
    }

    /// The number of values.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let b = self.backend(py)?;
        let n = errors::enter(py, || b.len())?;
        usize::try_from(n)
            .map_err(|_| errors::invalid(format!("{n} entries do not fit a Python length")))
    }

    /// Counters: hits, misses, bytes read and written, flushes, hit rate.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.backend(py)?.stats();
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
///
/// A `root` may be a URL (`s3://bucket/prefix`, ...): the cache is read
/// through the local tier at `tier_dir` within `tier_budget` (bytes, or
/// a size such as `"20G"`), with `storage_options` for the object store
/// (credentials stay in the environment); `flush()` publishes. The
/// keywords override the config's `"remote"` entry.
#[pyfunction]
#[pyo3(signature = (config, *, tier_dir=None, tier_budget=None, storage_options=None))]
pub fn open(
    py: Python<'_>,
    config: &Bound<'_, PyAny>,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<PyCache> {
    let mut config = config_arg(config)?;
    if tier_dir.is_some() || tier_budget.is_some() || storage_options.is_some() {
        let tier = TierArgs::new(tier_dir, tier_budget, storage_options)?;
        let base = config.remote.clone().unwrap_or_default();
        config.remote = Some(tier.options().clone().over(&base));
    }
    let backend = errors::enter(py, || cache_facade::open(&config))?;
    let backend: Shared = Arc::from(backend);
    Ok(PyCache {
        handle: Handle::new(py, backend.path().to_path_buf(), backend),
        config,
        in_child: AtomicBool::new(false),
    })
}

type ComputeFn = Box<dyn Fn(&[&Py<PyAny>]) -> Result<Vec<Value>, PyErr> + Send + Sync>;

/// The native half of `cachex.CachedFn`: looks ids up, calls the Python
/// batch function once for the misses, stores and returns every output.
#[pyclass(module = "cachex._cachex", name = "_CachedFn", frozen)]
pub struct PyCachedFn {
    /// Calls store what they compute, so a forked child refuses them and
    /// leaks the inherited state (the parent's backend) on drop.
    handle: Handle<cache_facade::CachedFn<Shared, ComputeFn>>,
}

#[pymethods]
impl PyCachedFn {
    /// Wraps `func` (a batch function: a list of inputs to a list of
    /// outputs) over `cache`.
    #[new]
    fn new(py: Python<'_>, cache: &Bound<'_, PyCache>, func: Py<PyAny>) -> PyResult<Self> {
        let compute: ComputeFn = Box::new(move |inputs: &[&Py<PyAny>]| {
            Python::attach(|py| {
                let batch = PyList::new(py, inputs.iter().map(|i| i.bind(py)))?;
                let outputs = func.bind(py).call1((batch,))?;
                outputs
                    .try_iter()?
                    .map(|o| convert::value_from_py(&o?))
                    .collect::<PyResult<Vec<Value>>>()
            })
        });
        let backend = cache.get().writer()?;
        let path = backend.path().to_path_buf();
        let inner = cache_facade::CachedFn::new(backend, compute).map_err(errors::to_py)?;
        Ok(PyCachedFn {
            handle: Handle::new(py, path, Arc::new(inner)),
        })
    }

    /// The outputs for `inputs` (`ids` name them in the cache): cached ones
    /// read, the rest computed in one call and stored.
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Py<PyAny>>,
        ids: Vec<String>,
    ) -> PyResult<Bound<'py, PyList>> {
        let inner = self.handle.get_writer()?;
        let outputs = errors::enter(py, || inner.call(&inputs, &ids))?;
        convert::values_to_py(py, outputs.into_iter().map(Some).collect())
    }

    /// Counters: calls, hits, computed, deduplicated, compute calls.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.handle.get_writer()?.stats();
        let d = PyDict::new(py);
        d.set_item("calls", s.calls)?;
        d.set_item("hits", s.hits)?;
        d.set_item("computed", s.computed)?;
        d.set_item("deduplicated", s.deduplicated)?;
        d.set_item("compute_calls", s.compute_calls)?;
        Ok(d)
    }

    /// Persists what was computed.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.handle.get_writer()?;
        errors::enter(py, || inner.flush())
    }
}
