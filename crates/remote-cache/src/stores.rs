//! The four stores opened on a [`Location`]: each keeps reading and
//! writing its local directory; a remote location materialises it first
//! and publishes what the store wrote.

use std::ops::{Deref, Range};

use memmap_array::{ArrayCache, Row};
use page_alloc::{PageReader, Sample};
use remote_tier::RemoteFile;
use segment_store::SegmentStore;
use shard_store::{ShardStore, StoreItem};
use tensor_core::TensorView;

use crate::journal::{PublishReport, RefreshReport, RemoteDir};
use crate::location::Location;
use crate::{Error, Result};

fn nothing_private(_: &str) -> bool {
    false
}

fn nothing_by_blocks(_: &str, _: u64) -> bool {
    false
}

/// What a local location publishes or refreshes: nothing.
fn local_publish() -> PublishReport {
    PublishReport::default()
}

/// A segment-store cache on a [`Location`]: read, and append.
///
/// Remote: every published segment and index log is materialised in the
/// working directory before the store opens it (the store maps every
/// segment); [`publish`](Self::publish) uploads the segments and index
/// bytes written since, then the commit record. Several writers append to
/// one remote cache when each has its own
/// [`writer_id`](segment_store::Options::writer_id); two writers that
/// write the same segment id cannot both publish it ([`Error::Conflict`]).
#[derive(Debug)]
pub struct RemoteSegments {
    // Dropped before the commit log: the store's files stay while it lives.
    store: SegmentStore,
    remote: Option<RemoteDir>,
}

