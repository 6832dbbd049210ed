//! [`ObjectState`]: what the handles of one open object share — its
//! local copy, block map, pin and read-ahead — and how its blocks are
//! fetched, checked and made durable.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::blocks::BlockHashes;
use crate::constants::{PLANS_DIR, READ_AHEAD_SHARE, RUN_BYTES, TOUCH_GROUP};
use crate::engine::Inner;
use crate::error::block_mismatch;
use crate::format::BlockMap;
use crate::local::Reservation;
use crate::open_files;
use crate::pins::Pin;
use crate::plans::record::{BlockUse, NONE, ObjectPlan};
use crate::state::{Stat, units};
use crate::victims::Admit;
use crate::{Error, Result};

/// Reads of one object, `(byte range, position)` each: what
/// [`RemoteFile::set_plan`](crate::RemoteFile::set_plan) takes.
pub(crate) type Reads = [(Range<u64>, u64)];

/// The state of one open object, shared by its handles and prefetches.
#[derive(Debug)]
pub(crate) struct ObjectState {
    pub(crate) tier: Arc<Inner>,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) path: PathBuf,
    /// This handle's entry in the process's set of open copies.
    pub(crate) id: u64,
    pub(crate) size: u64,
    /// `None` for a whole object; the blocks known present otherwise.
    pub(crate) blocks: Option<Mutex<BlockMap>>,
    /// What each fetched block is checked against, when the publisher
    /// recorded it (its block size is the map's).
    pub(crate) hashes: Option<Arc<BlockHashes>>,
    /// The local file's inode: block maps on disk are only trusted (and
    /// only written) while the path still names this file, and the file
    /// is opened again only while it does.
    pub(crate) ino: u64,
    /// The second (since the epoch) of the last touch.
    pub(crate) touched: std::sync::atomic::AtomicU64,
    /// Where the next sequential read would start, and the read-ahead
    /// window it gets, in blocks.
    pub(crate) ahead: Mutex<ReadAhead>,
    /// Whether this handle marked blocks present without fsyncing them
    /// (see [`sync`](crate::RemoteFile::sync)).
    pub(crate) unsynced: std::sync::atomic::AtomicBool,
    /// Keeps the copy from eviction (whole, or the blocks leased); taken
    /// again in a forked child.
    pub(crate) pin: Mutex<Pin>,
    /// Opened by [`open_leased`](crate::RemoteTier::open_leased): blocks
    /// not leased may be freed while it is open.
    pub(crate) leased: bool,
    /// The tier's generation when the block map in memory was last made
    /// equal to the disk's (a changed generation: blocks may be gone).
    pub(crate) seen_gen: AtomicU64,
    /// The open fetched the whole copy and no read has been counted
    /// since: the first read waited on that fetch, a miss.
    pub(crate) fetched_by_open: AtomicBool,
}

impl Drop for ObjectState {
    /// The last handle of the object in this process makes the blocks it
    /// fetched durable (best effort: a failure leaves them unsynced, which
    /// the next boot fetches again), and closes its copy.
    fn drop(&mut self) {
        let _ = self.settle();
        open_files::forget(self.id);
    }
}

/// The read-ahead of one open object: none until a read continues the
/// last one (or starts inside what was read ahead) — or an object's first
/// read starts at its beginning —, then a window that doubles while reads
/// stay sequential; a jump turns it off again. Random reads (a map-style
/// `dataset[i]` in a shuffled order) thus fetch only the blocks they read:
/// a window read ahead at every jump would be evicted unread under a
/// budget, and fetch more than the reads.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct ReadAhead {
    /// The block after the last read (0 before the first).
    next: u64,
    /// The window read ahead after the last read (0: none).
    window: u64,
    /// Whether a read has been seen.
    started: bool,
}

impl ReadAhead {
    /// The window after a read of blocks `first..=last`: `initial` when the
    /// read continues a read that had none (or is the object's first read,
    /// at block 0), doubled (up to `most`) when it continues one that had a
    /// window, 0 after a jump (`initial` = 0 turns read-ahead off).
    fn after_read(&mut self, first: u64, last: u64, initial: u64, most: u64) -> u64 {
        let sequential = if self.started {
            first >= self.next.saturating_sub(1) && first <= self.next.saturating_add(self.window)
        } else {
            first == 0
        };
        self.window = match (sequential, self.window) {
            (false, _) => 0,
            (true, 0) => initial,
            (true, w) => w.saturating_mul(2).min(most.max(initial)),
        };
        self.started = true;
        self.next = last.saturating_add(1);
        self.window
    }
}

