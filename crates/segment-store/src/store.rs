//! [`SegmentStore`]: the keyed cache that ties the pieces together.

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use durable_fs::FileLock;
use parking_lot::{Mutex, RwLock};

use crate::format::{self, LOCK_FILE, SCHEMA_FILE};
use crate::index::{KeyIndex, Loc};
use crate::lru::Lru;
use crate::reader::{Decoded, Row, Segment, SegmentMaps};
use crate::record::{Record, part_bytes};
use crate::recover::{LogCursor, Role, hint_of, recover};
use crate::schema::{RecordSchema, to_schema_json};
use crate::writer::{IndexLog, Unsynced, build_batch, split_runs, write_segment_data};
use crate::{Error, Result};
use cache_check::{Problem, ProblemKind};

/// How many keys each stage of [`SegmentStore::get_batch`]'s lookup
/// pipeline runs behind the stage before it: enough work in between for a
/// cache miss (a few hundred ns) to complete, few enough that the
/// outstanding misses fit the CPU's miss buffers.
const AHEAD: usize = 16;

/// How a store behaves. `Options::default()` suits a single process.
#[derive(Debug, Clone)]
pub struct Options {
    /// Pending records that trigger a flush into a new segment (default 4096).
    pub flush_every: usize,
    /// Byte budget of the in-memory LRU of records read from segments
    /// (and, on a rank that does not persist, of the records it puts); 0
    /// disables it (default 64 MiB).
    pub lru_bytes: usize,
    /// Build and write segments on a background thread (default false),
    /// so `put_batch` never waits for them. By default the call that
    /// fills a segment builds and writes it, and the store's flush thread
    /// makes it durable (fsync, rename, index group) while the caller goes
    /// on, one segment at a time. Either way, errors there are returned by
    /// the next call or by [`SegmentStore::flush`], which returns once
    /// everything is durable.
    pub async_write: bool,
    /// With `async_write`, flushes that may wait for the background
    /// thread before `put_batch` blocks (default 2).
    pub queue_depth: usize,
    /// The rank that persists (default 0).
    pub writer_rank: u32,
    /// This process's rank (default: the `RANK` environment variable, else 0).
    pub current_rank: u32,
    /// Open without the writer lock; puts are refused (default false).
    pub read_only: bool,
    /// Multi-writer mode: this handle persists as writer `id` (0 to
    /// [`format::MAX_WRITER_ID`], typically the rank) beside any number
    /// of other writers, each into its own segment ids and index log, with
    /// no lock between them. `None` (the default) is the single-writer
    /// mode, where only `writer_rank` persists. Ignored when `read_only`.
    pub writer_id: Option<u32>,
    /// Segment files this store keeps memory-mapped at once (default
    /// 4096). Segments are mapped when a read needs them; beyond this
    /// many, the least recently used are unmapped (records already read
    /// keep their bytes). Linux allows a process 65,530 maps, and the
    /// stores of one process together keep at most half of that,
    /// whatever each one's bound.
    pub max_maps: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            flush_every: 4096,
            lru_bytes: 64 << 20,
            async_write: false,
            queue_depth: 2,
            writer_rank: 0,
            current_rank: std::env::var("RANK")
                .ok()
                .and_then(|r| r.trim().parse().ok())
                .unwrap_or(0),
            read_only: false,
            writer_id: None,
            max_maps: 4096,
        }
    }
}

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

/// Records of one flush, readable until their segment is indexed.
struct Batch {
    records: Vec<(String, Record)>,
    by_key: HashMap<String, usize>,
}

#[derive(Default)]
struct Pending {
    records: Vec<(String, Record)>,
    by_key: HashMap<String, usize>,
}

pub(crate) struct State {
    pub(crate) schema: Option<RecordSchema>,
    pub(crate) index: KeyIndex,
    pub(crate) segments: BTreeMap<u32, Arc<Segment>>,
    inflight: Vec<Arc<Batch>>,
}

pub(crate) struct WriteSide {
    pub(crate) log: IndexLog,
    pub(crate) next_id: u32,
    /// The multi-writer id, whose residue class the ids stay in.
    pub(crate) writer: Option<u32>,
}

