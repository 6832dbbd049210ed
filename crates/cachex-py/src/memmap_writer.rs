//! `cachex.MemmapWriter`: the streaming, resumable writer of a
//! memmap-array cache.

use std::path::PathBuf;
use std::sync::Arc;

use memmap_array::{NewRow, RowWriter, WriterOptions};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use remote_cache::{CacheDir, StoreKind};
use tensor_core::Tensor;

use crate::errors::{self, Kind};
use crate::handle::Handle;
use crate::memmap_schema::{schema_arg, schema_to_py};
use crate::root::{Root, TierArgs};
use crate::{array, json};

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
///
/// On a URL the cache is written in a working directory of the writer's
/// own over the machine's local tier (a resume on the same machine finds
/// the rows committed there) and published whole by `finalize()`.
#[pyclass(module = "cachex._cachex", name = "MemmapWriter", frozen)]
pub struct PyMemmapWriter {
    /// The URL shown without credentials (`None` for a local directory).
    url: Option<String>,
    /// The working directory of a URL's writer, published by `finalize()`.
    remote: Option<CacheDir>,
    /// A forked child refuses every call and leaks the parent's writer.
    handle: Handle<Mutex<WriterSlot>>,
}

impl PyMemmapWriter {
    /// A writer lent by `memmap_open_or_build` to its build callback,
    /// until [`PyMemmapWriter::take_back`].
    pub(crate) fn lent(py: Python<'_>, dir: PathBuf, writer: *mut RowWriter) -> PyMemmapWriter {
        let slot = Mutex::new(WriterSlot::Lent(LentWriter(writer)));
        PyMemmapWriter {
            url: None,
            remote: None,
            handle: Handle::new(py, dir, Arc::new(slot)),
        }
    }

    /// Ends the lending of [`PyMemmapWriter::lent`]: the writer is closed
    /// for Python from now on.
    pub(crate) fn take_back(&self) {
        if let Some(slot) = self.handle.peek() {
            *slot.lock() = WriterSlot::Closed;
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut RowWriter) -> PyResult<R>) -> PyResult<R> {
        let slot = self.handle.get_writer()?;
        let mut slot = slot.lock();
        match &mut *slot {
            WriterSlot::Owned(w) => f(w),
            // SAFETY: see `LentWriter`: the lender is blocked in the
            // callback while the slot is `Lent`, and we hold the mutex.
            WriterSlot::Lent(p) => f(unsafe { &mut *p.0 }),
            WriterSlot::Closed => Err(errors::raise(
                Kind::Other,
                format!(
                    "{}: writer is finalized or closed",
                    self.handle.path().display()
                ),
            )),
        }
    }
}

#[pymethods]
impl PyMemmapWriter {
    /// Creates the cache in `path` with arrays `{name: (dtype, shape)}` (the
    /// `nullable` ones may be `None` in a row, `sidecars` are per-row strings
    /// stored deduplicated), or resumes the one there with the same schema
    /// and `fingerprint`; rows are committed every `sync_every` rows.
    ///
    /// `path` may be a URL (`s3://bucket/prefix`, ...) with the tier
    /// keywords of `MemmapArray`: `finalize()` then publishes the cache.
    #[new]
    #[pyo3(signature = (path, arrays, *, nullable=Vec::new(), sidecars=Vec::new(), fingerprint=None, sync_every=WriterOptions::DEFAULT_SYNC_EVERY, tier_dir=None, tier_budget=None, storage_options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        arrays: &Bound<'_, PyDict>,
        nullable: Vec<String>,
        sidecars: Vec<String>,
        fingerprint: Option<&Bound<'_, PyAny>>,
        sync_every: usize,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
        let location = root.location();
        let opened = errors::enter(py, || location.open_dir(StoreKind::MemmapArray))?;
        let path = opened.path().to_path_buf();
        let remote = opened.is_remote().then_some(opened);
        let schema = schema_arg(arrays, &nullable, &sidecars)?;
        let fp = match fingerprint {
            Some(f) => json::from_py(f)?,
            None => serde_json::Value::Null,
        };
        let opts = WriterOptions { sync_every };
        let w = errors::enter(py, || {
            RowWriter::create_or_resume_with(&path, &schema, &fp, opts)
        })?;
        let slot = Mutex::new(WriterSlot::Owned(Box::new(w)));
        Ok(PyMemmapWriter {
            url: root.shown_url(),
            remote,
            handle: Handle::new(py, path, Arc::new(slot)),
        })
    }

    /// The directory written: the cache directory, or for a URL the
    /// writer's working directory over the local tier.
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL written, without credentials (`None` for a local directory).
    #[getter]
    fn url(&self) -> Option<String> {
        self.url.clone()
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

    /// Writes one row: `source` (its id), `arrays` `{name: array or None}`,
    /// `sidecars` `{name: str}` and `meta` (JSON text or a JSON-able value).
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
            errors::enter(py, || {
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
        })
    }

    /// Commits every row written so far (fsync data, then the manifest;
    /// on a URL locally: a cache is published once finalized).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with(|w| errors::enter(py, || w.flush()))
    }

    /// Writes the index, sidecars and `shapes.json`, marks the cache
    /// complete (on a URL, then publishes it), and returns its row count.
    /// The writer is closed after.
    fn finalize(&self, py: Python<'_>) -> PyResult<u64> {
        let slot = self.handle.get_writer()?;
        let mut slot = slot.lock();
        match std::mem::replace(&mut *slot, WriterSlot::Closed) {
            WriterSlot::Owned(w) => {
                let remote = &self.remote;
                errors::enter(py, || -> remote_cache::Result<u64> {
                    let rows = w.finalize()?;
                    if let Some(dir) = remote {
                        dir.publish()?;
                    }
                    Ok(rows)
                })
            }
            lent @ WriterSlot::Lent(_) => {
                *slot = lent;
                Err(errors::invalid(
                    "open_or_build finalizes the cache itself when the build function returns",
                ))
            }
            WriterSlot::Closed => Err(errors::raise(
                Kind::Other,
                format!(
                    "{}: writer is finalized or closed",
                    self.handle.path().display()
                ),
            )),
        }
    }

    /// `MemmapWriter(path)` (a URL shown without credentials).
    fn __repr__(&self) -> String {
        let shown = match &self.url {
            Some(u) => u.clone(),
            None => self.handle.path().display().to_string(),
        };
        format!("MemmapWriter({shown:?})")
    }
}
