//! `cachex.ShardStore`: random access over a Python iterator factory in
//! loadit's layout. Items are pickled with Python's own `pickle` (any
//! picklable object, as loadit does); the Rust engine does the shard
//! files, compression, locks, the in-memory shard cache, eviction under
//! the disk budget and regeneration.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyIterator, PyList, PySlice, PyTuple};
use remote_cache::ShardsAt;
use serde_pickle::ErrorCode;
use shard_store::format::ShardName;
use shard_store::{Compression, Options, Preload, ShardLength, ShardStore, StoreItem};

use cache_facade::StoreKind;
use pyo3::types::PyDict;

use crate::errors;
use crate::handle::Handle;
use crate::root::{Root, TierArgs};
use crate::{check, json};

/// One Python object held by the store, shared so that cloning needs no
/// GIL. An item of a decoded shard is the shard's unpickled list and a
/// position in it: one handle per shard rather than an allocation per
/// item, and cloning an item touches the shard's counter, not the item.
#[derive(Clone)]
pub enum PyItem {
    /// An item pulled from the source iterator, held on its own.
    Own(Arc<Py<PyAny>>),
    /// `(list, k)`: item `k` of a shard's unpickled list, which only the
    /// store holds and nothing mutates; `k` is below its length.
    InShard(Arc<Py<PyList>>, usize),
}

impl PyItem {
    /// The item as a new reference.
    fn bind<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            PyItem::Own(o) => Ok(o.bind(py).clone()),
            PyItem::InShard(list, k) => list.bind(py).get_item(*k),
        }
    }
}

static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Python's pickle as the store's codec: a shard is `pickle.dumps(list)`,
/// exactly what loadit writes and reads.
impl StoreItem for PyItem {
    fn encode_shard_items(path: &Path, items: &[PyItem]) -> shard_store::Result<Vec<u8>> {
        Python::attach(|py| -> PyResult<Vec<u8>> {
            let items = items
                .iter()
                .map(|i| i.bind(py))
                .collect::<PyResult<Vec<_>>>()?;
            let list = PyList::new(py, items)?;
            let dumps = DUMPS.import(py, "pickle", "dumps")?;
            Ok(dumps
                .call1((list,))?
                .cast_into::<PyBytes>()?
                .as_bytes()
                .to_vec())
        })
        .map_err(|e| shard_store::Error::Encode {
            path: path.to_path_buf(),
            source: serde_pickle::Error::Syntax(ErrorCode::Structure(e.to_string())),
        })
    }

    fn decode_shard_items(
        path: &Path,
        name: ShardName,
        pickle: &[u8],
    ) -> shard_store::Result<Vec<PyItem>> {
        let corrupt = |reason: String| shard_store::Error::CorruptShard {
            path: path.to_path_buf(),
            reason,
        };
        let items = Python::attach(|py| -> PyResult<Vec<PyItem>> {
            let loads = LOADS.import(py, "pickle", "loads")?;
            let list = loads.call1((PyBytes::new(py, pickle),))?;
            let list = list.cast_into::<PyList>()?;
            let len = list.len();
            let shard = Arc::new(list.unbind());
            Ok((0..len)
                .map(|k| PyItem::InShard(Arc::clone(&shard), k))
                .collect())
        })
        .map_err(|e| corrupt(format!("unpickling failed: {e}")))?;
        if items.len() as u64 != name.len() {
            return Err(corrupt(format!(
                "holds {} items, its name says {}",
                items.len(),
                name.len()
            )));
        }
        Ok(items)
    }
}

/// The first exception a source iterator raised, re-raised by the call
/// that drove it (the store sees the iterator end).
type ErrorSlot = Arc<Mutex<Option<PyErr>>>;

/// Items pulled from the Python iterator per GIL acquisition: taking the
/// GIL once per item dominated a first pass.
const SOURCE_BATCH: usize = 256;

/// A Python iterator as the store's item iterator. Items are pulled
/// `SOURCE_BATCH` at a time under one GIL acquisition; the read-ahead
/// stays in this iterator (the store's cursor), so nothing is lost when a
/// shard ends mid-batch.
struct SourceIter {
    iter: Py<PyIterator>,
    failed: ErrorSlot,
    buf: std::collections::VecDeque<PyItem>,
    ended: bool,
    /// The iterator's exception, reported once the items before it are taken.
    error: Option<PyErr>,
}

