//! [`SegmentStore`]: the handle that ties the pieces together — opening
//! (locks and recovery), the flush pipeline (`flush.rs`), the lookup
//! pipeline (`lookup.rs`) and the store's counters.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tensor_core::Value;

use durable_fs::FileLock;
use parking_lot::{Mutex, RwLock};

use crate::flush::{self, Background};
use crate::format::{self, LOCK_FILE};
use crate::lookup::{self, lookup};
use crate::lru::Lru;
use crate::options::Options;
use crate::reader::SegmentMaps;
use crate::recover::{Role, recover};
use crate::schema::RecordSchema;
use crate::state::{Inner, Pending, State, WriteSide};
use crate::{Error, Result};
use cache_check::Problem;

/// Counters and sizes of a store.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Distinct keys (persisted and pending).
    pub entries: usize,
    /// Segment files in use.
    pub segments: usize,
    /// Records waiting for a flush (pending and in flight).
    pub pending: usize,
    /// Records in the LRU.
    pub lru_entries: usize,
    /// Bytes in the LRU.
    pub lru_bytes: usize,
    /// Lookups answered by the LRU.
    pub lru_hits: u64,
    /// Lookups answered by records not yet flushed.
    pub pending_hits: u64,
    /// Lookups answered from segments.
    pub segment_hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// Resident bytes of the key index.
    pub index_bytes: usize,
    /// Resident index bytes per indexed key.
    pub index_bytes_per_entry: f64,
}

/// A persistent key → [`Value`] map on immutable Arrow IPC segments.
///
/// All methods take `&self`; share a store between threads with `Arc`.
/// By default one process per directory writes (it holds an `fs2` lock);
/// with [`Options::writer_id`] any number of processes write, each as its
/// own writer. Any number of read-only handles may open it and see what
/// was committed when they opened, and more after
/// [`refresh`](SegmentStore::refresh).
pub struct SegmentStore {
    inner: Arc<Inner>,
    bg: Option<Background>,
}

impl std::fmt::Debug for SegmentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentStore")
            .field("dir", &self.inner.dir)
            .field("writer", &self.inner.write.is_some())
            .finish()
    }
}