impl WriteSide {
    /// Takes the next segment id.
    pub(crate) fn take_id(&mut self, dir: &Path) -> Result<u32> {
        let id = self.next_id;
        let next = match self.writer {
            Some(w) => format::next_writer_segment(w, Some(id)),
            None => id.checked_add(1),
        };
        self.next_id = next.ok_or_else(|| {
            Error::InvalidInput(format!(
                "{}: segment ids exhausted; run compact()",
                dir.display()
            ))
        })?;
        Ok(id)
    }
}

pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    opts: Options,
    /// The segments' live mappings.
    pub(crate) maps: Arc<SegmentMaps>,
    pub(crate) state: RwLock<State>,
    pending: Mutex<Pending>,
    pub(crate) write: Option<Mutex<WriteSide>>,
    /// Held while a caller takes pending records and writes their
    /// segments (the default mode), so segments commit in id order.
    preparing: Mutex<()>,
    lru: Mutex<Lru>,
    bg_error: Mutex<Option<Error>>,
    pub(crate) problems: Mutex<Vec<Problem>>,
    /// Where this handle stopped reading each other index log.
    pub(crate) cursors: Mutex<BTreeMap<PathBuf, LogCursor>>,
    /// Whether the cache has writer logs (or this handle writes one).
    pub(crate) multi: std::sync::atomic::AtomicBool,
    lru_hits: AtomicU64,
    pending_hits: AtomicU64,
    segment_hits: AtomicU64,
    misses: AtomicU64,
    _locks: Vec<FileLock>,
}

enum Job {
    /// Build, write and commit a batch (`async_write`).
    Write(Arc<Batch>),
    /// Commit segments the caller wrote (the default mode).
    Commit(Prepared),
    Barrier(SyncSender<()>),
}

/// A batch's segments, written (not yet durable) in the order they commit.
struct Prepared {
    batch: Arc<Batch>,
    runs: Vec<Written>,
}

/// One segment of a batch: its id, its rows, its unsynced file.
struct Written {
    id: u32,
    rows: std::ops::Range<usize>,
    file: Unsynced,
}

struct Background {
    tx: SyncSender<Job>,
    handle: JoinHandle<()>,
}

