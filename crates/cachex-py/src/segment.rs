//! `cachex.SegmentStore`: the keyed tensor cache of `segment-store`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use cache_facade::StoreKind;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyMapping, PyString, PyTuple};
use remote_cache::SegmentsAt;

use crate::plan_handle::PyPlanHandle;
use crate::prefetch::PyPrefetch;
use segment_store::Options;
use tensor_core::Value;

use crate::handle::Handle;
use crate::root::{Root, TierArgs};
use crate::{check, convert, errors};

mod stack;

/// A keyed cache of tensors and blobs on disk (segment-store): values are
/// put in batches, flushed into immutable segments, and read back as
/// read-only numpy views of the mapped segments. `close()` (or leaving a
/// `with` block) flushes and releases the writer lock.
///
/// On a URL the store opens a working directory of its own over the
/// machine's local tier (remote-cache's `SegmentsAt`): the writer
/// publishes on `flush()`/`close()`, and on its own every few seconds (the
/// segments it flushed; `CACHEX_PUBLISH_INTERVAL`), when dropped and at
/// the interpreter's exit; a reader sees what was published since it
/// opened after `refresh()`.
#[pyclass(module = "cachex._cachex", name = "SegmentStore", frozen)]
pub struct PySegmentStore {
    opts: Options,
    root: Root,
    /// In a forked child (a DataLoader worker) the directory is reopened
    /// read-only on first use: the child must neither flush the parent's
    /// pending records nor wait on the parent's background writer thread.
    handle: Handle<SegmentsAt>,
    /// Set when this handle was the writer in the parent and reopened
    /// read-only in a forked child: writes raise `ForkedWriterError`.
    forked_writer: AtomicBool,
}

impl PySegmentStore {
    fn store(&self, py: Python<'_>) -> PyResult<Arc<SegmentsAt>> {
        self.handle
            .get(py, |py, inherited| self.reopen(py, inherited))
    }

    /// The store, for the calls that write: refused in a forked child of
    /// the writer.
    fn writer(&self, py: Python<'_>) -> PyResult<Arc<SegmentsAt>> {
        let store = self.store(py)?;
        if self.forked_writer.load(Ordering::Acquire) {
            return Err(errors::forked_writer(self.handle.path()));
        }
        Ok(store)
    }

    /// In a forked child: a read-only opening through the same road (for
    /// a URL, a working directory of the child's own over the same tier;
    /// the parent's, locked, is skipped without waiting). The child never
    /// publishes.
    fn reopen(&self, py: Python<'_>, inherited: &SegmentsAt) -> PyResult<Arc<SegmentsAt>> {
        self.forked_writer
            .store(inherited.is_writer(), Ordering::Release);
        let opts = Options {
            read_only: true,
            async_write: false,
            ..self.opts.clone()
        };
        let location = self.root.location();
        Ok(Arc::new(errors::enter(py, || {
            SegmentsAt::open(location, opts)
        })?))
    }

    fn lookup(&self, py: Python<'_>, keys: &[&str]) -> PyResult<(Vec<Option<Value>>, Vec<usize>)> {
        let store = self.store(py)?;
        errors::enter(py, || store.get_batch(keys))
    }
}