impl ObjectState {
    /// Counts one read call in the tier's statistics: a miss when it
    /// `fetched` (or waited on a fetch), else a hit. One relaxed add: the
    /// hit path pays nothing more.
    pub(crate) fn count_read(&self, fetched: bool) {
        let stat = match fetched {
            true => Stat::Misses,
            false => Stat::Hits,
        };
        self.tier.dir.state.count(stat, 1);
    }

    /// Whether this is the first read of a whole copy its open fetched
    /// (and from now on, no longer).
    pub(crate) fn first_read_of_fetched_copy(&self) -> bool {
        self.fetched_by_open.load(Ordering::Relaxed)
            && self.fetched_by_open.swap(false, Ordering::Relaxed)
    }

    /// The local file, from the process's set of open copies or opened
    /// again by its path (read-write for a sparse one, which fetches write
    /// into). In a forked child, the object is pinned for the child first.
    pub(crate) fn file(&self) -> Result<Arc<File>> {
        {
            let mut pin = self.pin.lock().unwrap_or_else(|p| p.into_inner());
            if !pin.is_own() {
                let kind = pin.kind();
                *pin = self.tier.dir.pin(&self.key, kind)?;
            }
        }
        if let Some(file) = open_files::get(self.id) {
            return Ok(file);
        }
        let opened = match self.blocks {
            Some(_) => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&self.path),
            None => File::open(&self.path),
        };
        let file = opened.map_err(Error::io("open", &self.path))?;
        let ino = file
            .metadata()
            .map_err(Error::io("stat", &self.path))?
            .ino();
        if ino != self.ino {
            return Err(Error::Corrupt {
                url: self.tier.url.to_string(),
                name: self.name.clone(),
                problem: format!(
                    "its local copy {} was replaced while this handle had it closed; \
                     open the object again",
                    self.path.display()
                ),
            });
        }
        Ok(open_files::keep(self.id, file, &self.path, ino))
    }

    /// Whether block `i` is known present (always, for a whole object).
    pub(crate) fn has(&self, i: u64) -> bool {
        self.blocks.as_ref().is_none_or(|m| lock(m).has(i))
    }

    /// The byte range of block `i` and the etag its request requires:
    /// the object's, unless blocks are checked against their hashes, which
    /// already tell any other bytes from the published ones (and so keep
    /// reading an object that was replaced by the same bytes again).
    pub(crate) fn block(&self, i: u64) -> (Range<u64>, String) {
        match &self.blocks {
            Some(m) => {
                let m = lock(m);
                let etag = match self.hashes {
                    Some(_) => String::new(),
                    None => m.etag.clone(),
                };
                (m.block_range(i), etag)
            }
            None => (0..0, String::new()),
        }
    }

    /// Whether the sparse path still names this handle's file.
    pub(crate) fn current(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Learns the blocks other processes fetched since.
    pub(crate) fn refresh(&self) {
        let Some(m) = &self.blocks else { return };
        if !self.current() {
            return;
        }
        // The map read under the lock: a resync of another thread (the
        // disk's map for a new generation) never comes between this read
        // and its merge, which would bring freed blocks back.
        let mut mine = lock(m);
        if let Some(disk) = self.tier.read_map(&self.key)
            && disk.same_copy(&mine)
        {
            mine.merge(&disk);
        }
    }

    /// Makes the block map in memory the disk's when the tier's
    /// generation moved since this handle last looked (blocks may have
    /// been freed): replaced, not merged, so no freed block stays known.
    /// A caller that reads blocks leases them first: a block freed before
    /// its lease moved the generation, and none is freed after.
    pub(crate) fn resync_if_stale(&self) {
        let Some(m) = &self.blocks else { return };
        let generation = self.tier.dir.state.generation();
        if self.seen_gen.load(Ordering::Acquire) == generation {
            return;
        }
        if self.current() {
            let mut mine = lock(m);
            match self.tier.read_map(&self.key) {
                Some(disk) if disk.same_copy(&mine) => *mine = disk,
                _ => {
                    *mine =
                        BlockMap::new(mine.block_size, mine.size, mine.etag.clone(), mine.checked)
                }
            }
        }
        self.seen_gen.store(generation, Ordering::Release);
    }

    /// Records the blocks `blocks` present, in memory and (while the path
    /// still names this file) in the block map on disk, with one write of
    /// the map: durable (their bytes fsynced by the caller) without
    /// `boot`, unsynced (written in boot `boot`, not fsynced) with it.
    /// Returns the bytes (in page units) of the blocks that were not
    /// present before. Call with the tier lock held.
    fn mark_all(
        &self,
        blocks: std::ops::RangeInclusive<u64>,
        boot: Option<[u8; 16]>,
    ) -> Result<u64> {
        // A copy replaced meanwhile is no longer the tier's: its bytes
        // leave with its last handle, and are not counted.
        let current = self.current();
        let mut fresh = 0u64;
        self.update_map(false, |mine| {
            for i in blocks {
                if !mine.has(i) {
                    fresh += units(mine.block_range(i));
                }
                match boot {
                    Some(boot) => mine.set_unsynced(i, boot),
                    None => mine.set(i),
                }
            }
        })?;
        Ok(if current { fresh } else { 0 })
    }

    /// Applies `change` to the block map on disk (the authority, while the
    /// path still names this file and it describes the same copy; else
    /// to the one in memory), makes the result this handle's, and (while
    /// the path still names this file) writes it: durably when `durable`
    /// or when no block is left unsynced, else without an fsync (a map of
    /// unsynced blocks describes the page cache of this boot: it need not
    /// outlive it). Starting from the disk's map, a handle never writes
    /// back a block another process freed. Call with the tier lock held.
    fn update_map(&self, durable: bool, change: impl FnOnce(&mut BlockMap)) -> Result<()> {
        let Some(m) = &self.blocks else { return Ok(()) };
        let current = self.current();
        let (encoded, unsynced) = {
            let mut mine = lock(m);
            let mut next = match current.then(|| self.tier.read_map(&self.key)).flatten() {
                Some(disk) if disk.same_copy(&mine) => disk,
                _ => mine.clone(),
            };
            change(&mut next);
            *mine = next;
            (mine.encode(), mine.unsynced().is_some())
        };
        if current {
            let map = self.tier.dir.map(&self.key);
            match durable || !unsynced {
                true => durable_fs::write_atomic(&map, &encoded)?,
                false => durable_fs::replace_unsynced(&map, &encoded)?,
            }
        }
        Ok(())
    }

    /// Writes the fetched bytes of blocks `first..=last` (starting at byte
    /// `offset`) into the local file and marks them present: unsynced
    /// where this boot is known (no fsync on the read path), else fsynced
    /// first.
    /// The reservation made for the fetch is settled to the blocks that
    /// were not present yet.
    fn keep_fetched(
        &self,
        first: u64,
        last: u64,
        offset: u64,
        bytes: &[u8],
        reserved: Reservation<'_>,
    ) -> Result<()> {
        let file = self.file()?;
        file.write_all_at(bytes, offset)
            .map_err(Error::io("write block", &self.path))?;
        let boot = durable_fs::boot_id();
        if boot.is_none() {
            file.sync_data().map_err(Error::io("fsync", &self.path))?;
        }
        {
            let _tier = self.tier.dir.lock_tier()?;
            let _changing = self.tier.dir.state.changing();
            let fresh = self.mark_all(first..=last, boot)?;
            reserved.settle(fresh);
        }
        if boot.is_some() {
            self.unsynced.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Makes every block unsynced when this starts durable (see
    /// [`RemoteFile::sync`](crate::RemoteFile::sync)): the blocks any process of this boot marked
    /// unsynced before the fsync are covered by it, since each wrote its
    /// bytes before marking them.
    pub(crate) fn settle(&self) -> Result<()> {
        let Some(m) = &self.blocks else { return Ok(()) };
        if !self.unsynced.swap(false, Ordering::Relaxed) || !self.current() {
            return Ok(());
        }
        self.refresh();
        let Some((_, before)) = lock(m).unsynced() else {
            return Ok(());
        };
        self.file()?
            .sync_data()
            .map_err(Error::io("fsync", &self.path))?;
        let _tier = self.tier.dir.lock_tier()?;
        // Durably even if others marked blocks unsynced meanwhile: this
        // write's directory fsync is what makes the sparse file's name
        // durable with the first durable block. Only blocks the disk's
        // map still marks unsynced are promoted: one freed since is not
        // brought back.
        self.update_map(true, |mine| {
            for i in before {
                if mine.is_unsynced(i) {
                    mine.set(i);
                }
            }
        })
    }
}

/// Opens `path` read-only if it exists.
pub(crate) fn open_existing(path: &Path) -> Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("open", path)(e)),
    }
}

