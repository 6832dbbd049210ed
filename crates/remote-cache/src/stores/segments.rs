//! [`SegmentsAt`]: a segment-store cache on a location.

use std::collections::HashSet;
use std::fs::File;
use std::ops::{Deref, Range};
use std::os::unix::fs::FileExt;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, Mutex};

use remote_tier::{RemoteFile, Warming, WarmingSet};
use segment_store::{BoxError, Keeper, SegmentRanges, SegmentStore, WholeSegment};
use tensor_core::Value;

use crate::Result;
use crate::files::SEGMENT_BLOCK_SIZE;
use crate::location::Location;
use crate::publisher::{self, Publisher};
use crate::remote_dir::{PublishReport, RefreshReport, RemoteDir};
use crate::{StoreFiles, StoreKind};

/// A segment-store cache on a [`Location`]: read, and append.
///
/// Remote: index logs and `schema.json` are copied into the working
/// directory before the store opens it; segments are linked into the
/// local tier and left sparse, fetched as reads need them, and read under
/// leases ([`RemoteFile::lease`]): the tier may free any block of them no
/// read is using, so a store larger than the tier's budget stays within
/// it. [`get_batch`](SegmentsAt::get_batch) reads a key of a segment
/// not whole locally through byte ranges: the blocks (4 KiB) that hold
/// its row, and once per segment its footer and batch metadata, each
/// block checked against the BLAKE3 its commit recorded and leased while
/// it is read.
///
/// **Whole copies.** Anything that maps a segment (the store's own
/// `get_batch` through `Deref`, `verify`, `compact`, a `get_batch` that
/// reads many rows of one segment) first makes it whole, verified,
/// through a handle that keeps that copy whole (no block of it freed) for
/// as long as the mapping lives — until the store unmaps it and no record
/// read from it is left — and no longer. Such copies count against the
/// budget like any other: while they are mapped the tier evicts other
/// copies and blocks, and only when nothing else is left does it go over.
/// So `get_batch` maps a segment (is "local", or reads it whole) only
/// while the tier grants room for every linked segment at once beside
/// what other stores and processes sharing it claimed
/// ([`RemoteDir::may_keep_whole`]); beyond that it reads every row through
/// ranges, and whole copies are made only by what needs them (`verify`,
/// `compact`, a segment the ranged path cannot read), each let go when
/// done.
///
/// [`publish`](Self::publish) uploads the segments and index bytes
/// written since, then the commit record. Several writers append to one
/// remote cache when each has its own
/// [`writer_id`](segment_store::Options::writer_id); two writers that
/// write the same segment id cannot both publish it
/// ([`Error::Conflict`](crate::Error::Conflict)).
#[derive(Debug)]
pub struct SegmentsAt {
    // Dropped before the commit log: the store's files stay while it lives.
    store: Arc<SegmentStore>,
    // After the store (whose drop flushes), before the commit log: the
    // last publish takes what the store persisted.
    _publisher: Option<Publisher>,
    remote: Option<Arc<RemoteDir>>,
    coming: Arc<Coming>,
}

/// The paths a prefetch is fetching (by path in the working directory):
/// a read of one of them that may map it waits for that copy (the tier
/// fetches each block once) rather than fetch its rows by ranges too.
#[derive(Debug, Default)]
struct Coming(Mutex<HashSet<String>>);

impl Coming {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `path` relative to the working directory `dir`, `/`-separated, as the
/// commit log names files.
fn relative(dir: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(dir).ok()?;
    let parts: Vec<&str> = rel.iter().map(|c| c.to_str()).collect::<Option<_>>()?;
    Some(parts.join("/"))
}

/// The tier object the segment at `path` is linked to (`None` for a file
/// copied whole).
fn linked(remote: &RemoteDir, path: &Path) -> Option<RemoteFile> {
    remote.object(&relative(remote.dir(), path)?)
}

/// The segment at `path` whole, for the store to map, and what keeps it
/// whole while the mapping lives: a handle of its tier object that keeps
/// the copy whole (see [`RemoteFile::whole_handle`]), its missing blocks
/// fetched (in runs of adjacent blocks: a request per 8 MiB, not per 4
/// KiB), each checked against its hash, into the very file the links
/// name. A second reader meanwhile (a read, the prefetch) waits on the
/// tier's fetch lock of each run and finds its blocks there. `None` for
/// a file copied whole.
fn whole_segment(
    remote: &RemoteDir,
    path: &Path,
) -> std::result::Result<Option<(File, Keeper)>, BoxError> {
    let Some(linked) = linked(remote, path) else {
        return Ok(None);
    };
    let copy = linked.whole_handle()?;
    if !copy.is_complete() {
        copy.ensure_exact(std::slice::from_ref(&(0..copy.len())))?;
    }
    let file = copy.file()?.try_clone()?;
    Ok(Some((file, Box::new(AssertUnwindSafe(copy)))))
}

/// Keys a unit of a [`SegmentsAt::prefetch`] of rows reads at once.
const WARM_KEYS: usize = 16;

/// A segment of which one call reads a sixteenth of the rows, or of
/// which a sixteenth of the blocks were fetched, is read whole.
const WHOLE_AT: usize = 16;

/// The segments of a working directory as the store's ranged reads see
/// them (see [`SegmentRanges`]).
struct Fetched<'a> {
    remote: &'a RemoteDir,
    coming: &'a Coming,
}

