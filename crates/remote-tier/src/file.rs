//! [`RemoteFile`]: one object open through the local tier.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::blocks::BlockHashes;
use crate::constants::PLANNED_READ_AHEAD;
use crate::engine::{Expected, Inner, map_fits};
use crate::local::LocalDir;
use crate::object_state::{ObjectState, Reads, lock, open_existing};
use crate::open_files;
use crate::pins::{Lease, PinKind};
use crate::plans::{self, PlanHandle, record::ObjectPlan};
use crate::warm::Warming;
use crate::{Error, Result};

/// An object of the store open through the local tier: a local file that
/// holds the whole object, or a sparse one whose blocks are fetched on
/// [`ensure`](RemoteFile::ensure). Map [`file`](RemoteFile::file) (not the
/// path) to read zero-copy: the handle keeps the local copy from being
/// evicted while it is open, in this process and in others. A handle
/// holds no descriptor of its own: its copy is opened when used, among
/// at most a fixed number a process keeps open (`open_files`), and a
/// mapping outlives the descriptor it was made from.
#[derive(Debug, Clone)]
pub struct RemoteFile {
    state: Arc<ObjectState>,
}

impl RemoteFile {
    /// Opens `name`; with `hashes`, every block fetched from now on is
    /// checked against them before it is kept, and a local copy made
    /// without them is not trusted. With `by_blocks`, a small object not
    /// local yet is left sparse too, not fetched whole. A `leased` handle
    /// (by blocks too) pins only the blocks it leases.
    pub(crate) fn open(
        tier: &Arc<Inner>,
        name: &str,
        expected: &Expected,
        hashes: Option<Arc<BlockHashes>>,
        by_blocks: bool,
        leased: bool,
    ) -> Result<RemoteFile> {
        let by_blocks = by_blocks || leased;
        tier.remote()?.path(name)?;
        let expected = &Expected {
            size: expected.size.or(hashes.as_ref().map(|h| h.size())),
            ..*expected
        };
        let key = LocalDir::key(name);
        let kind = match leased {
            true => PinKind::Blocks,
            false => PinKind::Whole,
        };
        let pin = tier.dir.pin(&key, kind)?;
        let id = open_files::new_id();
        let whole = tier.dir.whole(&key);
        let mut opened = open_existing(&whole)?;
        let mut fetched_whole = false;
        let mut head = None;
        let usable_map = tier
            .read_map(&key)
            .is_some_and(|m| map_fits(&m, hashes.as_deref()));
        if opened.is_none() && !usable_map {
            // Not local: small objects are fetched whole right away (unless
            // the caller reads it in small parts: by blocks, whatever its
            // size).
            let small = match expected.size {
                _ if by_blocks => false,
                Some(s) => s <= tier.config.whole_file_max,
                None => {
                    let info = tier.head(name)?;
                    let small = info.size <= tier.config.whole_file_max;
                    head = Some(info);
                    small
                }
            };
            if small {
                tier.fetch_whole(name, &key, expected, hashes.as_deref())?;
                opened = open_existing(&whole)?;
                fetched_whole = opened.is_some();
            }
        }
        let state = match opened {
            Some(file) => {
                let meta = file.metadata().map_err(Error::io("stat", &whole))?;
                open_files::keep(id, file, &whole, meta.ino());
                ObjectState {
                    tier: Arc::clone(tier),
                    name: name.to_string(),
                    key,
                    path: whole,
                    id,
                    size: meta.len(),
                    blocks: None,
                    hashes: None,
                    ino: meta.ino(),
                    touched: Default::default(),
                    ahead: Default::default(),
                    unsynced: Default::default(),
                    pin: Mutex::new(pin),
                    // A whole copy is never freed by blocks.
                    leased: false,
                    seen_gen: Default::default(),
                    fetched_by_open: AtomicBool::new(fetched_whole),
                }
            }
            None => {
                let (file, map) = tier.sparse_file(name, &key, head, hashes.as_deref())?;
                let path = tier.dir.sparse(&key);
                let ino = file.metadata().map_err(Error::io("stat", &path))?.ino();
                open_files::keep(id, file, &path, ino);
                ObjectState {
                    tier: Arc::clone(tier),
                    name: name.to_string(),
                    key,
                    path,
                    id,
                    size: map.size,
                    blocks: Some(Mutex::new(map)),
                    hashes,
                    ino,
                    touched: Default::default(),
                    ahead: Default::default(),
                    unsynced: Default::default(),
                    pin: Mutex::new(pin),
                    leased,
                    // Never seen: the first lease reads the map again.
                    seen_gen: AtomicU64::new(u64::MAX),
                    fetched_by_open: AtomicBool::new(false),
                }
            }
        };
        let file = RemoteFile {
            state: Arc::new(state),
        };
        if let Some(size) = expected.size
            && size != file.len()
        {
            return Err(file.corrupt(format!("{} bytes, expected {size}", file.len())));
        }
        file.touch();
        Ok(file)
    }

