//! [`ShardStore`]: the public handle, opening a root and its workers.
//! (What its handles share is in `inner.rs`, the shard cache they share
//! in `shards.rs`.)

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};

use durable_fs::FileLock;
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::{
    self, Compression, FORMAT_VERSION, LOCKS_DIR, METADATA_FILE, Metadata, SCRATCH_DIR, SHARDS_DIR,
    SIZE_ESTIMATE_ITEMS, StoreItem, WRITER_LOCK_FILE,
};
use crate::inner::{Inner, Job, Paths, Source, StartMap, State};
use crate::iter::{Iter, ShardIter};
use crate::options::{Options, Preload, ShardLength};
use crate::reader::read_metadata_file;
use crate::shards::{Item, worker_loop};

/// Random access to the items of a deterministic iterator, cached on disk
/// in loadit's sharded layout (see the [crate docs](crate)).
///
/// A cheap handle: clones share one cache. Safe to use from many threads;
/// many processes may open the same root.
pub struct ShardStore<T> {
    pub(crate) inner: Arc<Inner<T>>,
    workers: Arc<Workers>,
}

impl<T> Clone for ShardStore<T> {
    fn clone(&self) -> Self {
        ShardStore {
            inner: Arc::clone(&self.inner),
            workers: Arc::clone(&self.workers),
        }
    }
}

/// The background threads; dropping the last handle stops and joins them,
/// so no write of this store continues after it is gone.
struct Workers {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tx: Option<mpsc::Sender<Job>>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(tx) = &self.tx {
            for _ in &self.handles {
                let _ = tx.send(Job::Stop);
            }
        }
        let me = std::thread::current().id();
        for h in self.handles.drain(..) {
            // The last handle may be dropped by one of these very workers
            // (a Python garbage collection running on it): that one ends
            // by itself once it reads the stop, and cannot join itself.
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
    }
}

impl<T> std::fmt::Debug for ShardStore<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardStore")
            .field("root", &self.inner.root)
            .field("max_shard_length", &self.inner.shard_len)
            .field("compression", &self.inner.compression)
            .finish_non_exhaustive()
    }
}

impl<T: StoreItem> ShardStore<T> {
    /// Opens a root without a source: only cached items can be read.
    /// The root must already hold `metadata.json`; its shard length and
    /// compression are adopted whatever `options` say.
    pub fn open(root: impl AsRef<Path>, options: Options) -> Result<ShardStore<T>> {
        ShardStore::open_inner(root.as_ref(), options, None)
    }

