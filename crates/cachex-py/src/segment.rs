//! `cachex.SegmentStore`: the keyed tensor cache of `segment-store`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cache_check::Problem;
use parking_lot::RwLock;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyMapping, PyString, PyTuple};
use segment_store::{Blob, Options, Part, Record, SegmentStore, TensorBuf};

use crate::array::{self, Keeper};
use crate::errors;
use crate::fork::ForkMark;

mod stack;

/// A segment store handle; `close()` (or leaving a `with` block) flushes
/// and releases the writer lock.
#[pyclass(module = "cachex._cachex", name = "SegmentStore", frozen)]
pub struct PySegmentStore {
    path: PathBuf,
    opts: Options,
    /// Locked only with the GIL held, and only to clone or swap the `Arc`,
    /// never across a call that releases the GIL: a fork (made by a thread
    /// that holds the GIL) can never find it locked by a thread that does
    /// not exist in the child.
    store: RwLock<Option<Arc<SegmentStore>>>,
    /// Set in a forked child (a DataLoader worker) by the fork hook. The
    /// child must neither flush the parent's pending records nor wait on
    /// the parent's background writer thread, which does not exist in the
    /// child: there the inherited store is leaked untouched and the
    /// directory reopened read-only on first use.
    fork: ForkMark,
    /// Set when this handle was the writer in the parent and reopened
    /// read-only in a forked child: writes raise `ForkedWriterError`.
    forked_writer: AtomicBool,
}

impl PySegmentStore {
    fn with<R>(&self, f: impl FnOnce(&SegmentStore) -> PyResult<R>) -> PyResult<R> {
        if self.fork.forked() {
            self.reopen_after_fork()?;
        }
        let store = self.store.read().clone();
        match store {
            Some(s) => f(&s),
            None => Err(errors::raise(
                errors::Kind::Other,
                format!("{}: store is closed", self.path.display()),
            )),
        }
    }
}

impl PySegmentStore {
    /// As `with`, for the calls that write: refused in a forked child of
    /// the writer.
    fn with_writer<R>(&self, f: impl FnOnce(&SegmentStore) -> PyResult<R>) -> PyResult<R> {
        self.with(|s| {
            if self.forked_writer.load(Ordering::Acquire) {
                return Err(errors::forked_writer(&self.path));
            }
            f(s)
        })
    }

    fn reopen_after_fork(&self) -> PyResult<()> {
        let mut guard = self.store.write();
        if !self.fork.forked() {
            return Ok(()); // another thread of this child got here first
        }
        if let Some(inherited) = guard.take() {
            self.forked_writer
                .store(inherited.is_writer(), Ordering::Release);
            // Dropping it would flush the parent's records from here.
            std::mem::forget(inherited);
        }
        let opts = Options {
            read_only: true,
            async_write: false,
            ..self.opts.clone()
        };
        *guard = Some(Arc::new(
            SegmentStore::open(&self.path, opts).map_err(errors::segment)?,
        ));
        self.fork.reopened();
        Ok(())
    }
}

impl Drop for PySegmentStore {
    fn drop(&mut self) {
        if self.fork.forked()
            && let Some(inherited) = self.store.get_mut().take()
        {
            std::mem::forget(inherited);
        }
    }
}