    /// What the handles of this object share (its key, tier, block map).
    #[cfg(test)]
    pub(crate) fn state(&self) -> &Arc<ObjectState> {
        &self.state
    }

    /// Whether this handle was opened by
    /// [`open_leased`](crate::RemoteTier::open_leased): blocks of its copy
    /// that no [`Lease`] holds may be freed while it is open.
    pub fn is_leased(&self) -> bool {
        self.state.leased
    }

    /// A handle of the same object that keeps its copy whole while it
    /// lives (for a mapping of the whole file), checked against the same
    /// block hashes: a new one for a [leased](Self::is_leased) handle,
    /// whose blocks eviction may free, else a clone of this one. Make it
    /// whole ([`ensure`](Self::ensure) of all of it) before mapping it.
    pub fn whole_handle(&self) -> Result<RemoteFile> {
        let s = &self.state;
        if !s.leased {
            return Ok(self.clone());
        }
        let expected = Expected {
            size: Some(s.size),
            blake3: None,
        };
        RemoteFile::open(&s.tier, &s.name, &expected, s.hashes.clone(), true, false)
    }

    /// The tier's eviction generation: it changes whenever a copy or a
    /// block is removed, so a reader that cached "these bytes are local"
    /// under one generation must look again under another.
    pub fn generation(&self) -> u64 {
        self.state.tier.dir.state.generation()
    }

    /// Makes the bytes of `ranges` local and keeps them so until the
    /// returned [`Lease`] drops: leases the blocks that cover them (no
    /// process frees a leased block), learns the blocks freed since this
    /// handle last looked, fetches the missing ones (with read-ahead, as
    /// [`ensure`](Self::ensure)) and marks them used now. On a handle not
    /// opened by [`open_leased`](crate::RemoteTier::open_leased) the whole
    /// copy is kept anyway and the lease holds nothing.
    pub fn lease(&self, ranges: &[Range<u64>]) -> Result<Lease> {
        self.lease_with(ranges, true)
    }

    /// [`lease`](Self::lease) with no read-ahead, for reads that jump (a
    /// row here, a row there) rather than stream, as
    /// [`ensure_exact`](Self::ensure_exact).
    pub fn lease_exact(&self, ranges: &[Range<u64>]) -> Result<Lease> {
        self.lease_with(ranges, false)
    }

    /// [`lease`](Self::lease), with or without read-ahead.
    fn lease_with(&self, ranges: &[Range<u64>], read_ahead: bool) -> Result<Lease> {
        let s = &self.state;
        let root = &s.tier.dir.root;
        if !s.leased {
            match read_ahead {
                true => self.ensure_ranges(ranges)?,
                false => self.ensure_exact_ranges(ranges)?,
            }
            return Ok(Lease::empty(root));
        }
        let blocks = self.covered(ranges)?;
        let lease = Lease::take(root, &s.key, &blocks, s.tier.dir.wait)?;
        match read_ahead {
            true => self.ensure_ranges(ranges)?,
            false => self.ensure_exact_ranges(ranges)?,
        }
        s.touch_blocks(&blocks);
        Ok(lease)
    }