impl Fetched<'_> {
    /// Whether the store may map the segment linked to `linked`: always
    /// one kept whole while open; one read under leases only while every
    /// leased segment fits the budget at once, so that the whole copies
    /// mappings keep never break it.
    fn may_map(&self, linked: &RemoteFile) -> bool {
        !linked.is_leased() || self.leased_fit()
    }

    /// Whether every leased segment may be whole at once: the tier
    /// granted this store room for all of them beside every other claim
    /// on it ([`RemoteDir::may_keep_whole`]).
    fn leased_fit(&self) -> bool {
        self.remote.may_keep_whole()
    }
}

impl SegmentRanges for Fetched<'_> {
    fn all_local(&self) -> bool {
        self.leased_fit() && self.remote.all_complete()
    }

    fn is_local(&self, path: &Path) -> bool {
        match linked(self.remote, path) {
            None => true,
            Some(linked) => self.may_map(&linked) && linked.is_complete(),
        }
    }

    fn read_whole(&self, path: &Path, rows: usize, of: usize) -> bool {
        let linked = linked(self.remote, path);
        if linked.as_ref().is_some_and(|l| !self.may_map(l)) {
            return false;
        }
        let coming =
            relative(self.remote.dir(), path).is_some_and(|rel| self.coming.set().contains(&rel));
        if coming {
            return true;
        }
        // A row costs about six blocks: past a sixteenth of the rows (or of
        // the blocks already), the whole segment in a request or two costs
        // less than the rows in a request each.
        let many_rows = rows.saturating_mul(WHOLE_AT) >= of;
        let many_blocks = linked.is_some_and(|linked| {
            let (have, total) = linked.blocks_present();
            have.saturating_mul(WHOLE_AT as u64) >= total
        });
        many_rows || many_blocks
    }

    fn read_ranges(
        &self,
        path: &Path,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, BoxError> {
        // Held across the reads: no process frees the blocks read.
        let (file, _lease) = match linked(self.remote, path) {
            Some(f) => {
                let lease = f.lease_exact(ranges)?;
                (f.file()?, Some(lease))
            }
            None => (Arc::new(File::open(path)?), None),
        };
        ranges
            .iter()
            .map(|r| {
                let mut buf = vec![0u8; usize::try_from(r.end - r.start)?];
                file.read_exact_at(&mut buf, r.start)?;
                Ok(buf)
            })
            .collect()
    }
}

/// `options` with the hook that makes a segment whole before the store
/// maps it.
fn with_whole_segments(
    mut options: segment_store::Options,
    remote: &Arc<RemoteDir>,
) -> segment_store::Options {
    let remote = Arc::clone(remote);
    options.whole_segment = Some(WholeSegment::keeping(move |path: &Path, _len: u64| {
        whole_segment(&remote, path)
    }));
    options
}

impl SegmentsAt {
    /// Opens the segment store at `location` with `options`. A reader
    /// whose working directory holds earlier commits opens its store while
    /// the request that learns what was published since is in flight
    /// ([`with_unapplied`](SegmentsAt::with_unapplied)).
    pub fn open(location: &Location, options: segment_store::Options) -> Result<SegmentsAt> {
        let opened = location.open_unapplied(StoreFiles::for_kind(StoreKind::SegmentStore))?;
        match opened.remote {
            Some(remote) => SegmentsAt::with_unapplied(remote, options),
            None => Ok(SegmentsAt {
                store: Arc::new(SegmentStore::open(&opened.dir, options)?),
                _publisher: None,
                remote: None,
                coming: Arc::default(),
            }),
        }
    }