#[pymethods]
impl PySegmentStore {
    #[new]
    #[pyo3(signature = (path, flush_every=None, lru_bytes=None, async_write=None, queue_depth=None, writer_rank=None, current_rank=None, read_only=None, writer_id=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        flush_every: Option<usize>,
        lru_bytes: Option<usize>,
        async_write: Option<bool>,
        queue_depth: Option<usize>,
        writer_rank: Option<u32>,
        current_rank: Option<u32>,
        read_only: Option<bool>,
        writer_id: Option<u32>,
    ) -> PyResult<Self> {
        let d = Options::default();
        let opts = Options {
            flush_every: flush_every.unwrap_or(d.flush_every),
            lru_bytes: lru_bytes.unwrap_or(d.lru_bytes),
            async_write: async_write.unwrap_or(d.async_write),
            queue_depth: queue_depth.unwrap_or(d.queue_depth),
            writer_rank: writer_rank.unwrap_or(d.writer_rank),
            current_rank: current_rank.unwrap_or(d.current_rank),
            read_only: read_only.unwrap_or(d.read_only),
            writer_id: writer_id.or(d.writer_id),
        };
        let o = opts.clone();
        let store = py
            .detach(|| SegmentStore::open(&path, o))
            .map_err(errors::segment)?;
        Ok(PySegmentStore {
            path,
            opts,
            store: RwLock::new(Some(Arc::new(store))),
            fork: ForkMark::new(py),
            forked_writer: AtomicBool::new(false),
        })
    }

    /// The cache directory.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// The options the store was opened with, as keyword arguments.
    #[getter]
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = &self.opts;
        let d = PyDict::new(py);
        d.set_item("flush_every", o.flush_every)?;
        d.set_item("lru_bytes", o.lru_bytes)?;
        d.set_item("async_write", o.async_write)?;
        d.set_item("queue_depth", o.queue_depth)?;
        d.set_item("writer_rank", o.writer_rank)?;
        d.set_item("current_rank", o.current_rank)?;
        d.set_item("read_only", o.read_only)?;
        d.set_item("writer_id", o.writer_id)?;
        Ok(d)
    }

    /// Whether this handle persists puts.
    #[getter]
    fn is_writer(&self) -> PyResult<bool> {
        self.with(|s| Ok(s.is_writer()))
    }

    fn put_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let pairs = if let Ok(m) = items.cast::<PyMapping>() {
            m.items()?.into_any()
        } else {
            items.clone()
        };
        let mut batch: Vec<(String, Record)> = Vec::new();
        for pair in pairs.try_iter()? {
            let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair?.extract()?;
            let key: String = key.extract().map_err(|_| {
                errors::invalid(format!("keys must be str, not {}", key.get_type()))
            })?;
            let record = record_from_py(&value).map_err(|e| {
                errors::invalid(format!("value of key {key:?}: {}", message(py, &e)))
            })?;
            batch.push((key, record));
        }
        self.with_writer(|s| py.detach(|| s.put_batch(&batch)).map_err(errors::segment))
    }

    #[pyo3(signature = (keys, copy=false))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        copy: bool,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let keys = borrowed_keys(keys)?;
        let keys = key_strs(&keys)?;
        let (records, missing) =
            self.with(|s| py.detach(|| s.get_batch(&keys)).map_err(errors::segment))?;
        let out = if copy {
            records_to_owned_py(py, &records)?
        } else {
            records_to_py(py, records)?
        };
        Ok((out, missing))
    }

    /// The batch as one array per tensor part (rows in key order, missing
    /// rows zero) and a list per blob part: one copy, made with the GIL
    /// released, and no Python object per record.
    fn get_stacked<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let keys = borrowed_keys(keys)?;
        let keys = key_strs(&keys)?;
        let (records, missing) =
            self.with(|s| py.detach(|| s.get_batch(&keys)).map_err(errors::segment))?;
        Ok((stack::stacked_to_py(py, &self.path, &records)?, missing))
    }

    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let (mut records, _) = self.with(|s| {
            py.detach(|| s.get_batch(std::slice::from_ref(&key)))
                .map_err(errors::segment)
        })?;
        match records.pop().flatten() {
            Some(r) => record_to_py(py, r),
            None => Ok(py.None().into_bound(py)),
        }
    }

    fn __contains__(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        let (_, missing) = self.with(|s| {
            py.detach(|| s.get_batch(std::slice::from_ref(&key)))
                .map_err(errors::segment)
        })?;
        Ok(missing.is_empty())
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.with_writer(|s| py.detach(|| s.flush()).map_err(errors::segment))
    }

    fn __len__(&self) -> PyResult<usize> {
        self.with(|s| Ok(s.len()))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.with(|s| Ok(s.stats()))?;
        let d = PyDict::new(py);
        d.set_item("entries", st.entries)?;
        d.set_item("segments", st.segments)?;
        d.set_item("pending", st.pending)?;
        d.set_item("lru_entries", st.lru_entries)?;
        d.set_item("lru_bytes", st.lru_bytes)?;
        d.set_item("lru_hits", st.lru_hits)?;
        d.set_item("pending_hits", st.pending_hits)?;
        d.set_item("segment_hits", st.segment_hits)?;
        d.set_item("misses", st.misses)?;
        d.set_item("index_bytes", st.index_bytes)?;
        d.set_item("index_bytes_per_entry", st.index_bytes_per_entry)?;
        Ok(d)
    }

    fn compact<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.with_writer(|s| py.detach(|| s.compact()).map_err(errors::segment))?;
        let d = PyDict::new(py);
        d.set_item("segments_before", r.segments_before)?;
        d.set_item("segments_after", r.segments_after)?;
        d.set_item("live_rows", r.live_rows)?;
        d.set_item("dropped_rows", r.dropped_rows)?;
        Ok(d)
    }

    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let problems = self.with(|s| Ok(py.detach(|| s.verify())))?;
        problems_to_py(py, &problems)
    }

    fn problems<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let problems = self.with(|s| Ok(s.problems()))?;
        problems_to_py(py, &problems)
    }

    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let i = self.with(|s| Ok(py.detach(|| s.inspect())))?;
        let d = PyDict::new(py);
        d.set_item("dir", &i.dir)?;
        d.set_item("structure", i.structure.map(|s| s.name()))?;
        d.set_item("schema_json", i.schema_json)?;
        d.set_item("entries", i.entries)?;
        d.set_item("disk_bytes", i.disk_bytes)?;
        d.set_item("index_bytes_per_entry", i.index_bytes_per_entry)?;
        let segs = PyList::empty(py);
        for s in &i.segments {
            let sd = PyDict::new(py);
            sd.set_item("id", s.id)?;
            sd.set_item("bytes", s.bytes)?;
            sd.set_item("rows", s.rows)?;
            sd.set_item("live_rows", s.live_rows)?;
            segs.append(sd)?;
        }
        d.set_item("segments", segs)?;
        Ok(d)
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.store.write().take();
        if self.fork.forked() {
            std::mem::forget(store);
            return Ok(());
        }
        match store {
            Some(s) => py.detach(|| {
                let flushed = if s.is_writer() { s.flush() } else { Ok(()) };
                drop(s);
                flushed.map_err(errors::segment)
            }),
            None => Ok(()),
        }
    }

    #[getter]
    fn closed(&self) -> bool {
        self.store.read().is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// Pickles as the path and options; the copy reopens the directory.
    /// A writer's copy opens read-only: the writer lock stays with the
    /// process that took it (a DataLoader worker reads).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let o = &this.opts;
        let args = (
            this.path.clone(),
            o.flush_every,
            o.lru_bytes,
            o.async_write,
            o.queue_depth,
            o.writer_rank,
            o.current_rank,
            true,
        )
            .into_pyobject(py)?;
        Ok((slf.get_type().into_any(), args))
    }

    fn __repr__(&self) -> String {
        format!(
            "SegmentStore({:?}, read_only={})",
            self.path.display().to_string(),
            self.opts.read_only
        )
    }
}