    /// The blocks that cover `ranges` (checked against the size),
    /// ascending, once each; none for a whole copy.
    fn covered(&self, ranges: &[Range<u64>]) -> Result<Vec<u64>> {
        let s = &self.state;
        if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > s.size) {
            return Err(Error::OutOfRange {
                url: s.tier.url.to_string(),
                name: s.name.clone(),
                start: r.start,
                end: r.end,
                size: s.size,
            });
        }
        let Some(blocks) = &s.blocks else {
            return Ok(Vec::new());
        };
        let bs = lock(blocks).block_size;
        let mut wanted: Vec<u64> = ranges
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / bs..=(r.end - 1) / bs)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        Ok(wanted)
    }

    /// The object's name in the store.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The object's size in bytes.
    pub fn len(&self) -> u64 {
        self.state.size
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.state.size == 0
    }

    /// The local file (whole, or sparse with the fetched blocks in place),
    /// opened now if this process had closed it (see the type's docs).
    /// Map or read it after [`ensure`](RemoteFile::ensure) of the bytes
    /// wanted; bytes of blocks not fetched read as zeros. Keep it only as
    /// long as needed: each one kept is a descriptor (a mapping made from
    /// it needs none).
    pub fn file(&self) -> Result<Arc<File>> {
        self.state.file()
    }

    /// Where the local file lives now. Prefer [`file`](RemoteFile::file):
    /// the path may be evicted and refetched once this handle is closed.
    pub fn path(&self) -> &Path {
        &self.state.path
    }

    /// Whether every byte is local.
    pub fn is_complete(&self) -> bool {
        match &self.state.blocks {
            None => true,
            Some(map) => {
                let map = lock(map);
                map.present() == map.blocks()
            }
        }
    }

    /// How many of the object's blocks are local, of how many (a whole
    /// object counts as one block).
    pub fn blocks_present(&self) -> (u64, u64) {
        match &self.state.blocks {
            None => (1, 1),
            Some(map) => {
                let map = lock(map);
                (map.present(), map.blocks())
            }
        }
    }

    /// Makes the bytes `range` local: fetches the missing blocks that
    /// cover it (in parallel, coalesced with any other fetch of the same
    /// block on this machine), then starts fetching the next blocks in the
    /// background. On a handle of
    /// [`open_leased`](crate::RemoteTier::open_leased) this is a
    /// [`lease`](Self::lease) dropped at once: the bytes may be freed as
    /// soon as it returns (hold a lease across the read instead).
    pub fn ensure(&self, range: Range<u64>) -> Result<()> {
        match self.state.leased {
            true => self
                .lease_with(std::slice::from_ref(&range), true)
                .map(drop),
            false => self.ensure_ranges(std::slice::from_ref(&range)),
        }
    }

    /// Makes the bytes of every range of `ranges` local, their missing
    /// blocks fetched at once, and nothing more: no read-ahead, for
    /// reads that jump (a row here, a row there) rather than stream. On a
    /// handle of [`open_leased`](crate::RemoteTier::open_leased) the bytes
    /// may be freed as soon as it returns (see [`ensure`](Self::ensure)).
    pub fn ensure_exact(&self, ranges: &[Range<u64>]) -> Result<()> {
        match self.state.leased {
            true => self.lease_with(ranges, false).map(drop),
            false => self.ensure_exact_ranges(ranges),
        }
    }

    /// [`ensure`](Self::ensure)'s fetch, read-ahead and touch, leases
    /// aside.
    fn ensure_ranges(&self, ranges: &[Range<u64>]) -> Result<()> {
        if let Some((first, last)) = self.fetch_missing(ranges)? {
            let window = self.state.read_ahead(first, last);
            self.prefetch(last + 1, window);
            self.touch();
        }
        Ok(())
    }

    /// [`ensure_exact`](Self::ensure_exact)'s fetch and touch, leases
    /// aside.
    fn ensure_exact_ranges(&self, ranges: &[Range<u64>]) -> Result<()> {
        if self.fetch_missing(ranges)?.is_some() {
            self.touch();
        }
        Ok(())
    }

    /// Fetches the missing blocks that cover `ranges`; the first and last
    /// block they cover (`None`: a whole object, or no bytes asked). A
    /// leased handle first learns the blocks freed since it last looked.
    /// Every read call comes through here once: it is counted here, a hit
    /// or a miss (see [`TierStats::hits`](crate::TierStats::hits)).
    fn fetch_missing(&self, ranges: &[Range<u64>]) -> Result<Option<(u64, u64)>> {
        let s = &self.state;
        let wanted = self.covered(ranges)?;
        let (Some(&first), Some(&last)) = (wanted.first(), wanted.last()) else {
            if s.blocks.is_none() && ranges.iter().any(|r| !r.is_empty()) {
                s.count_read(s.first_read_of_fetched_copy());
            }
            return Ok(None);
        };
        if s.leased {
            s.resync_if_stale();
        }
        let mut missing: Vec<u64> = wanted.into_iter().filter(|&i| !s.has(i)).collect();
        if !missing.is_empty() {
            s.refresh();
            missing.retain(|&i| !s.has(i));
        }
        s.count_read(!missing.is_empty());
        self.fetch_blocks(&missing)?;
        Ok(Some((first, last)))
    }

    /// Starts filling the local tier with the blocks that cover `ranges`,
    /// in their order, in the background (up to the tier's parallelism at
    /// once), and stops after `max_bytes` of blocks fetched — the caller's
    /// share of the budget — or when the returned [`Warming`] is dropped.
    /// Blocks already local cost nothing; a failed fetch is only a miss
    /// (the read that needs the block fetches it again), counted in
    /// [`Warming::failed`].
    pub fn warm(&self, ranges: &[Range<u64>], max_bytes: u64) -> Warming {
        let s = &self.state;
        let mut order = Vec::new();
        if let Some(blocks) = &s.blocks {
            let bs = lock(blocks).block_size;
            let mut seen = std::collections::HashSet::new();
            for r in ranges {
                let r = r.start.min(s.size)..r.end.min(s.size);
                if r.is_empty() {
                    continue;
                }
                for i in r.start / bs..=(r.end - 1) / bs {
                    if seen.insert(i) {
                        order.push(i);
                    }
                }
            }
        }
        let state = Arc::clone(&self.state);
        let block_bytes = move |i: u64| state.block(i).0.end - state.block(i).0.start;
        // Each block is admitted at its own next planned use, so a warm
        // never evicts a block a plan needs sooner.
        let (distances, _) = s.planned_distances(&order);
        let distance: std::collections::HashMap<u64, u64> =
            order.iter().copied().zip(distances).collect();
        let state = Arc::clone(&self.state);
        let fetch = move |i: u64| {
            if state.has(i) {
                return Ok(false);
            }
            state.prefetch_block(i, distance.get(&i).copied().unwrap_or(u64::MAX))
        };
        let workers = s.tier.config.parallelism.max(1);
        Warming::start(order, max_bytes, workers, block_bytes, fetch)
    }

    /// Registers this reader's plan of the object: each `(byte range,
    /// position)` is a read at `position` of the reader's batch clock,
    /// where `0..epoch_len` is this epoch and `epoch_len..2·epoch_len` the
    /// next. Eviction (in every process of the tier) then evicts the
    /// blocks needed furthest ahead first and keeps the nearest. Call
    /// [`PlanHandle::advance`] as batches are read; the plan counts until
    /// the handle is dropped. Empty ranges are left out.
    ///
    /// Fails on a range past the object's end, a position at or past
    /// `2·epoch_len`, or an `epoch_len` whose positions do not fit the
    /// record (`2·epoch_len` must stay below `u32::MAX`).
    pub fn set_plan(&self, uses: &[(Range<u64>, u64)], epoch_len: u64) -> Result<PlanHandle> {
        set_plans(&[(self, uses)], epoch_len)
    }

    /// Makes the blocks fetched without an fsync durable: fsyncs the local
    /// file, then records those blocks as durable in the block map. A
    /// fetch writes its blocks and marks them present at once, durable
    /// only for this boot of the machine (every process reads them from
    /// the page cache; after a reboot or power cut they are fetched
    /// again, never read as they were left). The last handle of an object
    /// in a process does this when it is dropped; call it to choose when.
    pub fn sync(&self) -> Result<()> {
        self.state.settle()
    }

    /// Reads `buf.len()` bytes at `offset`, fetching them first.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        // Held across the read: a leased handle's blocks may go otherwise.
        let _lease = self.lease(std::slice::from_ref(&(offset..end)))?;
        self.state
            .file()?
            .read_exact_at(buf, offset)
            .map_err(Error::io("read", &self.state.path))
    }

    /// Fetches `blocks`, up to the tier's parallelism at once.
    fn fetch_blocks(&self, blocks: &[u64]) -> Result<()> {
        let s = &self.state;
        let runs = s.runs(blocks);
        match runs.as_slice() {
            [] => Ok(()),
            [(first, last)] => s.fetch_run(*first, *last),
            many => durable_fs::Pool::new(s.tier.config.parallelism)
                .try_map(many, |&(first, last)| s.fetch_run(first, last))
                .map(drop),
        }
    }

    /// Starts background fetches of the `window` blocks after `from`, as
    /// far as the tier's free request slots allow.
    ///
    /// While a live plan reads this object, only the blocks of the window
    /// it reads within [`PLANNED_READ_AHEAD`] batches are fetched, each
    /// admitted at its own next use: the next blocks of the file are not
    /// what a shuffled order reads next, and fetching them would evict
    /// blocks the plan needs sooner.
    fn prefetch(&self, from: u64, window: u64) {
        let s = &self.state;
        let Some(blocks) = &s.blocks else { return };
        let total = lock(blocks).blocks();
        let until = from.saturating_add(window).min(total);
        let missing: Vec<u64> = (from..until).filter(|&i| !s.has(i)).collect();
        if missing.is_empty() {
            return;
        }
        let (distances, planned) = s.planned_distances(&missing);
        for (i, distance) in missing.into_iter().zip(distances) {
            if planned && distance > PLANNED_READ_AHEAD {
                continue;
            }
            let Ok(permit) = s.tier.prefetch_slots().try_acquire_owned() else {
                return;
            };
            let state = Arc::clone(&self.state);
            // A failed prefetch is only a miss: the read that needs the
            // block fetches it again and reports the error.
            s.tier.spawn_blocking(move || {
                let _ = state.prefetch_block(i, distance);
                drop(permit);
            });
        }
    }

    /// Checks the complete local copy against `expected`; a copy that does
    /// not match is removed from the local tier.
    pub(crate) fn verify(&self, expected: &Expected) -> Result<()> {
        let Some(want) = expected.blake3 else {
            return Ok(());
        };
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut offset = 0u64;
        while offset < self.state.size {
            let n = (self.state.size - offset).min(buf.len() as u64) as usize;
            self.state
                .file()?
                .read_exact_at(&mut buf[..n], offset)
                .map_err(Error::io("read", &self.state.path))?;
            hasher.update(&buf[..n]);
            offset += n as u64;
        }
        if hasher.finalize().as_bytes() == &want {
            return Ok(());
        }
        let s = &self.state;
        {
            let _tier = s.tier.dir.lock_tier()?;
            let _changing = s.tier.dir.state.changing();
            let mut files = vec![s.path.clone()];
            if s.blocks.is_some() {
                files.insert(0, s.tier.dir.map(&s.key));
                files.push(s.tier.dir.touch(&s.key));
            }
            s.tier.dir.state.bump_generation();
            for f in files {
                let bytes = std::fs::metadata(&f).map_or(0, |m| m.blocks() * 512);
                if durable_fs::remove_and_sync(&f)? {
                    s.tier.dir.state.sub(bytes);
                }
            }
        }
        Err(self.corrupt("BLAKE3 mismatch; the local copy was removed".into()))
    }

    fn corrupt(&self, problem: String) -> Error {
        Error::Corrupt {
            url: self.state.tier.url.to_string(),
            name: self.state.name.clone(),
            problem,
        }
    }

    /// Marks the object used now, for least-recently-used eviction: at
    /// most once a second per object, since a read path calls it for every
    /// range it ensures and eviction order needs no finer clock.
    fn touch(&self) {
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self
            .state
            .touched
            .swap(secs, std::sync::atomic::Ordering::Relaxed)
            != secs
            && let Ok(file) = self.state.file()
        {
            let _ = file.set_modified(now);
        }
    }
}