/// Locks a block map; a panic elsewhere cannot leave one half-updated
/// (updates are single bit sets), so a poisoned lock is taken as is.
pub(crate) fn lock(m: &Mutex<BlockMap>) -> MutexGuard<'_, BlockMap> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ObjectState {
    /// The read-ahead window after a read of blocks `first..=last`.
    pub(crate) fn read_ahead(&self, first: u64, last: u64) -> u64 {
        let config = &self.tier.config;
        let most = config
            .max_prefetch_blocks
            .min(self.read_ahead_cap(config.tier_budget));
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        ahead.after_read(first, last, config.prefetch_blocks.min(most), most)
    }

    /// The object's block size (`u64::MAX` for one fetched whole).
    fn block_size(&self) -> u64 {
        self.blocks
            .as_ref()
            .map_or(u64::MAX, |m| lock(m).block_size)
            .max(1)
    }

    /// The most blocks of this object a read-ahead may have in the tier
    /// at once: a quarter of a `budget` of its blocks. More would evict
    /// what the reads need (blocks of the run being read, fetched ahead
    /// earlier) in a tier of a few blocks, and count reads over budget.
    fn read_ahead_cap(&self, budget: u64) -> u64 {
        let bs = self.block_size();
        budget / bs / READ_AHEAD_SHARE
    }

    /// `blocks` (ascending) as runs of adjacent blocks, each inside one
    /// granule (see [`granule`](Self::granule)): what one request fetches.
    pub(crate) fn runs(&self, blocks: &[u64]) -> Vec<(u64, u64)> {
        let bs = self.block_size();
        let per = (RUN_BYTES / bs).max(1);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &i in blocks {
            match runs.last_mut() {
                Some((first, last)) if i == *last + 1 && i / per == *first / per => *last = i,
                _ => runs.push((i, i)),
            }
        }
        runs
    }

    /// The granule of block `i`: the aligned group of blocks (8 MiB, or
    /// one block where blocks are larger) whose fetches one fetch lock
    /// serialises machine-wide, so that no block is fetched twice.
    fn granule(&self, i: u64) -> u64 {
        let bs = self.block_size();
        i / (RUN_BYTES / bs).max(1)
    }

    /// Fetches the missing blocks of `first..=last` (one granule), each
    /// run of them in one request, each block checked against its hash as
    /// [`fetch_block`](Self::fetch_block) checks one, then marks them all;
    /// under the granule's fetch lock, so that two fetchers on the machine
    /// never fetch one block twice.
    pub(crate) fn fetch_run(&self, first: u64, last: u64) -> Result<()> {
        if first == last {
            return self.fetch_block(first);
        }
        if (first..=last).all(|i| self.has(i)) {
            return Ok(());
        }
        let _fetching = self
            .tier
            .dir
            .fetch_lock(&self.key, Some(self.granule(first)))?;
        self.refresh();
        // What another fetcher left missing, in runs of its own.
        let mut missing: Vec<(u64, u64)> = Vec::new();
        for i in (first..=last).filter(|&i| !self.has(i)) {
            match missing.last_mut() {
                Some((_, end)) if *end + 1 == i => *end = i,
                _ => missing.push((i, i)),
            }
        }
        for (a, b) in missing {
            self.fetch_locked_run(a, b)?;
        }
        Ok(())
    }

    /// Fetches blocks `first..=last` in one request, the granule's fetch
    /// lock held by the caller.
    fn fetch_locked_run(&self, first: u64, last: u64) -> Result<()> {
        let (head, etag) = self.block(first);
        let range = head.start..self.block(last).0.end;
        let etag = (!etag.is_empty()).then_some(etag);
        let reserved = self.tier.reserve(units(range.clone()))?;
        let mut bytes = self.tier.get(&self.name, range.clone(), etag.clone())?;
        if let Some(h) = &self.hashes {
            let bad = |bytes: &[u8]| {
                (first..=last).find_map(|i| {
                    let r = self.block(i).0;
                    let at = (r.start - range.start) as usize..(r.end - range.start) as usize;
                    match bytes.get(at) {
                        Some(b) => {
                            let (good, got) = h.check_block(i, b);
                            (!good).then_some((i, got))
                        }
                        None => Some((i, [0u8; 32])),
                    }
                })
            };
            // As for one block: a second fetch absorbs a corruption in
            // transit, a second mismatch is the store's bytes.
            if bad(&bytes).is_some() {
                bytes = self.tier.get(&self.name, range.clone(), etag)?;
                if let Some((i, got)) = bad(&bytes) {
                    return Err(block_mismatch(
                        &self.tier.url,
                        &self.name,
                        &self.path,
                        h,
                        i,
                        got,
                    ));
                }
            }
        }
        self.keep_fetched(first, last, range.start, &bytes, reserved)
    }

    /// Fetches block `i` of `obj` unless it is present: one fetcher per
    /// block machine-wide; bytes written before the block map says so
    /// (see [`keep_fetched`](Self::keep_fetched)).
    pub(crate) fn fetch_block(&self, i: u64) -> Result<()> {
        self.fetch_block_for(i, Admit::Read).map(drop)
    }

    /// Fetches block `i`, whose next planned use is `distance` batches
    /// ahead (`u64::MAX`: none), ahead of its reads: only into room the
    /// tier has or may free for it (see [`Admit::Prefetch`]). Whether it is
    /// local.
    pub(crate) fn prefetch_block(&self, i: u64, distance: u64) -> Result<bool> {
        self.fetch_block_for(i, Admit::Prefetch { distance })
    }

    /// The next planned use of each of `blocks` (`u64::MAX` where none),
    /// and whether a live plan reads this object at all.
    pub(crate) fn planned_distances(&self, blocks: &[u64]) -> (Vec<u64>, bool) {
        let uses = crate::plans::next_uses(&self.tier.dir.root);
        let planned = uses.plans(&self.key);
        let object = uses.object(&self.key);
        let distances = blocks
            .iter()
            .map(|&b| object.distance(b).unwrap_or(u64::MAX))
            .collect();
        (distances, planned)
    }

    /// [`fetch_block`](Self::fetch_block) making room as `admit` allows;
    /// whether the block is local.
    fn fetch_block_for(&self, i: u64, admit: Admit) -> Result<bool> {
        if self.has(i) {
            return Ok(true);
        }
        let _fetching = self.tier.dir.fetch_lock(&self.key, Some(self.granule(i)))?;
        self.refresh();
        if self.has(i) {
            return Ok(true);
        }
        let (range, etag) = self.block(i);
        let etag = (!etag.is_empty()).then_some(etag);
        let Some(reserved) = self.tier.make_room(units(range.clone()), admit)? else {
            return Ok(false);
        };
        let mut bytes = self.tier.get(&self.name, range.clone(), etag.clone())?;
        if let Some(h) = &self.hashes {
            // Checked before a byte is written: a bad block never reaches
            // the local file. One more fetch absorbs a corruption in
            // transit; a second mismatch is the store's bytes.
            let (good, _) = h.check_block(i, &bytes);
            if !good {
                bytes = self.tier.get(&self.name, range.clone(), etag)?;
                let (good, got) = h.check_block(i, &bytes);
                if !good {
                    return Err(block_mismatch(
                        &self.tier.url,
                        &self.name,
                        &self.path,
                        h,
                        i,
                        got,
                    ));
                }
            }
        }
        self.keep_fetched(i, i, range.start, &bytes, reserved)?;
        Ok(true)
    }

    /// Marks blocks `blocks` used now in the object's touch clocks (the
    /// LRU order of blocks, a clock per group of
    /// [`TOUCH_GROUP`]), best effort. The
    /// clocks' file is opened for the call, not kept: a handle lives as
    /// long as its store links the object (100,000 segments' handles would
    /// hold as many descriptors), while the process's open copies are
    /// bounded (`open_files`).
    pub(crate) fn touch_blocks(&self, blocks: &[u64]) {
        if blocks.is_empty() {
            return;
        }
        let now = self.tier.dir.state.tick();
        let Ok(f) = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.tier.dir.touch(&self.key))
        else {
            return;
        };
        let mut last = None;
        for &b in blocks {
            let group = b / TOUCH_GROUP;
            if last != Some(group) {
                let _ = f.write_all_at(&now.to_le_bytes(), group * 8);
                last = Some(group);
            }
        }
    }

    /// This object's part of a plan record: its blocks' uses in every list
    /// of `uses` (see [`RemoteFile::set_plan`](crate::RemoteFile::set_plan)).
    pub(crate) fn object_plan(&self, uses: &[&Reads], epoch_len: u64) -> Result<ObjectPlan> {
        let state = self;
        let root = &state.tier.dir.root;
        let bad = |problem: String| {
            Error::io("register plan", root.join(PLANS_DIR))(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: {problem}", state.name),
            ))
        };
        if epoch_len.saturating_mul(2) >= u64::from(NONE) {
            return Err(bad(format!("epoch length {epoch_len} too large")));
        }
        let block_size = match &state.blocks {
            Some(map) => map.lock().unwrap_or_else(|p| p.into_inner()).block_size,
            None => state.size.max(1),
        };
        let mut by_block: HashMap<u32, BlockUse> = HashMap::new();
        for (range, position) in uses.iter().copied().flatten() {
            if range.start >= range.end {
                continue;
            }
            if range.end > state.size {
                return Err(Error::OutOfRange {
                    url: state.tier.url.to_string(),
                    name: state.name.clone(),
                    start: range.start,
                    end: range.end,
                    size: state.size,
                });
            }
            if *position >= epoch_len.saturating_mul(2) {
                return Err(bad(format!(
                    "position {position} outside the two epochs of {epoch_len} batches"
                )));
            }
            let position = *position as u32;
            let first = range.start / block_size;
            let last = (range.end - 1) / block_size;
            for block in first..=last {
                let Ok(block) = u32::try_from(block) else {
                    return Err(bad(format!("block {block} past the record's range")));
                };
                by_block
                    .entry(block)
                    .or_insert_with(|| BlockUse::unused(block))
                    .add(position, epoch_len);
            }
        }
        let mut blocks: Vec<BlockUse> = by_block.into_values().collect();
        blocks.sort_unstable_by_key(|u| u.block);
        Ok(ObjectPlan {
            key: state.key.clone(),
            block_size,
            uses: blocks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ReadAhead;

    #[test]
    fn the_read_ahead_grows_while_reads_stay_sequential() {
        let mut ahead = ReadAhead::default();
        let windows: Vec<u64> = (0..7).map(|b| ahead.after_read(b, b, 2, 16)).collect();
        assert_eq!(windows, [2, 4, 8, 16, 16, 16, 16]);
        // A read inside the window read ahead still counts as sequential.
        assert_eq!(ahead.after_read(12, 13, 2, 16), 16);
        // A jump reads nothing ahead; a read that continues it starts over.
        assert_eq!(ahead.after_read(500, 500, 2, 16), 0);
        assert_eq!(ahead.after_read(501, 502, 2, 16), 2);
        assert_eq!(ahead.after_read(503, 503, 2, 16), 4);
        // Off stays off.
        let mut off = ReadAhead::default();
        assert_eq!((0..4).map(|b| off.after_read(b, b, 0, 16)).sum::<u64>(), 0);
    }

    #[test]
    fn random_reads_read_nothing_ahead() {
        let mut ahead = ReadAhead::default();
        // A first read past the start, then jumps: no window at any of them.
        for b in [40, 7, 93, 18, 61, 2, 77] {
            assert_eq!(ahead.after_read(b, b + 1, 2, 16), 0, "block {b}");
        }
        // Two reads in a row are a sequence again.
        assert_eq!(ahead.after_read(79, 79, 2, 16), 2);
    }
}