#[pymethods]
impl PySegmentStore {
    /// Opens (creating, for the writer) the cache directory `path`.
    ///
    /// `flush_every` records go in one segment; `lru_bytes` of decoded
    /// values are kept in memory; with `async_write` segments are written by
    /// a background thread (`queue_depth` batches ahead). Under several
    /// ranks only `writer_rank` persists (the current rank comes from
    /// `RANK`, or `current_rank`); `writer_id` makes this a multi-writer;
    /// `read_only` never writes.
    ///
    /// `path` may be a URL (`s3://bucket/prefix`, `gs://`, `az://`,
    /// `file://`), read through the local tier at `tier_dir` (default
    /// `CACHEX_TIER_DIR`) within `tier_budget` bytes (an int, or a size
    /// such as `"20G"`), with `storage_options` for the object store
    /// (`aws_endpoint`, `aws_allow_http`, ...; credentials stay in the
    /// environment).
    #[new]
    #[pyo3(signature = (path, flush_every=None, lru_bytes=None, async_write=None, queue_depth=None, writer_rank=None, current_rank=None, read_only=None, writer_id=None, *, tier_dir=None, tier_budget=None, storage_options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        flush_every: Option<usize>,
        lru_bytes: Option<usize>,
        async_write: Option<bool>,
        queue_depth: Option<usize>,
        writer_rank: Option<u32>,
        current_rank: Option<u32>,
        read_only: Option<bool>,
        writer_id: Option<u32>,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
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
            ..d
        };
        let o = opts.clone();
        let location = root.location();
        let store = errors::enter(py, || SegmentsAt::open(location, o))?;
        let dir = local_dir(&store, &root);
        Ok(PySegmentStore {
            opts,
            root,
            handle: Handle::new(py, dir, Arc::new(store)),
            forked_writer: AtomicBool::new(false),
        })
    }

    /// The directory the store reads and writes: the cache directory, or
    /// for a URL the working directory over the local tier.
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<PathBuf> {
        if self.handle.is_closed() {
            return Ok(self.handle.path().to_path_buf());
        }
        let store = self.store(py)?;
        Ok(local_dir(&store, &self.root))
    }

    /// The URL the store was opened on, without credentials (`None` for a
    /// local directory).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
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
    fn is_writer(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.store(py)?.is_writer())
    }

    /// Puts `items` (a mapping, or an iterable of `(key, value)` pairs):
    /// a value is an array-like, `bytes`/`bytearray` (a blob), or a dict,
    /// tuple or list of them. Records are persisted by the next flush.
    fn put_batch(&self, py: Python<'_>, items: &Bound<'_, PyAny>) -> PyResult<()> {
        let pairs = if let Ok(m) = items.cast::<PyMapping>() {
            m.items()?.into_any()
        } else {
            items.clone()
        };
        let mut batch: Vec<(String, Value)> = Vec::new();
        for pair in pairs.try_iter()? {
            let (key, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair?.extract()?;
            let key: String = key.extract().map_err(|_| {
                errors::invalid(format!("keys must be str, not {}", key.get_type()))
            })?;
            let value = convert::value_from_py(&value).map_err(|e| {
                errors::invalid(format!("value of key {key:?}: {}", message(py, &e)))
            })?;
            batch.push((key, value));
        }
        let store = self.writer(py)?;
        errors::enter(py, || store.put_batch(&batch))
    }

    /// The values of `keys` (any iterable of `str`) and the positions of
    /// the missing ones: `(values, missing)`, `None` in `values` where
    /// missing. Arrays are read-only views of the mapped segments, or
    /// writable copies with `copy=True`.
    #[pyo3(signature = (keys, copy=false))]
    fn get_batch<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
        copy: bool,
    ) -> PyResult<(Bound<'py, PyList>, Vec<usize>)> {
        let keys = borrowed_keys(keys)?;
        let keys = key_strs(&keys)?;
        let (values, missing) = self.lookup(py, &keys)?;
        let out = if copy {
            convert::owned_values_to_py(py, &values)?
        } else {
            convert::values_to_py(py, values)?
        };
        Ok((out, missing))
    }

    /// The batch as one array per tensor part (rows in key order, missing
    /// rows zero) and a list per blob part: one copy, made with the GIL
    /// released, and no Python object per record. Returns
    /// `(stacked, missing)`.
    fn get_stacked<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<(Bound<'py, PyAny>, Vec<usize>)> {
        let keys = borrowed_keys(keys)?;
        let keys = key_strs(&keys)?;
        let (values, missing) = self.lookup(py, &keys)?;
        Ok((
            stack::stacked_to_py(py, self.handle.path(), &values)?,
            missing,
        ))
    }

    /// The value of `key` (views of the mapped segment), or `None`.
    fn get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Bound<'py, PyAny>> {
        let (mut values, _) = self.lookup(py, &[key.as_str()])?;
        match values.pop().flatten() {
            Some(v) => convert::value_to_py(py, v),
            None => Ok(py.None().into_bound(py)),
        }
    }

    /// Whether `key` has a value.
    fn __contains__(&self, py: Python<'_>, key: String) -> PyResult<bool> {
        let (_, missing) = self.lookup(py, &[key.as_str()])?;
        Ok(missing.is_empty())
    }

    /// Persists every pending record (a segment and its index entries,
    /// fsynced) and waits for the background writer; on a URL, then
    /// publishes what was written since the last publish (one commit).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.writer(py)?;
        errors::enter(py, || store.publish().map(drop))
    }

    /// Makes what other writers published (or, for a local directory,
    /// flushed) since this handle opened visible to it; returns the number
    /// of commits applied (always 0 for a local directory) and of segments
    /// the store gained: `{"commits", "segments"}`.
    fn refresh<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store(py)?;
        let (report, segments) = errors::enter(py, || store.refresh())?;
        let d = PyDict::new(py);
        d.set_item("commits", report.commits)?;
        d.set_item("segments", segments)?;
        Ok(d)
    }

    /// Starts fetching the segments that hold `keys` into the local tier
    /// in the background, whole and checked, in the order the keys first
    /// need them (the next epoch's), within the tier's budget; returns a
    /// :class:`Prefetch` at once. A read meanwhile of a segment on its way
    /// waits for it; one of a segment not asked for reads its rows by byte
    /// ranges as usual. On a directory (nothing to fetch) the `Prefetch`
    /// returned is already done, every count zero.
    fn prefetch(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<PyPrefetch> {
        let store = self.store(py)?;
        Ok(PyPrefetch::new(py.detach(|| store.prefetch(&keys))))
    }

    /// The id of the segment holding each of `keys`, as an int64 array
    /// (-1 for a key in no segment), from the index alone: no segment is
    /// read, on a URL nothing is fetched. Keys of one segment were written
    /// together; :class:`cachex.torch.SegmentDataset` shuffles them as one
    /// block.
    fn segment_ids<'py>(
        &self,
        py: Python<'py>,
        keys: Vec<String>,
    ) -> PyResult<Bound<'py, numpy::PyArray1<i64>>> {
        let store = self.store(py)?;
        let ids: Vec<i64> = py.detach(|| {
            store
                .segment_ids_of(&keys)
                .into_iter()
                .map(|id| id.map_or(-1, i64::from))
                .collect()
        });
        Ok(numpy::PyArray1::from_vec(py, ids))
    }

    /// Registers this reader's plan in the local tier: the record of
    /// `keys[j]` is read at batch `positions[j]` of this reader's clock
    /// (`0..epoch_len` this epoch, `epoch_len..2*epoch_len` the next;
    /// `positions` an int64 array as long as `keys`). One plan covers
    /// every segment the keys lie in (each segment's layout read once);
    /// the tier then evicts, in every process, the blocks needed furthest
    /// ahead first. Returns a `PlanHandle` to `advance` after each batch
    /// and `close` at the end; `None` on a directory (no tier) or when
    /// the whole store fits the tier's budget (its segments are then
    /// mapped whole: nothing a plan could keep). Keys in no segment are
    /// left out.
    fn set_plan(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        positions: numpy::PyReadonlyArray1<'_, i64>,
        epoch_len: u64,
    ) -> PyResult<Option<PyPlanHandle>> {
        let positions = crate::plan_handle::positions(&positions)?;
        let store = self.store(py)?;
        let handle = errors::enter(py, || store.set_plan(&keys, &positions, epoch_len))?;
        Ok(handle.map(PyPlanHandle::new))
    }

    /// The number of keys with a value.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        let store = self.store(py)?;
        // Through the remote store, whose count of a cold cache may wait
        // for the server: without the GIL.
        Ok(py.detach(|| store.len()))
    }

    /// Every key the index holds with where its row is, `(key, segment id,
    /// row)` by segment and row (pending rows are not listed until a flush).
    fn key_locations(&self, py: Python<'_>) -> PyResult<Vec<(String, u32, u32)>> {
        let store = self.store(py)?;
        errors::enter(py, || store.key_locations())
    }

    /// Counters: entries, segments, pending records, LRU use and hits by
    /// tier, misses, index memory.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.store(py)?.stats();
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

    /// Rewrites the live rows into fresh segments and drops the rest;
    /// returns `{segments_before, segments_after, live_rows, dropped_rows}`.
    fn compact<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.writer(py)?;
        let r = errors::enter(py, || store.compact())?;
        let d = PyDict::new(py);
        d.set_item("segments_before", r.segments_before)?;
        d.set_item("segments_after", r.segments_after)?;
        d.set_item("live_rows", r.live_rows)?;
        d.set_item("dropped_rows", r.dropped_rows)?;
        Ok(d)
    }

    /// Everything wrong with the cache on disk (reads every row), as
    /// `cachex verify --json` prints it: `{"kind": "segment-store",
    /// "path", "problems": [{"path", "kind", "detail"}, ...]}`, `problems`
    /// empty when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store(py)?;
        let problems = py.detach(|| {
            // What `segment_store::verify` (the command line's) reports:
            // what recovery found on open, then what a full read finds.
            let mut all = store.problems();
            all.extend(store.verify());
            all.sort();
            all.dedup();
            all
        });
        check::verify_to_py(py, StoreKind::SegmentStore, self.handle.path(), &problems)
    }

    /// What recovery found when this handle opened the cache, as the
    /// `problems` list of `verify()`.
    fn problems<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        check::problems_to_py(py, &self.store(py)?.problems())
    }

    /// What the cache holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, `structure`, `entries`, `disk_bytes`,
    /// `index_bytes_per_entry`, `schema`, and a `segments` table (one dict
    /// per segment file).
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let store = self.store(py)?;
        let summary = py.detach(|| store.inspect().summary());
        check::summary_to_py(py, &summary)
    }

    /// Flushes (and on a URL publishes: the writer) and closes the
    /// handle; later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        match self.handle.close() {
            Some(s) => errors::enter(py, move || {
                let flushed = if s.is_writer() {
                    s.publish().map(drop)
                } else {
                    Ok(())
                };
                drop(s);
                flushed
            }),
            None => Ok(()),
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// `with SegmentStore(...) as store:` closes the store on exit.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the store (flushing the writer); exceptions propagate.
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

    /// Pickles as the root (path or URL), options and tier keywords; the
    /// copy reopens the cache. A writer's copy opens read-only: the writer
    /// lock stays with the process that took it (a DataLoader worker reads).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let o = &this.opts;
        let kwargs = PyDict::new(py);
        kwargs.set_item("flush_every", o.flush_every)?;
        kwargs.set_item("lru_bytes", o.lru_bytes)?;
        kwargs.set_item("async_write", o.async_write)?;
        kwargs.set_item("queue_depth", o.queue_depth)?;
        kwargs.set_item("writer_rank", o.writer_rank)?;
        kwargs.set_item("current_rank", o.current_rank)?;
        kwargs.set_item("read_only", true)?;
        this.root.tier().to_kwargs(&kwargs)?;
        let args = (this.root.to_py(py)?, kwargs).into_pyobject(py)?;
        Ok((
            py.import("cachex._cachex")?
                .getattr("_reopen_segment_store")?,
            args,
        ))
    }

    /// `SegmentStore(path, read_only=...)` (a URL shown without
    /// credentials).
    fn __repr__(&self) -> String {
        format!(
            "SegmentStore({:?}, read_only={})",
            self.root.shown(),
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

/// Unpickles a `SegmentStore` (see `SegmentStore.__reduce__`).
#[pyfunction]
pub fn _reopen_segment_store<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PySegmentStore>().call((path,), Some(kwargs))
}

/// The directory a store reads: its working directory when remote.
fn local_dir(store: &SegmentsAt, root: &Root) -> PathBuf {
    match (store.remote(), root.location()) {
        (Some(r), _) => r.dir().to_path_buf(),
        (None, remote_cache::Location::Local(p)) => p.clone(),
        (None, remote_cache::Location::Remote(_)) => Path::new(&root.shown()).to_path_buf(),
    }
}