impl Iterator for SourceIter {
    type Item = PyItem;
    fn next(&mut self) -> Option<PyItem> {
        if self.buf.is_empty() && !self.ended {
            Python::attach(|py| {
                let mut it = self.iter.bind(py).clone();
                while self.buf.len() < SOURCE_BATCH {
                    match it.next() {
                        Some(Ok(o)) => self.buf.push_back(PyItem::Own(Arc::new(o.unbind()))),
                        Some(Err(e)) => {
                            self.error = Some(e);
                            self.ended = true;
                            break;
                        }
                        None => {
                            self.ended = true;
                            break;
                        }
                    }
                }
            });
        }
        let item = self.buf.pop_front();
        if item.is_none()
            && let Some(e) = self.error.take()
        {
            self.failed.lock().get_or_insert(e);
        }
        item
    }
}

/// Random access to the items of a deterministic iterable, cached on disk
/// in loadit's layout: items are generated by `source()` (a function
/// returning a fresh iterator) shard by shard, on demand or by background
/// workers, and kept in memory and on disk.
#[pyclass(module = "cachex._cachex", name = "ShardStore", frozen)]
pub struct PyShardStore {
    /// In a forked child (a DataLoader worker), which has none of the
    /// parent's worker threads, the inherited store is leaked untouched
    /// (dropping it would wait for them) and the root reopened with the
    /// same source and options on first use.
    handle: Handle<ShardsAt<PyItem>>,
    root: Root,
    /// Set once the store reopened in a forked child: nothing is published
    /// from there (the parent's writer publishes).
    in_child: AtomicBool,
    source: Option<Py<PyAny>>,
    failed: ErrorSlot,
    /// The constructor's keyword arguments, for pickling.
    kwargs: Py<PyAny>,
}

impl PyShardStore {
    /// Runs `f` on the store with the GIL released (the workers pull the
    /// Python iterator with it); an exception the iterator raised meanwhile
    /// is raised in place of the store's answer.
    fn run<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&ShardStore<PyItem>) -> shard_store::Result<R> + Send,
    ) -> PyResult<R> {
        let result = self.handle.enter(
            py,
            |py, _inherited| self.reopen(py),
            |s: &ShardsAt<PyItem>| f(s),
        );
        if let Some(e) = self.failed.lock().take() {
            return Err(e);
        }
        result
    }

    /// A fresh store over the same root, source and options (in a forked
    /// child), built by the constructor: for a URL, in a working
    /// directory of the child's own over the same tier.
    fn reopen(&self, py: Python<'_>) -> PyResult<Arc<ShardsAt<PyItem>>> {
        self.in_child.store(true, Ordering::Release);
        let fresh = py.get_type::<PyShardStore>().call(
            (
                self.root.to_py(py)?,
                self.source.as_ref().map(|s| s.clone_ref(py)),
            ),
            Some(self.kwargs.bind(py).cast::<PyDict>()?),
        )?;
        let fresh = fresh.cast_into::<PyShardStore>()?;
        let store = fresh
            .get()
            .handle
            .close()
            .ok_or_else(|| errors::closed(self.handle.path()))?;
        // The parent's writer publishes; the child never does.
        store.stop_publishing();
        Ok(store)
    }

    /// The directory the store reads now: for a URL, the working
    /// directory (a forked child's own once it reopened).
    fn local_root(&self, py: Python<'_>) -> PyResult<PathBuf> {
        let store = self.handle.get(py, |py, _inherited| self.reopen(py))?;
        Ok(match store.remote() {
            Some(r) => r.dir().to_path_buf(),
            None => self.handle.path().to_path_buf(),
        })
    }

    fn object(py: Python<'_>, item: &PyItem) -> PyResult<Py<PyAny>> {
        Ok(item.bind(py)?.unbind())
    }
}