/// The `str` objects of a key sequence (any iterable of `str`), kept
/// alive so their UTF-8 can be borrowed without a copy per key.
fn borrowed_keys<'py>(keys: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyString>>> {
    let type_error =
        |k: &Bound<'py, PyAny>| errors::invalid(format!("keys must be str, not {}", k.get_type()));
    if let Ok(list) = keys.cast::<PyList>() {
        return list
            .iter()
            .map(|k| {
                k.cast_into::<PyString>()
                    .map_err(|e| type_error(e.into_inner().as_any()))
            })
            .collect();
    }
    if keys.is_instance_of::<PyString>() {
        return Err(errors::invalid(
            "keys must be a sequence of str, not one str",
        ));
    }
    keys.try_iter()?
        .map(|k| {
            let k = k?;
            k.cast_into::<PyString>()
                .map_err(|e| type_error(e.into_inner().as_any()))
        })
        .collect()
}

/// Borrowed UTF-8 of each key (valid while `keys` lives; `str` is immutable).
fn key_strs<'a>(keys: &'a [Bound<'_, PyString>]) -> PyResult<Vec<&'a str>> {
    keys.iter().map(|k| k.to_str()).collect()
}

fn message(py: Python<'_>, e: &PyErr) -> String {
    e.value(py)
        .str()
        .map_or_else(|_| "?".into(), |s| s.to_string())
}

fn problems_to_py<'py>(py: Python<'py>, problems: &[Problem]) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for p in problems {
        let d = PyDict::new(py);
        d.set_item("path", &p.path)?;
        d.set_item("kind", format!("{:?}", p.kind))?;
        d.set_item("detail", &p.detail)?;
        out.append(d)?;
    }
    Ok(out)
}

fn blob_of(obj: &Bound<'_, PyAny>) -> Option<Blob> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Some(Blob::from(b.as_bytes()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Some(Blob::from(b.to_vec()));
    }
    None
}

fn tensor_of(obj: &Bound<'_, PyAny>) -> PyResult<TensorBuf> {
    let a = array::contiguous(obj)?;
    array::with_tensor(&a, |v| TensorBuf::from(&v))
}

fn part_of(obj: &Bound<'_, PyAny>) -> PyResult<Part> {
    match blob_of(obj) {
        Some(b) => Ok(Part::Blob(b)),
        None => Ok(Part::Tensor(tensor_of(obj)?)),
    }
}

/// A record from a Python value: `bytes` → blob, dict → named parts,
/// tuple/list → parts, anything array-like → one tensor.
pub(crate) fn record_from_py(value: &Bound<'_, PyAny>) -> PyResult<Record> {
    if let Some(b) = blob_of(value) {
        return Ok(Record::Blob(b));
    }
    if let Ok(d) = value.cast::<PyDict>() {
        let mut parts = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let name: String = k
                .cast::<PyString>()
                .map_err(|_| errors::invalid("dict record keys must be str"))?
                .to_str()?
                .to_owned();
            parts.push((Arc::<str>::from(name), part_of(&v)?));
        }
        return Ok(Record::Dict(parts));
    }
    if let Ok(t) = value.cast::<PyTuple>() {
        return Ok(Record::Tuple(
            t.iter().map(|v| part_of(&v)).collect::<PyResult<_>>()?,
        ));
    }
    if let Ok(l) = value.cast::<PyList>() {
        return Ok(Record::List(
            l.iter().map(|v| part_of(&v)).collect::<PyResult<_>>()?,
        ));
    }
    Ok(Record::Tensor(tensor_of(value)?))
}