impl RemoteSegments {
    /// Opens the segment store at `location` with `options`. A reader
    /// whose working directory holds earlier commits opens its store while
    /// the request that learns what was published since is in flight
    /// ([`with_unapplied`](RemoteSegments::with_unapplied)).
    pub fn open(location: &Location, options: segment_store::Options) -> Result<RemoteSegments> {
        let opened = location.open_unapplied(nothing_by_blocks, nothing_private)?;
        match opened.remote {
            Some(remote) => RemoteSegments::with_unapplied(remote, options),
            None => Ok(RemoteSegments {
                store: SegmentStore::open(&opened.dir, options)?,
                remote: None,
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
    /// [`with_remote`](RemoteSegments::with_remote).
    pub fn with_unapplied(
        remote: RemoteDir,
        options: segment_store::Options,
    ) -> Result<RemoteSegments> {
        if !options.read_only || remote.seq() == 0 {
            remote.refresh()?;
            return RemoteSegments::with_remote(remote, options);
        }
        let (next, store) = std::thread::scope(|s| {
            let next = s.spawn(|| remote.fetch_next());
            let store = SegmentStore::open(remote.dir(), options);
            let next = next
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (next, store)
        });
        let (next, store) = (next?, store?);
        if next.is_some() {
            remote.refresh_from(next)?;
            store.refresh()?;
        }
        Ok(RemoteSegments {
            store,
            remote: Some(remote),
        })
    }

    /// Opens the store in the working directory of `remote` (a commit log
    /// opened by the caller, e.g. over a wrapped object store).
    pub fn with_remote(
        remote: RemoteDir,
        options: segment_store::Options,
    ) -> Result<RemoteSegments> {
        let store = SegmentStore::open(remote.dir(), options)?;
        Ok(RemoteSegments {
            store,
            remote: Some(remote),
        })
    }

    /// The store (also reachable through `Deref`).
    pub fn store(&self) -> &SegmentStore {
        &self.store
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Flushes the store, then publishes what it wrote since the last
    /// publish (a no-op for a local cache).
    pub fn publish(&self) -> Result<PublishReport> {
        self.store.flush()?;
        match &self.remote {
            Some(r) => r.publish(),
            None => Ok(local_publish()),
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
        Ok((report, self.store.refresh()?))
    }
}

/// A background thread refreshing a [`RemoteSegments`] on a period
/// ([`RemoteSegments::refresh_every`]); stops when dropped, or when the
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

impl RemoteSegments {
    /// Refreshes `store` every `period` on a background thread, until the
    /// returned [`Refresher`] is dropped or the last other handle to the
    /// store is. A failed refresh is kept in
    /// [`Refresher::last_error`] and tried again next period.
    pub fn refresh_every(
        store: &std::sync::Arc<RemoteSegments>,
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

impl Deref for RemoteSegments {
    type Target = SegmentStore;
    fn deref(&self) -> &SegmentStore {
        &self.store
    }
}

/// Shard-store's scratch space, locks and quarantine never travel.
fn shard_private(path: &str) -> bool {
    ["locks", "scratch", "quarantine"]
        .iter()
        .any(|d| path == *d || path.starts_with(&format!("{d}/")))
}

/// A shard-store root on a [`Location`]: shards published by others are
/// materialised before the store opens; shards this process generates
/// from its source are uploaded by [`publish`](Self::publish).
///
/// One process generates a remote root at a time: two that both write
/// `metadata.json` get [`Error::Conflict`] at the second publish.
#[derive(Debug)]
pub struct RemoteShards<T> {
    store: ShardStore<T>,
    remote: Option<RemoteDir>,
}

impl<T: StoreItem> RemoteShards<T> {
    /// Opens the published root at `location` without a source.
    pub fn open(location: &Location, options: shard_store::Options) -> Result<RemoteShards<T>> {
        let opened = location.open(nothing_by_blocks, shard_private)?;
        let store = ShardStore::open(&opened.dir, options)?;
        Ok(RemoteShards {
            store,
            remote: opened.remote,
        })
    }

    /// Opens the root at `location` over `source`, which generates the
    /// shards not published yet (see [`ShardStore::open_with_source`]).
    pub fn open_with_source<F, I>(
        location: &Location,
        options: shard_store::Options,
        source: F,
    ) -> Result<RemoteShards<T>>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let opened = location.open(nothing_by_blocks, shard_private)?;
        let store = ShardStore::open_with_source(&opened.dir, options, source)?;
        Ok(RemoteShards {
            store,
            remote: opened.remote,
        })
    }

    /// The store (also reachable through `Deref`).
    pub fn store(&self) -> &ShardStore<T> {
        &self.store
    }

    /// The commit log behind a remote root (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Publishes the shards (and metadata) generated since the last
    /// publish. Shards are written by rename once whole, so any moment
    /// is a consistent one to publish.
    pub fn publish(&self) -> Result<PublishReport> {
        match &self.remote {
            Some(r) => r.publish(),
            None => Ok(local_publish()),
        }
    }

    /// Applies the commits published since (more shards, a longer length).
    pub fn refresh(&self) -> Result<RefreshReport> {
        match &self.remote {
            Some(r) => r.refresh(),
            None => Ok(RefreshReport::default()),
        }
    }
}

impl<T> Deref for RemoteShards<T> {
    type Target = ShardStore<T>;
    fn deref(&self) -> &ShardStore<T> {
        &self.store
    }
}

fn bin_by_blocks(path: &str, _: u64) -> bool {
    !path.contains('/') && path.ends_with(".bin")
}

/// A finished memmap-array cache on a [`Location`], read by block ranges:
/// the `.bin` arrays of a remote cache stay sparse files in the local
/// tier (linked into the working directory, mapped by the reader as
/// usual), and each read first fetches the blocks of its rows.
#[derive(Debug)]
pub struct RemoteArrays {
    cache: ArrayCache,
    remote: Option<RemoteDir>,
    /// Per array (schema order): the tier object its file maps (`None`
    /// when copied whole or local) and bytes per row.
    bins: Vec<(Option<RemoteFile>, u64)>,
}

impl RemoteArrays {
    /// Opens the finished cache at `location`.
    pub fn open(location: &Location) -> Result<RemoteArrays> {
        let opened = location.open(bin_by_blocks, nothing_private)?;
        let cache = ArrayCache::open(&opened.dir)?;
        // The objects the arrays map (nothing refreshes the commit log in
        // between: this handle is its only owner yet).
        let bins = cache
            .schema()
            .arrays()
            .iter()
            .map(|a| {
                let file = memmap_array::bin_file(a.name());
                let object = opened.remote.as_ref().and_then(|r| r.object(&file));
                (object, a.row_bytes() as u64)
            })
            .collect::<Vec<_>>();
        // The reader maps each array on its first read, by name. Map every
        // remote one now, while its link still names the object held above:
        // after a refresh that relinks the name, a first read would map the
        // new object while ensures fetch into this one (zeros served).
        for (k, (object, _)) in bins.iter().enumerate() {
            if object.is_some() {
                for i in 0..cache.len() {
                    if cache.array_at(i, k)?.is_some() {
                        break;
                    }
                }
            }
        }
        Ok(RemoteArrays {
            cache,
            remote: opened.remote,
            bins,
        })
    }

    /// The cache. Its rows are local only after
    /// [`ensure_rows`](Self::ensure_rows) (or through [`row`](Self::row),
    /// [`array`](Self::array)); bytes not fetched read as zeros.
    pub fn cache(&self) -> &ArrayCache {
        &self.cache
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Makes rows `rows` of every array local (their blocks fetched in
    /// parallel, the next ones prefetched).
    pub fn ensure_rows(&self, rows: Range<u64>) -> Result<()> {
        let rows = rows.start.min(self.cache.len())..rows.end.min(self.cache.len());
        for (object, row_bytes) in &self.bins {
            if let Some(object) = object {
                object.ensure(rows.start * row_bytes..rows.end * row_bytes)?;
            }
        }
        Ok(())
    }

    /// Row `i`, fetched first (see [`ArrayCache::row`]).
    pub fn row(&self, i: u64) -> Result<Row<'_>> {
        self.ensure_rows(i..i.saturating_add(1))?;
        Ok(self.cache.row(i)?)
    }

    /// Array `name` of row `i`, fetched first (see [`ArrayCache::array`]).
    pub fn array(&self, i: u64, name: &str) -> Result<Option<TensorView<'_>>> {
        if let Some(k) = self.cache.schema().array_index(name)
            && let Some((Some(object), row_bytes)) = self.bins.get(k)
            && i < self.cache.len()
        {
            object.ensure(i * row_bytes..(i + 1) * row_bytes)?;
        }
        Ok(self.cache.array(i, name)?)
    }
}

/// A page-alloc file on a [`Location`], read by block ranges: the file of
/// a remote cache stays a sparse file in the local tier; its header and
/// tables are fetched on open, each sample's run (page) before it is read.
#[derive(Debug)]
pub struct RemotePages {
    reader: PageReader,
    remote: Option<RemoteDir>,
    /// The tier object the reader maps (`None` when copied whole or
    /// local): held, so that its copy stays (the tier never evicts an
    /// object a handle holds) and runs are fetched into the file mapped,
    /// whatever a later commit links the name to.
    object: Option<RemoteFile>,
    /// Per run: first sample, file offset, bytes.
    runs: Vec<(u64, u64, u64)>,
    /// Runs known local: the held object's blocks stay, so each run is
    /// ensured once.
    ready: Vec<std::sync::atomic::AtomicBool>,
}

fn pages_by_blocks(path: &str, _: u64) -> bool {
    path.ends_with(".pages")
}

impl RemotePages {
    /// Opens the page file `file` (a name inside the cache directory,
    /// ending `.pages`) at `location`.
    pub fn open(location: &Location, file: &str) -> Result<RemotePages> {
        let opened = location.open(pages_by_blocks, nothing_private)?;
        RemotePages::open_in(opened.dir, opened.remote, file)
    }

    /// Opens the page file `file` in the working directory of `remote` (a
    /// commit log opened by the caller with [`RemotePages::BY_BLOCKS`]).
    pub fn with_remote(remote: RemoteDir, file: &str) -> Result<RemotePages> {
        RemotePages::open_in(remote.dir().to_path_buf(), Some(remote), file)
    }

    /// The files a page cache reads by blocks (for [`RemoteDir::open`]).
    pub const BY_BLOCKS: crate::journal::ReadByBlocks = pages_by_blocks;

    fn open_in(
        dir: std::path::PathBuf,
        remote: Option<RemoteDir>,
        file: &str,
    ) -> Result<RemotePages> {
        let opened = crate::location::Opened { dir, remote };
        let path = opened.dir.join(file);
        let object = opened.remote.as_ref().and_then(|r| r.object(file));
        if let Some(object) = &object {
            let len = object.len();
            let fixed = (page_alloc::format::HEADER_FIXED_LEN as u64).min(len);
            object.ensure(0..fixed)?;
            let head = read_at(&path, 0, fixed as usize)?;
            let header_len = u64::from(le32(&head, 12));
            let meta_offset = le64(&head, 64);
            // Out-of-file values are left for the reader to report.
            object.ensure(0..header_len.min(len))?;
            object.ensure(meta_offset.min(len)..len)?;
        }
        let reader = PageReader::open(&path)?;
        let runs = if object.is_some() {
            run_table(&reader)
        } else {
            Vec::new()
        };
        let ready = runs
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        Ok(RemotePages {
            reader,
            remote: opened.remote,
            object,
            runs,
            ready,
        })
    }

    /// The reader. Samples are local only after
    /// [`ensure_samples`](Self::ensure_samples) (or through
    /// [`sample`](Self::sample)); bytes not fetched read as zeros.
    pub fn reader(&self) -> &PageReader {
        &self.reader
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Makes the pages of samples `indices` local.
    pub fn ensure_samples(&self, indices: &[usize]) -> Result<()> {
        let Some(object) = &self.object else {
            return Ok(());
        };
        let mut last = None;
        for &i in indices {
            let k = self.runs.partition_point(|r| r.0 <= i as u64);
            let Some(k) = k.checked_sub(1) else { continue };
            if last == Some(k) || self.ready[k].load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            last = Some(k);
            let (_, start, len) = self.runs[k];
            object.ensure(start..start + len)?;
            self.ready[k].store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    /// Sample `index`, its page fetched first (see [`PageReader::sample`]).
    pub fn sample(&self, index: usize) -> Result<Sample<'_>> {
        self.ensure_samples(&[index])?;
        Ok(self.reader.sample(index)?)
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).map_err(Error::io("open", path))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .map_err(Error::io("read", path))?;
    Ok(buf)
}

/// The run table of a validated page file: (first sample, offset, bytes)
/// per run. The reader checked every run against the file at open.
fn run_table(reader: &PageReader) -> Vec<(u64, u64, u64)> {
    let b = reader.bytes();
    let page_size = le64(b, 16);
    let data_offset = le64(b, 40);
    let num_runs = le64(b, 48);
    let runs_offset = le64(b, 72);
    let run_len = page_alloc::format::RUN_LEN as u64;
    (0..num_runs)
        .filter_map(|k| {
            let at = usize::try_from(runs_offset.checked_add(k.checked_mul(run_len)?)?).ok()?;
            let first_page = le64(b, at);
            let len = le64(b, at + 16);
            let first_sample = le64(b, at + 24);
            let start = data_offset.checked_add(first_page.checked_mul(page_size)?)?;
            Some((first_sample, start, len))
        })
        .collect()
}