/// A persistent key → [`Record`] map on immutable Arrow IPC segments.
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
                std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create", e))?;
                locks.push(FileLock::writer(&dir.join(LOCK_FILE)).map_err(Error::durable)?);
            }
            Role::Multi(w) => {
                // Its own id's lock refuses the same writer started twice;
                // the shared cache lock keeps out a single writer and
                // compaction, never another multi-writer.
                let wdir = dir.join(format::WRITERS_DIR);
                std::fs::create_dir_all(&wdir).map_err(|e| Error::io(&wdir, "create", e))?;
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
        let maps = SegmentMaps::new(opts.max_maps);
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
            bg_error: Mutex::new(None),
            problems: Mutex::new(rec.problems),
            cursors: Mutex::new(rec.cursors),
            multi: std::sync::atomic::AtomicBool::new(rec.multi),
            lru_hits: AtomicU64::new(0),
            pending_hits: AtomicU64::new(0),
            segment_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            _locks: locks,
            opts,
        });
        let bg = if inner.write.is_some() {
            // The default mode hands over one written segment at a time: the
            // send waits until the thread is done with the one before.
            let depth = if inner.opts.async_write {
                inner.opts.queue_depth.max(1)
            } else {
                0
            };
            let (tx, rx) = sync_channel(depth);
            let worker = inner.clone();
            let handle = std::thread::Builder::new()
                .name("segment-store-flush".into())
                .spawn(move || background(worker, rx))
                .map_err(|e| Error::io(&inner.dir, "spawn flush thread", e))?;
            Some(Background { tx, handle })
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

    fn take_bg_error(&self) -> Result<()> {
        match self.inner.bg_error.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Stores records. All are checked against the schema first (the first
    /// record ever stored fixes it); one mismatch refuses the whole batch.
    /// Every `flush_every` pending records become a new segment. On a rank
    /// other than the writer, records only fill the LRU.
    pub fn put_batch<K: AsRef<str>>(&self, items: &[(K, Record)]) -> Result<()> {
        self.take_bg_error()?;
        let inner = &self.inner;
        if inner.opts.read_only {
            return Err(Error::ReadOnly {
                path: inner.dir.clone(),
                op: "put_batch",
            });
        }
        let Some((first_key, first)) = items.first() else {
            return Ok(());
        };
        let current = inner.state.read().schema.clone();
        let (schema, fresh) = match current {
            Some(s) => (s, false),
            None => (RecordSchema::infer(first), true),
        };
        if fresh {
            schema.check(first_key.as_ref(), first)?;
        }
        for (k, r) in items {
            schema.check(k.as_ref(), r)?;
        }
        if fresh {
            let mut st = inner.state.write();
            if st.schema.is_none() {
                if let Some(write) = &inner.write {
                    let multi = write.lock().writer.is_some();
                    write_schema(&inner.dir, &schema, multi)?;
                }
                st.schema = Some(schema);
            } else if let Some(s) = &st.schema {
                // Another thread fixed the schema meanwhile: check against it.
                for (k, r) in items {
                    s.check(k.as_ref(), r)?;
                }
            }
        }
        if inner.opts.lru_bytes > 0 {
            let mut lru = inner.lru.lock();
            if inner.write.is_none() {
                // A rank that does not persist keeps its records only here.
                for (k, r) in items {
                    lru.put(k.as_ref(), r);
                }
            } else if lru.len() > 0 {
                // The writer's records are found among the pending ones,
                // then in their segment: the LRU, filled by reads, only
                // forgets the values these replace.
                for (k, _) in items {
                    lru.remove(k.as_ref());
                }
            }
        }
        if inner.write.is_none() {
            return Ok(());
        }
        let full = {
            let mut p = inner.pending.lock();
            for (k, r) in items {
                let i = p.records.len();
                p.records.push((k.as_ref().to_owned(), r.clone()));
                p.by_key.insert(k.as_ref().to_owned(), i);
            }
            p.records.len() >= inner.opts.flush_every
        };
        if full {
            self.hand_off(false)?;
        }
        Ok(())
    }

    /// Hands pending records to a flush: every full `flush_every` run, and
    /// the remainder too when `all`.
    fn hand_off(&self, all: bool) -> Result<()> {
        let inner = &self.inner;
        let Some(write) = &inner.write else {
            return Ok(());
        };
        let every = inner.opts.flush_every;
        let Some(bg) = &self.bg else {
            return Ok(());
        };
        let stopped = || {
            Error::io(
                &inner.dir,
                "hand off flush",
                std::io::Error::other("flush thread stopped"),
            )
        };
        if inner.opts.async_write {
            let mut p = inner.pending.lock();
            while p.records.len() >= every || (all && !p.records.is_empty()) {
                let batch = take_batch(&mut p, every);
                inner.state.write().inflight.push(batch.clone());
                if bg.tx.send(Job::Write(batch)).is_err() {
                    return Err(stopped());
                }
            }
            Ok(())
        } else {
            // The caller builds and writes each full run's segment (the
            // disk starts on its bytes at once) while the thread commits
            // the one before.
            let _order = inner.preparing.lock();
            loop {
                let batch = {
                    let mut p = inner.pending.lock();
                    if !(p.records.len() >= every || (all && !p.records.is_empty())) {
                        return Ok(());
                    }
                    let batch = take_batch(&mut p, every);
                    inner.state.write().inflight.push(batch.clone());
                    batch
                };
                let prepared = prepare(inner, write, batch)?;
                if bg.tx.send(Job::Commit(prepared)).is_err() {
                    return Err(stopped());
                }
                // The thread took it, so it is done with the segment
                // before: report that one's error now.
                self.take_bg_error()?;
            }
        }
    }

    /// Writes every pending record and returns once they are durable (and,
    /// with `async_write`, once the background thread is idle). Returns
    /// any error a background flush hit since the last call.
    pub fn flush(&self) -> Result<()> {
        self.take_bg_error()?;
        self.hand_off(true)?;
        if let Some(bg) = &self.bg {
            let (tx, rx) = sync_channel(1);
            if bg.tx.send(Job::Barrier(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
        self.take_bg_error()
    }

    /// Looks `keys` up: the LRU, records not yet flushed, then the index
    /// and segments (every key confirmed against its segment's key
    /// column). Returns the records in the caller's order and the
    /// positions of the keys not found. Records from segments are
    /// zero-copy views; the first 512 KiB of their bytes are prefetched
    /// into the CPU caches before the call returns.
    pub fn get_batch<K: AsRef<str>>(
        &self,
        keys: &[K],
    ) -> Result<(Vec<Option<Record>>, Vec<usize>)> {
        self.take_bg_error()?;
        let inner = &self.inner;
        let mut out: Vec<Option<Record>> = keys.iter().map(|_| None).collect();
        let use_lru = inner.opts.lru_bytes > 0;
        if use_lru {
            let mut lru = inner.lru.lock();
            for (i, k) in keys.iter().enumerate() {
                out[i] = lru.get(k.as_ref());
            }
            inner.lru_hits.fetch_add(
                out.iter().filter(|o| o.is_some()).count() as u64,
                Ordering::Relaxed,
            );
        }
        if inner.write.is_some() {
            let p = inner.pending.lock();
            if !p.records.is_empty() {
                let mut n = 0;
                for (i, k) in keys.iter().enumerate() {
                    if out[i].is_none()
                        && let Some(&j) = p.by_key.get(k.as_ref())
                    {
                        out[i] = Some(p.records[j].1.clone());
                        n += 1;
                    }
                }
                inner.pending_hits.fetch_add(n, Ordering::Relaxed);
            }
        }
        let mut found: Vec<usize> = Vec::new();
        {
            let st = inner.state.read();
            let hint = hint_of(st.schema.as_ref());
            let structure = hint.unwrap_or(crate::Structure::Tensor);
            let mut n = 0;
            let mut wanted: Vec<usize> = Vec::with_capacity(keys.len());
            for (i, k) in keys.iter().enumerate() {
                if out[i].is_some() {
                    continue;
                }
                if !st.inflight.is_empty() {
                    let key = k.as_ref();
                    if let Some(r) = st
                        .inflight
                        .iter()
                        .rev()
                        .find_map(|b| b.by_key.get(key).map(|&j| b.records[j].1.clone()))
                    {
                        out[i] = Some(r);
                        n += 1;
                        continue;
                    }
                }
                wanted.push(i);
            }
            if n > 0 {
                inner.pending_hits.fetch_add(n, Ordering::Relaxed);
            }
            // Random lookups are bound by cache misses, each key's on the
            // one before: its table slot, then its key offset, then its
            // key bytes. A software pipeline keeps every stage `AHEAD`
            // keys behind the one before, so each miss has the work on
            // later keys (hashing, mostly) to hide behind and the misses
            // of the batch overlap.
            let mut hashes: Vec<u64> = Vec::with_capacity(wanted.len());
            let mut first: Vec<Option<(&Segment, &Decoded, Row<'_>)>> =
                Vec::with_capacity(wanted.len());
            let segs = SegmentTable::new(&st.segments, hint, wanted.len());
            let mut hits = 0;
            let total = wanted.len();
            for step in 0..total + 3 * AHEAD {
                // Stage 1: hash, and ask for the table slot.
                if let Some(&i) = wanted.get(step) {
                    let h = format::key_hash(keys[i].as_ref());
                    st.index.prefetch(h);
                    hashes.push(h);
                }
                // Stage 2: read the slot, locate the first candidate's row
                // and ask for its key offset.
                if let Some(&h) = step.checked_sub(AHEAD).and_then(|k| hashes.get(k)) {
                    let located = st.index.candidates(h).next().and_then(|loc| {
                        let (seg, d) = segs.get(loc.seg)?;
                        let row = d.row(loc.row as usize)?;
                        d.prefetch_row(&row);
                        Some((seg, d, row))
                    });
                    first.push(located);
                }
                // Stage 3: ask for the candidate's key bytes.
                if let Some(Some((_, d, row))) =
                    step.checked_sub(2 * AHEAD).and_then(|k| first.get(k))
                {
                    d.prefetch_key(row);
                }
                // Stage 4: confirm the key and hand out the record.
                let Some(k) = step.checked_sub(3 * AHEAD).filter(|&k| k < total) else {
                    continue;
                };
                let (i, h) = (wanted[k], hashes[k]);
                let key = keys[i].as_ref();
                let noted = |path: &Path, e: Error| note_problem(inner, path, e.to_string());
                let rec = match &first[k] {
                    // The common case: the first candidate is the key.
                    Some((seg, d, row)) if d.key_of(row) == Some(key) => d
                        .record_of(&seg.path, row, structure)
                        .map_err(|e| noted(&seg.path, e))
                        .ok(),
                    // A tag collision or an unreadable segment: walk every
                    // candidate.
                    _ => lookup(inner, &st, key, h).and_then(|hit| {
                        hit.decoded
                            .record(&hit.segment.path, hit.loc.row as usize, structure)
                            .map_err(|e| noted(&hit.segment.path, e))
                            .ok()
                    }),
                };
                if let Some(r) = rec {
                    out[i] = Some(r);
                    hits += 1;
                    if use_lru {
                        found.push(i);
                    }
                }
            }
            inner.segment_hits.fetch_add(hits, Ordering::Relaxed);
        }
        warm(&out);
        if use_lru && !found.is_empty() {
            let mut lru = inner.lru.lock();
            for &i in &found {
                if let Some(r) = &out[i] {
                    lru.put(keys[i].as_ref(), r);
                }
            }
        }
        let missing: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        inner
            .misses
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        Ok((out, missing))
    }

    /// Number of distinct keys, persisted or pending.
    pub fn len(&self) -> usize {
        let inner = &self.inner;
        let p = inner.pending.lock();
        let st = inner.state.read();
        let mut extra = std::collections::HashSet::new();
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
        let _ = self.hand_off(true);
        if let Some(bg) = self.bg.take() {
            drop(bg.tx);
            let _ = bg.handle.join();
        }
    }
}

fn take_batch(p: &mut Pending, every: usize) -> Arc<Batch> {
    let n = p.records.len().min(every);
    if n == p.records.len() {
        // Everything pending (the common case: batches that add up to
        // `every`): the key map moves with the records, and the next
        // pending run starts with room for a whole segment (up to 64k
        // records: `flush_every` may be far larger).
        let room = every.min(1 << 16);
        let records = std::mem::replace(&mut p.records, Vec::with_capacity(room));
        let by_key = std::mem::replace(&mut p.by_key, HashMap::with_capacity(room));
        return Arc::new(Batch { records, by_key });
    }
    let records: Vec<(String, Record)> = p.records.drain(..n).collect();
    let rest: Vec<(String, Record)> = std::mem::take(&mut p.records);
    p.by_key.clear();
    for (i, (k, r)) in rest.into_iter().enumerate() {
        p.by_key.insert(k.clone(), i);
        p.records.push((k, r));
    }
    let by_key = records
        .iter()
        .enumerate()
        .map(|(i, (k, _))| (k.clone(), i))
        .collect();
    Arc::new(Batch { records, by_key })
}

pub(crate) fn note_problem(inner: &Inner, path: &Path, detail: String) {
    let mut p = inner.problems.lock();
    if !p.iter().any(|q| q.path == path && q.detail == detail) {
        p.push(Problem {
            path: path.to_path_buf(),
            kind: ProblemKind::Structure,
            detail,
        });
    }
}

/// A key found in a segment.
struct Hit {
    loc: Loc,
    segment: Arc<Segment>,
    decoded: Arc<Decoded>,
}

/// The indexed location of `key` (hash `hash`), confirmed against the
/// segment's key column.
fn lookup(inner: &Inner, st: &State, key: &str, hash: u64) -> Option<Hit> {
    let hint = hint_of(st.schema.as_ref());
    for loc in st.index.candidates(hash) {
        let Some(seg) = st.segments.get(&loc.seg) else {
            continue;
        };
        match seg.decoded(hint) {
            Ok(d) => {
                if d.key(loc.row as usize) == Some(key) {
                    return Some(Hit {
                        loc,
                        segment: seg.clone(),
                        decoded: d,
                    });
                }
            }
            Err(e) => note_problem(
                inner,
                &seg.path,
                format!("excluded, its keys read as missing: {e}"),
            ),
        }
    }
    None
}

/// Builds, writes and commits one batch (`async_write`'s thread).
fn persist(inner: &Inner, write: &Mutex<WriteSide>, batch: Arc<Batch>) -> Result<()> {
    commit(inner, write, prepare(inner, write, batch)?)
}

/// Builds and writes the segment(s) of `batch`, not yet durable. On
/// failure the batch leaves the in-flight list and nothing stays on disk.
fn prepare(inner: &Inner, write: &Mutex<WriteSide>, batch: Arc<Batch>) -> Result<Prepared> {
    let mut runs = Vec::new();
    match prepare_runs(inner, write, &batch, &mut runs) {
        Ok(()) => Ok(Prepared { batch, runs }),
        Err(e) => {
            runs.into_iter().for_each(|w| w.file.discard());
            retire(inner, &batch);
            Err(e)
        }
    }
}

fn prepare_runs(
    inner: &Inner,
    write: &Mutex<WriteSide>,
    batch: &Batch,
    runs: &mut Vec<Written>,
) -> Result<()> {
    let schema = inner
        .state
        .read()
        .schema
        .clone()
        .ok_or_else(|| Error::InvalidInput("flush before any schema".into()))?;
    for rows in split_runs(&batch.records, &schema) {
        // A run that fails to build leaves its id unused: ids need not be
        // dense.
        let id = write.lock().take_id(&inner.dir)?;
        let rb = build_batch(&schema, &batch.records[rows.clone()]).map_err(|e| Error::Arrow {
            path: format::segment_path(&inner.dir, id),
            source: e,
        })?;
        let file = write_segment_data(&inner.dir, id, &rb)?;
        runs.push(Written { id, rows, file });
    }
    Ok(())
}

/// Makes the prepared segments durable, appends their index groups (the
/// commit point) and makes them visible; then the batch leaves the
/// in-flight list, committed or not.
fn commit(inner: &Inner, write: &Mutex<WriteSide>, prepared: Prepared) -> Result<()> {
    let Prepared { batch, runs } = prepared;
    let mut runs = runs.into_iter();
    let mut result = Ok(());
    for w in runs.by_ref() {
        result = commit_run(inner, write, &batch, w);
        if result.is_err() {
            break;
        }
    }
    runs.for_each(|w| w.file.discard());
    retire(inner, &batch);
    result
}

fn retire(inner: &Inner, batch: &Arc<Batch>) {
    inner
        .state
        .write()
        .inflight
        .retain(|b| !Arc::ptr_eq(b, batch));
}

fn commit_run(inner: &Inner, write: &Mutex<WriteSide>, batch: &Batch, w: Written) -> Result<()> {
    let Written { id, rows, file } = w;
    let records = &batch.records[rows];
    let path = format::segment_path(&inner.dir, id);
    let (len, content) = (file.len, file.content);
    file.commit()?;
    let hashes: Vec<u64> = records.iter().map(|(k, _)| format::key_hash(k)).collect();
    if let Err(e) = write
        .lock()
        .log
        .append(&format::encode_group(id, len, content, &hashes))
    {
        // Uncommitted: remove it so a later open does not index it.
        let _ = std::fs::remove_file(&path);
        return Err(e);
    }
    let seg = Arc::new(Segment::open(&path, id, &inner.maps)?);
    let mut st = inner.state.write();
    let State {
        index,
        segments,
        schema,
        ..
    } = &mut *st;
    let hint = hint_of(schema.as_ref());
    segments.insert(id, seg);
    for (row, (key, _)) in records.iter().enumerate() {
        if let Some(&ahead) = hashes.get(row + 16) {
            index.prefetch(ahead);
        }
        let loc = Loc {
            seg: id,
            row: row as u32,
        };
        index.insert(hashes[row], loc, |old| {
            if old.seg == id {
                records[old.row as usize].0 == *key
            } else {
                segments
                    .get(&old.seg)
                    .and_then(|s| s.decoded(hint).ok())
                    .and_then(|d| d.key(old.row as usize).map(|k| k == key))
                    .unwrap_or(false)
            }
        });
    }
    Ok(())
}

/// Writes `schema.json` for the first record. A multi-writer may race
/// others doing the same: it builds the file under a name of its own, and
/// when another writer's schema is already there it checks against it
/// instead.
fn write_schema(dir: &Path, schema: &RecordSchema, multi: bool) -> Result<()> {
    let path = dir.join(SCHEMA_FILE);
    let json = to_schema_json(schema);
    if !multi {
        return durable_fs::write_atomic(&path, json.as_bytes()).map_err(Error::durable);
    }
    if let Ok(text) = crate::schema::read_schema_text(&path)
        && let Ok(theirs) = crate::schema::parse_schema_json(&text)
    {
        if &theirs != schema {
            return Err(Error::SchemaMismatch {
                key: String::new(),
                field: "schema.json".into(),
                detail: format!(
                    "{}: another writer fixed a different schema: {text}",
                    path.display()
                ),
            });
        }
        return Ok(());
    }
    let tmp = durable_fs::unique_temp_path(dir, SCHEMA_FILE);
    durable_fs::write_synced(&tmp, json.as_bytes())
        .and_then(|()| durable_fs::rename_and_sync(&tmp, &path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::durable(e)
        })
}

fn background(inner: Arc<Inner>, rx: Receiver<Job>) {
    for job in rx {
        match job {
            Job::Write(batch) => {
                let Some(write) = &inner.write else {
                    continue;
                };
                let records = batch.records.len();
                if let Err(e) = persist(&inner, write, batch) {
                    note_bg_error(&inner, records, e);
                }
            }
            Job::Commit(prepared) => {
                let Some(write) = &inner.write else {
                    continue;
                };
                let records = prepared.batch.records.len();
                if let Err(e) = commit(&inner, write, prepared) {
                    note_bg_error(&inner, records, e);
                }
            }
            Job::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Keeps the first error of the flush thread for the next call.
fn note_bg_error(inner: &Inner, records: usize, e: Error) {
    let mut slot = inner.bg_error.lock();
    if slot.is_none() {
        *slot = Some(Error::Background {
            records,
            source: Box::new(e),
        });
    }
}

/// Bytes of a batch's tensors that [`SegmentStore::get_batch`] asks the CPU
/// to bring into its caches before returning (about half an L2 cache).
const WARM_BYTES: usize = 512 << 10;

/// The segments one `get_batch` call reads, resolved and decoded once per
/// segment rather than once per key, and held (mapped) until the call
/// returns: a table indexed by id when the ids span not much more than the
/// keys asked for, slots taken in order of first use otherwise.
struct SegmentTable<'a> {
    map: &'a BTreeMap<u32, Arc<Segment>>,
    hint: Option<crate::Structure>,
    /// Smallest segment id.
    base: u32,
    /// Whether `cells` is indexed by `id - base`.
    dense: bool,
    /// Each resolved once: the segment and its decoded columns (`None`
    /// when it is absent or unreadable).
    cells: Vec<OnceCell<Option<(&'a Segment, Arc<Decoded>)>>>,
    /// Sparse: the cell of each id met so far.
    sparse: RefCell<HashMap<u32, usize>>,
}

impl<'a> SegmentTable<'a> {
    /// A table for at most `lookups` calls of [`SegmentTable::get`].
    fn new(
        map: &'a BTreeMap<u32, Arc<Segment>>,
        hint: Option<crate::Structure>,
        lookups: usize,
    ) -> SegmentTable<'a> {
        let (base, span) = match (map.first_key_value(), map.last_key_value()) {
            (Some((&lo, _)), Some((&hi, _))) => (lo, (hi - lo) as usize + 1),
            _ => (0, 0),
        };
        let dense = span <= lookups.saturating_mul(4);
        let cells = std::iter::repeat_with(OnceCell::new)
            .take(if dense { span } else { lookups })
            .collect();
        SegmentTable {
            map,
            hint,
            base,
            dense,
            cells,
            sparse: RefCell::new(HashMap::new()),
        }
    }

    fn get(&self, id: u32) -> Option<(&'a Segment, &Decoded)> {
        let cell = if self.dense {
            self.cells.get(id.checked_sub(self.base)? as usize)?
        } else {
            let mut sparse = self.sparse.borrow_mut();
            let next = sparse.len();
            let i = *sparse.entry(id).or_insert(next);
            // More ids than lookups cannot happen; the caller's slow path
            // finds such a key anyway.
            self.cells.get(i)?
        };
        let (seg, d) = cell
            .get_or_init(|| {
                let seg = self.map.get(&id)?;
                let d = seg.decoded(self.hint).ok()?;
                Some((&**seg, d))
            })
            .as_ref()?;
        Some((*seg, &**d))
    }
}

/// Asks the CPU to fetch the bytes of the batch's records, up to
/// [`WARM_BYTES`], in one tight pass: the caller reads them next, and
/// requests issued back to back overlap their misses far better than the
/// caller's pass, which waits for each record's first lines in turn.
fn warm(out: &[Option<Record>]) {
    let mut budget = WARM_BYTES;
    for rec in out.iter().flatten() {
        let mut each = |bytes: &[u8]| {
            let n = bytes.len().min(budget);
            budget -= n;
            crate::index::prefetch_lines(&bytes[..n]);
        };
        match rec {
            Record::Dict(parts) => parts
                .iter()
                .filter_map(|(_, p)| part_bytes(p))
                .for_each(&mut each),
            Record::Tuple(parts) | Record::List(parts) => {
                parts.iter().filter_map(part_bytes).for_each(&mut each)
            }
            Record::Tensor(_) | Record::Blob(_) => part_bytes(rec).into_iter().for_each(&mut each),
        }
        if budget == 0 {
            return;
        }
    }
}