    /// Opens the store in the working directory of `remote`, opened with
    /// [`RemoteDir::open_unapplied`], and applies what was published
    /// since: the store sees every commit published before this returns.
    ///
    /// For a read-only store over a working directory that holds earlier
    /// commits, the request for the next commit and the store's own open
    /// (reading its index logs) run at once — nothing changes in the
    /// directory until both are done — and the store refreshes after
    /// applying whatever that request found; a warm open then costs the
    /// longer of the two, not their sum. A writer, or an empty working
    /// directory, applies first and opens after, as
    /// [`with_remote`](SegmentsAt::with_remote).
    pub fn with_unapplied(
        remote: RemoteDir,
        options: segment_store::Options,
    ) -> Result<SegmentsAt> {
        if !options.read_only || remote.seq() == 0 {
            remote.refresh_at_open()?;
            return SegmentsAt::with_remote(remote, options);
        }
        let remote = Arc::new(remote);
        let options = with_whole_segments(options, &remote);
        let (next, store) = std::thread::scope(|s| {
            let next = s.spawn(|| remote.fetch_next());
            let store = SegmentStore::open(remote.dir(), options.clone());
            let next = next
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (next, store)
        });
        if let Err(crate::Error::OtherLog { .. }) = next {
            // The directory holds another log's files: the store opened on
            // them goes, the directory starts over from the bucket's log.
            drop(store);
            remote.refresh_at_open()?;
            let store = Arc::new(SegmentStore::open(remote.dir(), options)?);
            return Ok(SegmentsAt {
                _publisher: publisher::for_segments(&store, &remote),
                store,
                remote: Some(remote),
                coming: Arc::default(),
            });
        }
        let (next, store) = (next?, store?);
        if next.is_some() {
            remote.refresh_from(next)?;
            store.refresh()?;
        }
        let store = Arc::new(store);
        Ok(SegmentsAt {
            _publisher: publisher::for_segments(&store, &remote),
            store,
            remote: Some(remote),
            coming: Arc::default(),
        })
    }

    /// Opens the store in the working directory of `remote` (a commit log
    /// opened by the caller, e.g. over a wrapped object store).
    pub fn with_remote(remote: RemoteDir, options: segment_store::Options) -> Result<SegmentsAt> {
        let remote = Arc::new(remote);
        let store = Arc::new(SegmentStore::open(
            remote.dir(),
            with_whole_segments(options, &remote),
        )?);
        Ok(SegmentsAt {
            _publisher: publisher::for_segments(&store, &remote),
            store,
            remote: Some(remote),
            coming: Arc::default(),
        })
    }

    /// The records of `keys` (`None` where missing) and the positions of
    /// the keys not found, as [`SegmentStore::get_batch`] returns them. A
    /// key in a segment not whole locally costs only the blocks that hold
    /// its row (and, once per segment, those of its footer and batch
    /// metadata), fetched for all keys of a segment at once, the segments
    /// at once; its record comes back owned. A block that does not match
    /// its recorded BLAKE3 is an error naming the object
    /// ([`remote_tier::Error::BlockMismatch`] inside
    /// [`segment_store::Error::Fetch`]), never a record.
    pub fn get_batch<K: AsRef<str>>(&self, keys: &[K]) -> Result<(Vec<Option<Value>>, Vec<usize>)> {
        match &self.remote {
            Some(remote) => {
                // Never the files of a log the URL no longer holds.
                remote.check_log()?;
                let src = Fetched {
                    remote,
                    coming: &self.coming,
                };
                Ok(self.store.get_batch_ranged(keys, &src)?)
            }
            None => Ok(self.store.get_batch(keys)?),
        }
    }