impl SegmentStore {
    /// Opens (creating, for the writer) the cache at `dir`, recovering from
    /// any crash: temp files removed, a torn index tail dropped, segments
    /// newer than the index indexed, a missing index rebuilt from the
    /// segments (a torchcachex cache), a bad `schema.json` re-derived.
    /// What recovery found is in [`SegmentStore::problems`].
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<SegmentStore> {
        let dir = dir.as_ref().to_path_buf();
        if opts.flush_every == 0 {
            return Err(Error::InvalidInput("flush_every must be at least 1".into()));
        }
        let role = match opts.writer_id {
            _ if opts.read_only => Role::Reader,
            Some(w) if w > format::MAX_WRITER_ID => {
                return Err(Error::InvalidInput(format!(
                    "writer_id {w} exceeds {}",
                    format::MAX_WRITER_ID
                )));
            }
            Some(w) => Role::Multi(w),
            None if opts.current_rank == opts.writer_rank => Role::Single,
            None => Role::Reader,
        };
        let mut locks = Vec::new();
        match role {
            Role::Reader => {}
            Role::Single => {
                std::fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
                locks.push(FileLock::writer(&dir.join(LOCK_FILE)).map_err(Error::durable)?);
            }
            Role::Multi(w) => {
                // Its own id's lock refuses the same writer started twice;
                // the shared cache lock keeps out a single writer and
                // compaction, never another multi-writer.
                let wdir = dir.join(format::WRITERS_DIR);
                std::fs::create_dir_all(&wdir).map_err(Error::io("create", &wdir))?;
                locks.push(
                    FileLock::writer(&wdir.join(format::writer_lock_name(w)))
                        .map_err(Error::durable)?,
                );
                let shared = dir.join(LOCK_FILE);
                match FileLock::try_shared(&shared).map_err(Error::durable)? {
                    Some(l) => locks.push(l),
                    None => return Err(Error::Locked { path: shared }),
                }
            }
        }
        if opts.max_maps == 0 {
            return Err(Error::InvalidInput("max_maps must be at least 1".into()));
        }
        let maps = SegmentMaps::new(opts.max_maps, opts.whole_segment.clone());
        let rec = recover(&dir, role, &maps)?;
        let write = rec.log.map(|log| {
            Mutex::new(WriteSide {
                log,
                next_id: rec.next_id,
                writer: opts.writer_id.filter(|_| role != Role::Reader),
            })
        });
        let inner = Arc::new(Inner {
            dir,
            maps,
            state: RwLock::new(State {
                schema: rec.schema,
                index: rec.index,
                segments: rec.segments,
                inflight: Vec::new(),
            }),
            pending: Mutex::new(Pending::default()),
            write,
            preparing: Mutex::new(()),
            lru: Mutex::new(Lru::new(opts.lru_bytes)),
            layouts: Mutex::new(Default::default()),
            bg_error: Mutex::new(None),
            problems: Mutex::new(rec.problems),
            cursors: Mutex::new(rec.cursors),
            multi: AtomicBool::new(rec.multi),
            lru_hits: AtomicU64::new(0),
            pending_hits: AtomicU64::new(0),
            segment_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            _locks: locks,
            opts,
        });
        let bg = if inner.write.is_some() {
            Some(Background::spawn(&inner)?)
        } else {
            None
        };
        Ok(SegmentStore { inner, bg })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The options the store was opened with.
    pub fn options(&self) -> &Options {
        &self.inner.opts
    }

    /// Whether this handle persists (holds the lock and is the writer rank).
    pub fn is_writer(&self) -> bool {
        self.inner.write.is_some()
    }

    /// The record schema, once the first record fixed it.
    pub fn schema(&self) -> Option<RecordSchema> {
        self.inner.state.read().schema.clone()
    }

    /// What open-time recovery and later reads found wrong (each problem
    /// also excluded what it concerns, e.g. a corrupt segment's keys).
    pub fn problems(&self) -> Vec<Problem> {
        self.inner.problems.lock().clone()
    }

    /// Stores records. All are checked against the schema first (the first
    /// record ever stored fixes it); one mismatch refuses the whole batch.
    /// Every `flush_every` pending records become a new segment. On a rank
    /// other than the writer, records only fill the LRU.
    pub fn put_batch<K: AsRef<str>>(&self, items: &[(K, Value)]) -> Result<()> {
        flush::put(&self.inner, self.bg.as_ref(), items)
    }

    /// Writes every pending record and returns once they are durable (and,
    /// with `async_write`, once the background thread is idle). Returns
    /// any error a background flush hit since the last call.
    pub fn flush(&self) -> Result<()> {
        flush::flush(&self.inner, self.bg.as_ref())
    }

    /// Runs `f` while no flush or compaction of this handle changes the
    /// index logs or segments: what `f` copies of the directory (a publish
    /// to object storage) holds whole index groups only. A flush that
    /// comes meanwhile waits for `f`; a handle that does not write runs
    /// `f` at once.
    pub fn while_committed<R>(&self, f: impl FnOnce() -> R) -> R {
        let _quiet = self.inner.write.as_ref().map(|w| w.lock());
        f()
    }

    /// Looks `keys` up: the LRU, records not yet flushed, then the index
    /// and segments (every key confirmed against its segment's key
    /// column). Returns the records in the caller's order and the
    /// positions of the keys not found. Records from segments are
    /// zero-copy views; the first 512 KiB of their bytes are prefetched
    /// into the CPU caches before the call returns.
    pub fn get_batch<K: AsRef<str>>(&self, keys: &[K]) -> Result<(Vec<Option<Value>>, Vec<usize>)> {
        lookup::get(&self.inner, keys)
    }

    /// Number of distinct keys, persisted or pending.
    pub fn len(&self) -> usize {
        let inner = &self.inner;
        let p = inner.pending.lock();
        let st = inner.state.read();
        let mut extra = HashSet::new();
        let pending_keys = p.records.iter().map(|(k, _)| k).chain(
            st.inflight
                .iter()
                .flat_map(|b| b.records.iter().map(|(k, _)| k)),
        );
        for k in pending_keys {
            if !extra.contains(k.as_str()) && lookup(inner, &st, k, format::key_hash(k)).is_none() {
                extra.insert(k.as_str());
            }
        }
        st.index.len() + extra.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Counters and sizes.
    pub fn stats(&self) -> Stats {
        let inner = &self.inner;
        let entries = self.len();
        let (lru_entries, lru_bytes) = {
            let l = inner.lru.lock();
            (l.len(), l.bytes())
        };
        let pending = inner.pending.lock().records.len();
        let st = inner.state.read();
        let index_bytes = st.index.resident_bytes();
        Stats {
            entries,
            segments: st.segments.len(),
            pending: pending + st.inflight.iter().map(|b| b.records.len()).sum::<usize>(),
            lru_entries,
            lru_bytes,
            lru_hits: inner.lru_hits.load(Ordering::Relaxed),
            pending_hits: inner.pending_hits.load(Ordering::Relaxed),
            segment_hits: inner.segment_hits.load(Ordering::Relaxed),
            misses: inner.misses.load(Ordering::Relaxed),
            index_bytes,
            index_bytes_per_entry: if st.index.is_empty() {
                0.0
            } else {
                index_bytes as f64 / st.index.len() as f64
            },
        }
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    pub(crate) fn require_writer(&self, op: &'static str) -> Result<&Mutex<WriteSide>> {
        self.inner.write.as_ref().ok_or_else(|| Error::ReadOnly {
            path: self.inner.dir.clone(),
            op,
        })
    }
}

impl Drop for SegmentStore {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; call `flush` to see them.
        let _ = flush::hand_off(&self.inner, self.bg.as_ref(), true);
        if let Some(bg) = self.bg.take() {
            bg.stop();
        }
    }
}