/// One object's part of a plan: the file and its reads, `(byte range,
/// position)` as [`RemoteFile::set_plan`] takes them.
pub type ObjectReads<'a> = (&'a RemoteFile, &'a Reads);

/// [`RemoteFile::set_plan`] of several objects of one tier in one record
/// (a store of many files, such as a segment store, read in one order):
/// each `(file, uses)` as `set_plan` takes them; a file given twice counts
/// once, with both lists of uses. Fails as `set_plan` does, or on files of
/// different local tiers, or on none at all.
pub fn set_plans(files: &[ObjectReads<'_>], epoch_len: u64) -> Result<PlanHandle> {
    let Some((first, _)) = files.first() else {
        return Err(Error::Runtime("a plan of no object".into()));
    };
    let root = first.state.tier.dir.root.clone();
    // Each object once, with every list of uses it was given.
    let mut grouped: Vec<(&RemoteFile, Vec<&Reads>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (file, uses) in files {
        let state = &file.state;
        if state.tier.dir.root != root {
            return Err(Error::Runtime(format!(
                "a plan over two local tiers: {} and {}",
                root.display(),
                state.tier.dir.root.display()
            )));
        }
        match at.get(state.key.as_str()) {
            Some(&k) => grouped[k].1.push(uses),
            None => {
                at.insert(state.key.as_str(), grouped.len());
                grouped.push((file, vec![uses]));
            }
        }
    }
    let objects = grouped
        .iter()
        .map(|(file, uses)| file.state.object_plan(uses, epoch_len))
        .collect::<Result<Vec<ObjectPlan>>>()?;
    plans::registry::register(&root, objects, epoch_len)
}