    /// Registers this reader's plan with the local tier: the record of
    /// `keys[j]` is read at `positions[j]` of the reader's batch clock
    /// (`0..epoch_len` this epoch, `epoch_len..2·epoch_len` the next; see
    /// [`RemoteFile::set_plan`]), one plan over every segment the keys
    /// lie in, each row's blocks where
    /// [`SegmentStore::row_spans_of`] places them, exactly (reading each
    /// segment's layout once and the rows' offsets, as reads do). The
    /// tier then evicts the blocks needed furthest ahead first. Keys in no segment are left out; `None` for a
    /// local cache, when no key lies in a segment linked to the tier, or
    /// when every linked segment fits the tier's budget at once (the store
    /// then maps its segments whole, which no plan would evict: a plan
    /// would only cost its registration).
    /// The plan counts until the handle is dropped;
    /// [`PlanHandle::advance`](remote_tier::PlanHandle::advance) it after
    /// each batch.
    pub fn set_plan<K: AsRef<str>>(
        &self,
        keys: &[K],
        positions: &[u64],
        epoch_len: u64,
    ) -> Result<Option<remote_tier::PlanHandle>> {
        let invalid = |reason: String| {
            segment_store::Error::InvalidInput(format!(
                "{}: plan: {reason}",
                self.store.dir().display()
            ))
        };
        if keys.len() != positions.len() {
            return Err(invalid(format!(
                "{} keys but {} positions",
                keys.len(),
                positions.len()
            ))
            .into());
        }
        if let Some(&p) = positions
            .iter()
            .find(|&&p| p >= epoch_len.saturating_mul(2))
        {
            return Err(invalid(format!(
                "position {p} outside this epoch and the next ({epoch_len} batches each)"
            ))
            .into());
        }
        let Some(remote) = &self.remote else {
            return Ok(None);
        };
        let src = Fetched {
            remote,
            coming: &self.coming,
        };
        if src.leased_fit() {
            return Ok(None);
        }
        let spans = self.store.row_spans_of(keys, &src)?;
        let mut files: Vec<RemoteFile> = Vec::new();
        let mut uses: Vec<Vec<(Range<u64>, u64)>> = Vec::new();
        let mut at: std::collections::HashMap<std::path::PathBuf, Option<usize>> =
            std::collections::HashMap::new();
        for (found, &position) in spans.into_iter().zip(positions) {
            let Some((path, ranges)) = found else {
                continue;
            };
            let slot = *at.entry(path).or_insert_with_key(|path| {
                let file = linked(remote, path)?;
                files.push(file);
                uses.push(Vec::new());
                Some(files.len() - 1)
            });
            if let Some(k) = slot {
                uses[k].extend(ranges.into_iter().map(|r| (r, position)));
            }
        }
        if files.is_empty() {
            return Ok(None);
        }
        let plan: Vec<remote_tier::ObjectReads<'_>> = files
            .iter()
            .zip(&uses)
            .map(|(f, u)| (f, u.as_slice()))
            .collect();
        Ok(Some(remote_tier::set_plans(&plan, epoch_len)?))
    }

    /// Starts fetching what `keys` need into the local tier in the
    /// background, in the order the keys first need it (the next epoch's,
    /// the next batch's), up to the tier's parallelism at once and at most
    /// the tier's budget of bytes; returns at once. Where the store may
    /// map its segments (every linked segment fits the budget, see the
    /// type's docs) that is the segments that hold `keys`, all of each,
    /// verified: a key of a segment that arrived is read with no request,
    /// and one read while its segment is on its way waits for it. Beyond
    /// that, only the blocks of the keys' rows (and each segment's footer
    /// and batch metadata), read as [`get_batch`](Self::get_batch) reads
    /// them, 16 keys at a time: a whole segment for a key or
    /// two would evict what the next reads need. Either way the blocks
    /// fetched are the tier's to evict like any other: nothing stays
    /// pinned once fetched. Nothing to do for a local cache, or for
    /// segments already whole here.
    pub fn prefetch<K: AsRef<str>>(&self, keys: &[K]) -> WarmingSet {
        let Some(remote) = &self.remote else {
            return WarmingSet::default();
        };
        let src = Fetched {
            remote,
            coming: &self.coming,
        };
        if !src.leased_fit() {
            return self.warm_rows(remote, keys);
        }
        let files: Vec<(String, RemoteFile)> = self
            .store
            .segment_files_of(keys)
            .into_iter()
            .filter_map(|path| {
                let rel = relative(remote.dir(), &path)?;
                let linked = remote.object(&rel)?;
                (!linked.is_complete()).then_some((rel, linked))
            })
            .collect();
        let sizes: Vec<u64> = files.iter().map(|(_, f)| f.len()).collect();
        let config = remote.tier().config();
        let (budget, workers) = (config.tier_budget, config.parallelism.max(1));
        let chunk = config.block_size.max(SEGMENT_BLOCK_SIZE);
        self.coming
            .set()
            .extend(files.iter().map(|(rel, _)| rel.clone()));
        let coming = Arc::clone(&self.coming);
        let order: Vec<u64> = (0..files.len() as u64).collect();
        let fetch = move |i: u64| -> remote_tier::Result<bool> {
            let Some((rel, linked)) = files.get(i as usize) else {
                return Ok(false);
            };
            // A tier block's worth at a time, each leased only while it is
            // fetched: a segment larger than the budget never stays leased
            // whole.
            let fetched = (0..linked.len())
                .step_by(chunk as usize)
                .try_for_each(|at| {
                    let run = at..(at + chunk).min(linked.len());
                    linked.ensure_exact(std::slice::from_ref(&run))
                });
            coming.set().remove(rel);
            fetched.map(|()| true)
        };
        let bytes = move |i: u64| sizes.get(i as usize).copied().unwrap_or(0);
        Warming::all(vec![Warming::start(order, budget, workers, bytes, fetch)])
    }