fn tensor_to_py<'py>(
    py: Python<'py>,
    t: &TensorBuf,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `t`'s bytes belong to a record `owner` holds (one record or
    // the batch it came in; each part's `SharedBytes` shares ownership of
    // its heap buffer or mapped segment), never mutated, and freed only
    // when the last reference goes.
    unsafe { array::view(py, t.dtype(), t.shape().dims(), t.bytes(), owner) }
}

fn part_to_py<'py>(
    py: Python<'py>,
    p: &Part,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    match p {
        Part::Tensor(t) => tensor_to_py(py, t, owner),
        Part::Blob(b) => Ok(PyBytes::new(py, b.as_slice()).into_any()),
        // A record read from a store is one level deep.
        other => record_view(py, other, owner),
    }
}

/// The records of one batch (`None` for a missing key) as a list of
/// values. One `MappedValue` holds the whole batch and is the base of every
/// array in it (one Python object per batch, not per record): an array
/// keeps its batch's records alive.
pub(crate) fn records_to_py(
    py: Python<'_>,
    records: Vec<Option<Record>>,
) -> PyResult<Bound<'_, PyList>> {
    let records = Arc::new(records);
    let owner = Keeper::wrap(py, records.clone())?;
    let out = PyList::empty(py);
    for r in records.iter() {
        match r {
            Some(r) => out.append(record_view(py, r, &owner)?)?,
            None => out.append(py.None())?,
        }
    }
    Ok(out)
}

/// The records of one batch as values whose arrays are writable copies
/// that own their memory (`get_batch(copy=True)`).
fn records_to_owned_py<'py>(
    py: Python<'py>,
    records: &[Option<Record>],
) -> PyResult<Bound<'py, PyList>> {
    let mut out = Vec::with_capacity(records.len());
    for r in records {
        out.push(match r {
            None => py.None().into_bound(py),
            Some(v) => owned_value_to_py(py, v)?,
        });
    }
    PyList::new(py, out)
}

/// One value as Python objects that own their bytes: writable arrays,
/// `bytes`, and dicts, tuples and lists of them.
fn owned_value_to_py<'py>(py: Python<'py>, v: &Record) -> PyResult<Bound<'py, PyAny>> {
    let all = |parts: &[Part]| -> PyResult<Vec<Bound<'py, PyAny>>> {
        parts.iter().map(|p| owned_value_to_py(py, p)).collect()
    };
    Ok(match v {
        Record::Tensor(t) => stack::owned_copy(py, t)?,
        Record::Blob(b) => PyBytes::new(py, b.as_slice()).into_any(),
        Record::Dict(parts) => {
            let d = PyDict::new(py);
            for (name, p) in parts {
                d.set_item(&**name, owned_value_to_py(py, p)?)?;
            }
            d.into_any()
        }
        Record::Tuple(parts) => PyTuple::new(py, all(parts)?)?.into_any(),
        Record::List(parts) => PyList::new(py, all(parts)?)?.into_any(),
    })
}

/// A record as numpy views (whose base keeps the record alive), `bytes`,
/// dicts, tuples and lists.
pub(crate) fn record_to_py(py: Python<'_>, record: Record) -> PyResult<Bound<'_, PyAny>> {
    let owner = Keeper::wrap(py, record.clone())?;
    record_view(py, &record, &owner)
}

/// A record as Python values whose arrays view the record's buffers;
/// `owner` must keep those buffers alive (it holds the record or a clone).
fn record_view<'py>(
    py: Python<'py>,
    record: &Record,
    owner: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    Ok(match record {
        Record::Tensor(t) => tensor_to_py(py, t, owner)?,
        Record::Dict(parts) => {
            let d = PyDict::new(py);
            for (name, p) in parts {
                d.set_item(&**name, part_to_py(py, p, owner)?)?;
            }
            d.into_any()
        }
        Record::Tuple(parts) => {
            let items = parts
                .iter()
                .map(|p| part_to_py(py, p, owner))
                .collect::<PyResult<Vec<_>>>()?;
            PyTuple::new(py, items)?.into_any()
        }
        Record::List(parts) => {
            let items = parts
                .iter()
                .map(|p| part_to_py(py, p, owner))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Record::Blob(b) => PyBytes::new(py, b.as_slice()).into_any(),
    })
}