    /// Opens (or creates) a root over `source`, a factory called again
    /// whenever items must be regenerated. It **must** yield the same items
    /// in the same order on every call: shards written by one call are mixed
    /// with shards written by another (and by other processes).
    pub fn open_with_source<F, I>(
        root: impl AsRef<Path>,
        options: Options,
        source: F,
    ) -> Result<ShardStore<T>>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let source = Source {
            start_at: Box::new(move |_| Box::new(source().into_iter())),
            seekable: false,
        };
        ShardStore::open_inner(root.as_ref(), options, Some(source))
    }

    /// Opens (or creates) a root over a seekable source: `source(start)`
    /// returns an iterator over the items from index `start` on, so that
    /// regenerating an evicted shard replays only that shard instead of
    /// every item before it.
    ///
    /// `source(start)` **must** yield exactly what `source(0)` yields after
    /// skipping `start` items, on every call. The store only seeks to
    /// positions known to lie within the source (a shard boundary at or
    /// below the final length, or below the end of a shard already on
    /// disk), so `source` never has to detect a seek past its end; if it is
    /// asked for one anyway, yielding nothing is right.
    ///
    /// ```
    /// use shard_store::{Options, ShardStore};
    ///
    /// # fn main() -> Result<(), shard_store::Error> {
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = ShardStore::open_with_seekable_source(
    ///     dir.path(),
    ///     Options::default().shard_items(100),
    ///     |start| (start..1000u64).map(|i| i * i),
    /// )?;
    /// assert_eq!(*store.get(950)?, 950 * 950); // replays items 900.. only
    /// # Ok(()) }
    /// ```
    pub fn open_with_seekable_source<F, I>(
        root: impl AsRef<Path>,
        options: Options,
        source: F,
    ) -> Result<ShardStore<T>>
    where
        F: Fn(u64) -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let source = Source {
            start_at: Box::new(move |start| Box::new(source(start).into_iter())),
            seekable: true,
        };
        ShardStore::open_inner(root.as_ref(), options, Some(source))
    }

    fn open_inner(root: &Path, opts: Options, source: Option<Source<T>>) -> Result<ShardStore<T>> {
        opts.validate()?;
        let paths = Paths {
            shards: root.join(SHARDS_DIR),
            locks: root.join(LOCKS_DIR),
            scratch: root.join(SCRATCH_DIR),
            metadata: root.join(METADATA_FILE),
            writer_lock: root.join(LOCKS_DIR).join(WRITER_LOCK_FILE),
        };
        if source.is_none() && !paths.metadata.exists() {
            return Err(Error::BadMetadata {
                path: paths.metadata.clone(),
                reason: "missing; a new store needs a source".into(),
            });
        }
        for dir in [&paths.shards, &paths.locks, &paths.scratch] {
            if let Err(e) = std::fs::create_dir_all(dir) {
                // A read-only root can still be read without a source.
                if source.is_some() || !dir.is_dir() && dir != &paths.scratch {
                    return Err(Error::io("create directory", dir)(e));
                }
            }
        }
        let meta = {
            let _lock = FileLock::exclusive(&paths.writer_lock).map_err(Error::durable)?;
            match read_metadata_file(&paths.metadata)? {
                // Without a source nothing is written: the stored layout is adopted.
                Some(stored) if source.is_none() => stored,
                Some(stored) => adopt(&paths.metadata, &paths.scratch, stored, &opts)?,
                None => {
                    let shard_len = match opts.max_shard_length {
                        ShardLength::Items(n) => n,
                        ShardLength::Bytes(b) => match &source {
                            Some(src) => estimate_shard_len(root, src, b, opts.compression)?,
                            None => unreachable!("checked above: no metadata needs a source"),
                        },
                    };
                    let meta = Metadata {
                        max_shard_length: shard_len,
                        length: 0,
                        length_final: false,
                        compression: opts.compression.name().map(str::to_owned),
                        version: FORMAT_VERSION,
                        info: opts.info.clone().unwrap_or(serde_json::Value::Null),
                    };
                    crate::writer::replace_file(&paths.scratch, &paths.metadata, &meta.to_json())?;
                    meta
                }
            }
        };
        let cursors = (0..opts.max_workers).map(|_| Mutex::new(None)).collect();
        let workers = opts.max_workers.saturating_sub(1);
        let (tx, rx) = mpsc::channel::<Job>();
        let inner = Arc::new(Inner {
            root: root.to_path_buf(),
            paths,
            shard_len: meta.max_shard_length,
            compression: meta.compression(),
            source,
            state: Mutex::new(State {
                cache: StartMap::default(),
                length: meta.length_final.then_some(meta.length),
                disk_access: HashMap::new(),
                disk_size: HashMap::new(),
                pending: HashSet::new(),
            }),
            cursors,
            tick: AtomicU64::new(1),
            preload: AtomicUsize::new(match opts.preload_policy() {
                Preload::None => 0,
                Preload::NextShards(n) => n,
            }),
            memory_misses: AtomicU64::new(0),
            disk_misses: AtomicU64::new(0),
            jobs: (workers > 0).then(|| Mutex::new(tx.clone())),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            opts,
        });
        let mut pool = Workers {
            stop: Arc::clone(&inner.stop),
            tx: (workers > 0).then_some(tx),
            handles: Vec::new(),
        };
        if workers > 0 {
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..workers {
                let inner2 = Arc::clone(&inner);
                let rx = Arc::clone(&rx);
                let h = std::thread::Builder::new()
                    .name("shard-store-preload".into())
                    .spawn(move || worker_loop(inner2, rx))
                    .map_err(Error::io("spawn worker", &inner.root))?;
                pool.handles.push(h);
            }
            if inner.opts.preload_all_async && inner.source.is_some() {
                inner.submit(Job::All);
            }
        }
        if inner.source.is_some() {
            durable_fs::remove_dead_temp_files(&inner.paths.scratch);
        }
        Ok(ShardStore {
            inner,
            workers: Arc::new(pool),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Items per full shard (as stored).
    pub fn max_shard_length(&self) -> u64 {
        self.inner.shard_len
    }

    /// The item at `index`; negative indices count from the end (which
    /// needs the length). The item is read from memory, disk, or the source.
    pub fn get(&self, index: i64) -> Result<Item<T>> {
        let i = self.resolve(index)?;
        self.inner.item(i, index)
    }

    /// The item at `index` if its shard is decoded in the memory cache;
    /// `None` otherwise (no I/O, no waiting on the source). Lets a caller
    /// serve hot items without first handing off to blocking work.
    pub fn get_cached(&self, index: u64) -> Option<Item<T>> {
        let start = index - index % self.inner.shard_len;
        let t = self.inner.next_tick();
        let shard = {
            let mut state = self.inner.state.lock();
            let (shard, tick) = state.cache.get_mut(&start)?;
            *tick = t;
            Arc::clone(shard)
        };
        let offset = (index - start) as usize;
        if offset >= shard.len() {
            return None;
        }
        self.inner.preload_after(start);
        Some(Item {
            shard,
            index: offset,
        })
    }

    /// The number of items. Drives the source to its end (writing the
    /// shards it passes, without a disk budget) when it is not yet known.
    pub fn len(&self) -> Result<u64> {
        self.inner.len()
    }

    /// Whether the store has no items (drives the source like [`len`](Self::len)).
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The length if it is already known (no work).
    pub fn known_len(&self) -> Option<u64> {
        self.inner.state.lock().length
    }

    /// Several items, in the order asked; the indices are served shard by
    /// shard in ascending order, so that missing shards are generated by
    /// one forward pass of the source.
    pub fn get_many(&self, indices: &[i64]) -> Result<Vec<T>>
    where
        T: Clone,
    {
        let mut order: Vec<(u64, usize)> = Vec::with_capacity(indices.len());
        for (k, &i) in indices.iter().enumerate() {
            order.push((self.resolve(i)?, k));
        }
        order.sort_unstable();
        let mut out: Vec<Option<T>> = vec![None; indices.len()];
        let l = self.inner.shard_len;
        let mut pos = 0;
        while pos < order.len() {
            let start = order[pos].0 - order[pos].0 % l;
            let shard = self.inner.shard(start, order[pos].0)?;
            while pos < order.len() && order[pos].0 < start + l {
                let (i, k) = order[pos];
                let item = shard
                    .as_ref()
                    .and_then(|s| s.get((i - start) as usize))
                    .ok_or_else(|| Error::IndexOutOfRange {
                        index: indices[k],
                        len: self.known_len().unwrap_or(i) as usize,
                    })?;
                out[k] = Some(item.clone());
                pos += 1;
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Sequential iteration over all items, as fast as the cache or the
    /// source allows. Shards already in the memory cache are cloned from;
    /// shards read from disk are decoded for the iterator alone (moved out,
    /// not cached), so a pass over a large store does not evict the hot set.
    pub fn iter(&self) -> Iter<T>
    where
        T: Clone,
    {
        Iter::new(self.iter_shards())
    }

    /// Sequential iteration over whole decoded shards (no per-item copy).
    pub fn iter_shards(&self) -> ShardIter<T> {
        ShardIter::new(Arc::clone(&self.inner))
    }

    /// Schedules the shards holding `indices` to be loaded into the memory
    /// cache by the background workers (loadit's `load_async`), skipping
    /// shards already cached, already scheduled, or past a known end.
    /// Does nothing without workers (`max_workers` 1), as loadit.
    pub fn load_async(&self, indices: &[u64]) {
        if self.inner.jobs.is_none() {
            return;
        }
        let l = self.inner.shard_len;
        let mut todo = Vec::new();
        {
            let mut state = self.inner.state.lock();
            for &i in indices {
                let s = i - i % l;
                if state.length.is_some_and(|len| s >= len) || state.cache.contains_key(&s) {
                    continue;
                }
                if state.pending.insert(s) {
                    todo.push(s);
                }
            }
        }
        for s in todo {
            self.inner.submit(Job::Shard(s));
        }
    }

    /// The `info` JSON stored in `metadata.json`.
    pub fn info(&self) -> Result<serde_json::Value> {
        Ok(self.inner.read_metadata()?.info)
    }

    /// Replaces the `info` JSON (atomically).
    pub fn set_info(&self, info: serde_json::Value) -> Result<()> {
        let _lock = FileLock::exclusive(&self.inner.paths.writer_lock).map_err(Error::durable)?;
        let mut meta = self.inner.read_metadata_unlocked()?;
        meta.info = info;
        self.inner.write_metadata_unlocked(&meta)
    }

    /// Whether every item is in a shard file on disk.
    pub fn all_cached_to_disk(&self) -> Result<bool> {
        let Some(len) = self.inner.final_length_refreshed()? else {
            return Ok(false);
        };
        Ok(crate::writer::covers(&self.inner.shard_files()?, len))
    }

    /// Blocks until [`all_cached_to_disk`](Self::all_cached_to_disk) holds.
    ///
    /// With a source and no `preload_all_async` worker, this handle fills
    /// the missing shards itself (ascending shard by shard, so one forward pass of the source) rather
    /// than waiting on nobody; under a disk budget too small for the whole
    /// cache that cannot succeed, and it returns the eviction's outcome
    /// after the pass instead of spinning. Without a source it waits for
    /// another handle or process to fill the root.
    pub fn wait_until_all_cached(&self) -> Result<()> {
        if self.inner.source.is_some() && !self.inner.opts.preload_all_async {
            let len = self.len()?;
            let shard = self.inner.shard_len.max(1);
            // Ascending shard starts: the source cursor moves forward once.
            // A shard held in memory but gone from disk (evicted, deleted by
            // another process) is written from memory.
            for start in (0..len).step_by(shard as usize) {
                if self.inner.shard_on_disk(start) {
                    continue;
                }
                let cached = {
                    let state = self.inner.state.lock();
                    state.cache.get(&start).map(|(items, _)| Arc::clone(items))
                };
                match cached {
                    Some(items) => self.inner.persist(start, &items)?,
                    None => {
                        self.get(start as i64)?;
                    }
                }
            }
            if self.inner.opts.memory_limit.is_some() && !self.all_cached_to_disk()? {
                return Ok(());
            }
        }
        while !self.all_cached_to_disk()? {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }

    fn resolve(&self, index: i64) -> Result<u64> {
        if index >= 0 {
            return Ok(index as u64);
        }
        let len = self.len()?;
        let back = index.unsigned_abs();
        len.checked_sub(back).ok_or(Error::IndexOutOfRange {
            index,
            len: len as usize,
        })
    }
}

/// Checks requested options against stored metadata, adopting what may be
/// adopted (a byte target adopts the stored shard length). Caller holds the
/// writer lock.
fn adopt(path: &Path, scratch: &Path, mut stored: Metadata, opts: &Options) -> Result<Metadata> {
    if let ShardLength::Items(n) = opts.max_shard_length
        && n != stored.max_shard_length
    {
        return Err(Error::OptionMismatch {
            path: path.to_path_buf(),
            option: "max_shard_length",
            requested: n.to_string(),
            stored: stored.max_shard_length.to_string(),
        });
    }
    if opts.compression != stored.compression() {
        return Err(Error::OptionMismatch {
            path: path.to_path_buf(),
            option: "compression",
            requested: format!("{:?}", opts.compression.name()),
            stored: format!("{:?}", stored.compression),
        });
    }
    if let Some(info) = &opts.info
        && *info != stored.info
    {
        stored.info = info.clone();
        crate::writer::replace_file(scratch, path, &stored.to_json())?;
    }
    Ok(stored)
}

/// loadit's `max_shard_length="<N>mb"`: pickle the first items, divide.
fn estimate_shard_len<T: StoreItem>(
    root: &Path,
    source: &Source<T>,
    target: u64,
    compression: Compression,
) -> Result<u64> {
    let sample: Vec<T> = source.iter_from(0).take(SIZE_ESTIMATE_ITEMS).collect();
    if sample.is_empty() {
        return Err(Error::InvalidOption {
            option: "max_shard_length",
            reason: format!(
                "{}: the source is empty, cannot estimate item size",
                root.display()
            ),
        });
    }
    let bytes = format::encode_shard(root, &sample, compression)?;
    let per_item = (bytes.len() as f64 / sample.len() as f64).max(1.0);
    Ok(((target as f64 / per_item) as u64).max(1))
}