    /// [`prefetch`](Self::prefetch) of the rows of `keys` only: their
    /// blocks read through the store's ranged path, [`WARM_KEYS`] keys a
    /// unit, the records dropped.
    fn warm_rows<K: AsRef<str>>(&self, remote: &Arc<RemoteDir>, keys: &[K]) -> WarmingSet {
        let chunks: Vec<Vec<String>> = keys
            .chunks(WARM_KEYS)
            .map(|c| c.iter().map(|k| k.as_ref().to_string()).collect())
            .collect();
        let config = remote.tier().config();
        let (budget, workers) = (config.tier_budget, config.parallelism.max(1));
        // A unit's bytes, for the budget: its keys' share of the segments.
        let per_key = remote.leased_bytes() / self.store.len().max(1) as u64;
        let sizes: Vec<u64> = chunks.iter().map(|c| c.len() as u64 * per_key).collect();
        let (store, remote, coming) = (
            Arc::clone(&self.store),
            Arc::clone(remote),
            Arc::clone(&self.coming),
        );
        let order: Vec<u64> = (0..chunks.len() as u64).collect();
        let fetch = move |i: u64| -> remote_tier::Result<bool> {
            let Some(keys) = chunks.get(i as usize) else {
                return Ok(false);
            };
            let src = Fetched {
                remote: &remote,
                coming: &coming,
            };
            store
                .get_batch_ranged(keys, &src)
                .map(|_| true)
                .map_err(|e| remote_tier::Error::Runtime(e.to_string()))
        };
        let bytes = move |i: u64| sizes.get(i as usize).copied().unwrap_or(0);
        Warming::all(vec![Warming::start(order, budget, workers, bytes, fetch)])
    }

    /// Number of distinct keys, persisted or pending (the index's count:
    /// no segment is fetched for it).
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether the store holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The store (also reachable through `Deref`).
    pub fn store(&self) -> &SegmentStore {
        &self.store
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_deref()
    }

    /// Flushes the store, then publishes what it wrote since the last
    /// publish (a no-op for a local cache).
    pub fn publish(&self) -> Result<PublishReport> {
        self.store.flush()?;
        match &self.remote {
            Some(r) => r.publish(),
            // A local location publishes nothing.
            None => Ok(PublishReport::default()),
        }
    }

    /// Applies the commits other writers published since (never half of
    /// one), then makes their segments visible to the store. Returns what
    /// the commit log did and how many segments the store gained.
    pub fn refresh(&self) -> Result<(RefreshReport, usize)> {
        let report = match &self.remote {
            Some(r) => r.refresh()?,
            None => RefreshReport::default(),
        };
        let gained = self.store.refresh()?;
        Ok((report, gained))
    }
}

/// A background thread refreshing a [`SegmentsAt`] on a period
/// ([`SegmentsAt::refresh_every`]); stops when dropped, or when the
/// store is gone.
#[derive(Debug)]
pub struct Refresher {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    last_error: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Refresher {
    /// The last refresh's error, if it failed (the next period tries again).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SegmentsAt {
    /// Refreshes `store` every `period` on a background thread, until the
    /// returned [`Refresher`] is dropped or the last other handle to the
    /// store is. A failed refresh is kept in
    /// [`Refresher::last_error`] and tried again next period.
    pub fn refresh_every(
        store: &std::sync::Arc<SegmentsAt>,
        period: std::time::Duration,
    ) -> Refresher {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let weak = std::sync::Arc::downgrade(store);
        let last_error = std::sync::Arc::new(std::sync::Mutex::new(None));
        let errors = std::sync::Arc::clone(&last_error);
        let thread = std::thread::Builder::new()
            .name("cachex-refresh".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(period)
                {
                    let Some(store) = weak.upgrade() else { return };
                    let outcome = store.refresh().err().map(|e| e.to_string());
                    *errors.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
                }
            })
            .ok();
        Refresher {
            stop: Some(tx),
            thread,
            last_error,
        }
    }
}

impl Deref for SegmentsAt {
    type Target = SegmentStore;
    fn deref(&self) -> &SegmentStore {
        &self.store
    }
}