#[pymethods]
impl PyShardStore {
    /// Opens the store at `root` over `source` (a function returning a fresh
    /// iterator of the same items each call; `None` serves only what is on
    /// disk), with loadit's options: shard length, in-memory shard cache,
    /// background workers, disk budget, compression and preloading.
    ///
    /// `root` may be a URL (`s3://bucket/prefix`, ...), read through the
    /// local tier at `tier_dir` within `tier_budget` (bytes, or a size
    /// such as `"20G"`), with `storage_options` for the object store
    /// (credentials stay in the environment): shards published there are
    /// read, shards generated here are published by `flush()`/`close()`,
    /// and on their own: every few seconds (`CACHEX_PUBLISH_INTERVAL`), when
    /// the store is dropped and at the interpreter's exit.
    #[new]
    #[pyo3(signature = (root, source=None, *, max_shard_length=None, max_cache_size=128, max_workers=1, memory_limit=None, compression=None, preload=None, preload_all_async=false, length=None, info=None, tier_dir=None, tier_budget=None, storage_options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        root: &Bound<'_, PyAny>,
        source: Option<Py<PyAny>>,
        max_shard_length: Option<&Bound<'_, PyAny>>,
        max_cache_size: usize,
        max_workers: usize,
        memory_limit: Option<u64>,
        compression: Option<String>,
        preload: Option<usize>,
        preload_all_async: bool,
        length: Option<u64>,
        info: Option<&Bound<'_, PyAny>>,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(root, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("max_shard_length", max_shard_length)?;
        kwargs.set_item("max_cache_size", max_cache_size)?;
        kwargs.set_item("max_workers", max_workers)?;
        kwargs.set_item("memory_limit", memory_limit)?;
        kwargs.set_item("compression", &compression)?;
        kwargs.set_item("preload", preload)?;
        kwargs.set_item("preload_all_async", preload_all_async)?;
        kwargs.set_item("length", length)?;
        kwargs.set_item("info", info)?;
        root.tier().to_kwargs(&kwargs)?;
        let max_shard_length = match max_shard_length {
            None => ShardLength::default(),
            Some(v) => match v.extract::<u64>() {
                Ok(n) => ShardLength::Items(n),
                Err(_) => v.extract::<String>()?.parse().map_err(errors::to_py)?,
            },
        };
        let compression = Compression::from_name(compression.as_deref()).ok_or_else(|| {
            errors::invalid(format!(
                "compression {compression:?}: give None or \"zstd\""
            ))
        })?;
        let opts = Options {
            max_shard_length,
            max_cache_size,
            max_workers,
            memory_limit,
            compression,
            preload: preload.map(Preload::NextShards),
            preload_all_async,
            length,
            info: info.map(json::from_py).transpose()?,
        };
        let failed: ErrorSlot = Arc::default();
        let location = root.location();
        let store = match &source {
            None => py.detach(|| ShardsAt::open(location, opts)),
            Some(factory) => {
                let factory = factory.clone_ref(py);
                let slot = failed.clone();
                let make = move || -> Box<dyn Iterator<Item = PyItem> + Send> {
                    Python::attach(|py| {
                        let iter = factory
                            .bind(py)
                            .call0()
                            .and_then(|it| it.try_iter())
                            .map(Bound::unbind);
                        match iter {
                            Ok(iter) => Box::new(SourceIter {
                                iter,
                                failed: slot.clone(),
                                buf: std::collections::VecDeque::new(),
                                ended: false,
                                error: None,
                            })
                                as Box<dyn Iterator<Item = PyItem> + Send>,
                            Err(e) => {
                                slot.lock().get_or_insert(e);
                                Box::new(std::iter::empty())
                            }
                        }
                    })
                };
                py.detach(|| ShardsAt::open_with_source(location, opts, make))
            }
        };
        if let Some(e) = failed.lock().take() {
            return Err(e);
        }
        let store = store.map_err(errors::to_py)?;
        let dir = match (store.remote(), root.location()) {
            (Some(r), _) => r.dir().to_path_buf(),
            (None, remote_cache::Location::Local(p)) => p.clone(),
            (None, remote_cache::Location::Remote(_)) => PathBuf::from(root.shown()),
        };
        Ok(PyShardStore {
            handle: Handle::new(py, dir, Arc::new(store)),
            root,
            in_child: AtomicBool::new(false),
            source,
            failed,
            kwargs: kwargs.into_any().unbind(),
        })
    }

    /// The store root: the directory, or for a URL the working directory
    /// over the local tier.
    #[getter]
    fn root(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL the store was opened on, without credentials (`None` for a
    /// local root).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
    }

    /// On a URL, publishes the shards (and metadata) generated since the
    /// last publish as one commit; nothing for a local root. Refused in a
    /// forked child (the parent publishes).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let store = self.handle.get(py, |py, _inherited| self.reopen(py))?;
        if self.in_child.load(Ordering::Acquire) {
            return Err(errors::forked_writer(self.handle.path()));
        }
        errors::enter(py, || store.publish().map(drop))
    }

    /// On a URL, applies what was published since (more shards, a longer
    /// length); returns the number of commits applied (0 for a local root).
    fn refresh(&self, py: Python<'_>) -> PyResult<u64> {
        let store = self.handle.get(py, |py, _inherited| self.reopen(py))?;
        errors::enter(py, || store.refresh().map(|r| r.commits))
    }

    /// Publishes (on a URL, outside a forked child) and closes the store;
    /// later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let in_child = self.in_child.load(Ordering::Acquire);
        match self.handle.close() {
            Some(s) => errors::enter(py, move || {
                let published = if in_child {
                    Ok(())
                } else {
                    s.publish().map(drop)
                };
                drop(s);
                published
            }),
            None => Ok(()),
        }
    }

    /// `with ShardStore(...) as store:` closes the store on exit.
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Closes the store (publishing on a URL); exceptions propagate.
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

    /// Items per full shard.
    #[getter]
    fn max_shard_length(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |s| Ok(s.max_shard_length()))
    }

    /// The number of items (drives the source to its end when unknown).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.run(py, |s| s.len())? as usize)
    }

    /// Item `i` (negative from the end), or a list for a slice.
    fn __getitem__(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        if let Ok(slice) = index.cast::<PySlice>() {
            let len = self.run(py, |s| s.len())?;
            let ind = slice.indices(len as isize)?;
            let idx: Vec<i64> = (0..ind.slicelength)
                .map(|k| (ind.start + k as isize * ind.step) as i64)
                .collect();
            return Ok(self.get_many(py, idx)?.into_any().unbind());
        }
        let i: i64 = index.extract()?;
        // A hot item is served without releasing the GIL (no I/O to wait on).
        if let Ok(hot) = u64::try_from(i)
            && !self.handle.forked()
            && let Some(item) = self.handle.peek().and_then(|s| s.get_cached(hot))
        {
            return Self::object(py, &item);
        }
        let item = self.run(py, |s| s.get(i))?;
        Self::object(py, &item)
    }

    /// Items at `indices` (negative from the end), in order; shards are
    /// visited once each, in ascending order.
    fn get_many<'py>(&self, py: Python<'py>, indices: Vec<i64>) -> PyResult<Bound<'py, PyList>> {
        let items = self.run(py, |s| s.get_many(&indices))?;
        let items = items
            .iter()
            .map(|i| i.bind(py))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// The length if it is already known (no work), else `None`.
    #[getter]
    fn known_len(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.run(py, |s| Ok(s.known_len()))
    }

    /// Has the background workers load the shards holding `indices` into
    /// memory (generating them if needed); nothing without workers.
    fn load_async(&self, py: Python<'_>, indices: Vec<u64>) -> PyResult<()> {
        self.run(py, move |s| {
            s.load_async(&indices);
            Ok(())
        })
    }

    /// `metadata.json`'s `info`.
    #[getter]
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let v = self.run(py, |s| s.info())?;
        json::to_py(py, &v)
    }

    /// Replaces `info` in `metadata.json`.
    fn set_info(&self, py: Python<'_>, info: &Bound<'_, PyAny>) -> PyResult<()> {
        let v = json::from_py(info)?;
        self.run(py, move |s| s.set_info(v))
    }

    /// Whether every shard is on disk.
    fn all_cached_to_disk(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, |s| s.all_cached_to_disk())
    }

    /// Blocks until the background preload has cached everything.
    fn wait_until_all_cached(&self, py: Python<'_>) -> PyResult<()> {
        self.run(py, |s| s.wait_until_all_cached())
    }

    /// The shard files on disk, by start: `(path, start, end, bytes)` each.
    fn shard_files(&self, py: Python<'_>) -> PyResult<Vec<(PathBuf, u64, u64, u64)>> {
        let files = self.run(py, |s| s.shard_files())?;
        Ok(files
            .into_iter()
            .map(|f| (f.path, f.name.start, f.name.end, f.bytes))
            .collect())
    }

    /// Bytes of the shard files on disk (what `memory_limit` bounds).
    fn disk_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |s| s.disk_bytes())
    }

    /// Decoded shards held in memory (at most `max_cache_size`).
    #[getter]
    fn cached_shards(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |s| Ok(s.cached_shards()))
    }

    /// Whether the shard starting at `start` is decoded in memory.
    fn is_cached(&self, py: Python<'_>, start: u64) -> PyResult<bool> {
        self.run(py, |s| Ok(s.is_cached(start)))
    }

    /// Cache misses since the store opened: `{"memory_misses", "disk_misses"}`
    /// (foreground lookups whose shard was not decoded in memory; lookups,
    /// background ones too, whose shard had no file and was generated).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.run(py, |s| Ok(s.counters()))?;
        let d = PyDict::new(py);
        d.set_item("memory_misses", c.memory_misses)?;
        d.set_item("disk_misses", c.disk_misses)?;
        Ok(d)
    }

    /// Shards the background workers load after a foreground access (0: none).
    #[getter]
    fn preload(&self, py: Python<'_>) -> PyResult<usize> {
        self.run(py, |s| {
            Ok(match s.preload() {
                Preload::None => 0,
                Preload::NextShards(n) => n,
            })
        })
    }

    /// Sets how many shards the workers load after a foreground access
    /// (0: none), from the next access on.
    fn set_preload(&self, py: Python<'_>, shards: usize) -> PyResult<()> {
        let p = if shards == 0 {
            Preload::None
        } else {
            Preload::NextShards(shards)
        };
        self.run(py, move |s| {
            s.set_preload(p);
            Ok(())
        })
    }

    /// The source cursors (`max_workers` of them): `(items pulled, ended)`
    /// each, `None` for one never used.
    fn cursors(&self, py: Python<'_>) -> PyResult<Vec<Option<(u64, bool)>>> {
        let cursors = self.run(py, |s| Ok(s.cursors()))?;
        Ok(cursors
            .into_iter()
            .map(|c| c.map(|c| (c.pos, c.done)))
            .collect())
    }

    /// Makes the end of the furthest shard on disk the final length (a
    /// length already final is kept) and returns the final length.
    fn finalize(&self, py: Python<'_>) -> PyResult<u64> {
        self.run(py, |s| s.finalize())
    }

    /// Everything wrong with the shards on disk, as `cachex verify --json`
    /// prints it: `{"kind": "shard-store", "path", "problems": [{"path",
    /// "kind", "detail"}, ...]}`, `problems` empty when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let root = self.local_root(py)?;
        let problems = py.detach(|| shard_store::verify(&root));
        check::verify_to_py(py, StoreKind::ShardStore, &root, &problems)
    }

    /// What the root holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, the items cached, length and shards, and a table of shard
    /// files.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let root = self.local_root(py)?;
        let summary = errors::enter(py, || shard_store::inspect(&root))?;
        check::summary_to_py(py, &summary.summary())
    }

    /// Pickles as root, source and options; the copy reopens the root
    /// (the source must itself be picklable, or be None).
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>, Bound<'py, PyAny>)> {
        let py = slf.py();
        let this = slf.get();
        let reopen = py
            .import("cachex._cachex")?
            .getattr("_reopen_shard_store")?;
        let args = (
            this.root.to_py(py)?,
            this.source.as_ref().map(|s| s.clone_ref(py)),
            this.kwargs.clone_ref(py),
        )
            .into_pyobject(py)?;
        Ok((reopen, args, py.None().into_bound(py)))
    }

    /// `ShardStore(root)` (a URL shown without credentials).
    fn __repr__(&self) -> String {
        format!("ShardStore({:?})", self.root.shown())
    }
}

/// Unpickles a `ShardStore` (see `ShardStore.__reduce__`).
#[pyfunction]
pub fn _reopen_shard_store<'py>(
    py: Python<'py>,
    root: &Bound<'py, PyAny>,
    source: Option<Py<PyAny>>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    let cls = py.get_type::<PyShardStore>();
    let copy = cls.call((root, source), Some(kwargs))?;
    // A copy (in a spawned worker) publishes nothing on its own: the
    // original does.
    if let Some(store) = copy.cast::<PyShardStore>()?.get().handle.peek() {
        store.stop_publishing();
    }
    Ok(copy)
}
