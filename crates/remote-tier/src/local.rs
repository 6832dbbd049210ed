//! The local tier directory: its names and locks, the listing and count
//! of its copies, and the reservations fetches take in the count.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use std::time::SystemTime;

use durable_fs::FileLock;

use crate::constants::{
    BLOCKS, LOCK_FILE, LOCKS_DIR, MAX_KEY, OBJECTS_DIR, SPARSE, TMP_DIR, TOUCH, TOUCH_GROUP, WHOLE,
};
use crate::format::{BlockMap, MAX_MAP_BYTES};
use crate::pins::{self, Pin, PinKind, Word};
use crate::state::{TierState, meta_bytes, units};
use crate::{Error, Result};

/// The local tier's directories.
#[derive(Debug)]
pub(crate) struct LocalDir {
    pub(crate) root: PathBuf,
    objects: PathBuf,
    locks: PathBuf,
    pub(crate) tmp: PathBuf,
    /// The longest wait for a lock another process holds: a fetch it
    /// guards ends within a call's bound, so a holder past it has stopped.
    pub(crate) wait: Duration,
    /// The mapped `tier.state`: counted bytes, generation, statistics.
    pub(crate) state: TierState,
    /// Scans of `objects/` this handle made (what tests count).
    #[cfg(test)]
    pub(crate) scans: std::sync::atomic::AtomicU64,
}

/// What one eviction pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Bytes the local tier held before the pass (allocated on disk).
    pub bytes_before: u64,
    /// Bytes it holds after.
    pub bytes_after: u64,
    /// Objects whose local copies were removed.
    pub evicted: u64,
    /// Objects kept over budget because a reader has them open (whole).
    pub pinned: u64,
    /// Blocks freed inside copies (hole-punched), open ones included.
    pub punched: u64,
}

impl LocalDir {
    /// Opens (creating) the tier directory and sweeps what dead processes
    /// left: their fetches' temporary files, fetch-lock files no one
    /// holds, and the pin records of dead processes, whose reservations in
    /// flight leave the count (under `tier.lock`: [`held`](Self::held)).
    pub(crate) fn open(root: &Path, wait: Duration) -> Result<LocalDir> {
        for d in ["", OBJECTS_DIR, LOCKS_DIR, TMP_DIR] {
            let d = root.join(d);
            std::fs::create_dir_all(&d).map_err(Error::io("create directory", &d))?;
        }
        let dir = LocalDir {
            root: root.to_path_buf(),
            objects: root.join(OBJECTS_DIR),
            locks: root.join(LOCKS_DIR),
            tmp: root.join(TMP_DIR),
            wait,
            state: TierState::open(root)?,
            #[cfg(test)]
            scans: Default::default(),
        };
        durable_fs::remove_dead_temp_files(&dir.tmp);
        dir.sweep_locks()?;
        {
            let _tier = dir.lock_tier()?;
            dir.check_all()?;
        }
        Ok(dir)
    }

    /// The file-name key of an object name: `/` and `%` escaped, long names
    /// shortened with a hash of the whole name.
    pub(crate) fn key(name: &str) -> String {
        let escaped = name.replace('%', "%25").replace('/', "%2F");
        if escaped.len() <= MAX_KEY {
            return escaped;
        }
        let mut cut = 96;
        while !escaped.is_char_boundary(cut) {
            cut -= 1;
        }
        let hash = blake3::hash(name.as_bytes()).to_hex();
        format!("{}~{}", &escaped[..cut], &hash[..32])
    }

    pub(crate) fn whole(&self, key: &str) -> PathBuf {
        self.objects.join(format!("{key}{WHOLE}"))
    }

    pub(crate) fn sparse(&self, key: &str) -> PathBuf {
        self.objects.join(format!("{key}{SPARSE}"))
    }

    pub(crate) fn map(&self, key: &str) -> PathBuf {
        self.objects.join(format!("{key}{BLOCKS}"))
    }

    pub(crate) fn touch(&self, key: &str) -> PathBuf {
        self.objects.join(format!("{key}{TOUCH}"))
    }

    /// The block map of `key` on disk, if there is a valid one, without
    /// the unsynced blocks of another boot (their bytes may be gone).
    pub(crate) fn read_map(&self, key: &str) -> Option<BlockMap> {
        let bytes = durable_fs::read_capped(&self.map(key), MAX_MAP_BYTES).ok()?;
        let mut map = BlockMap::decode(&bytes).ok()?;
        map.keep_unsynced_of(durable_fs::boot_id());
        Some(map)
    }

    /// The touch clocks of `key`'s blocks (0 where never leased): each
    /// block its group's (see [`TOUCH_GROUP`]).
    pub(crate) fn read_touch(&self, key: &str, blocks: u64) -> Vec<u64> {
        let mut groups = vec![0u64; blocks.div_ceil(TOUCH_GROUP) as usize];
        if let Ok(bytes) = std::fs::read(self.touch(key)) {
            for (c, w) in groups.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                *c = u64::from_le_bytes(b);
            }
        }
        (0..blocks)
            .map(|b| groups[(b / TOUCH_GROUP) as usize])
            .collect()
    }

    /// Held by every open handle of the object: eviction skips an object
    /// that any living process pins whole, and frees only unleased blocks
    /// of one pinned by blocks (see [`crate::pins`]).
    pub(crate) fn pin(&self, key: &str, kind: PinKind) -> Result<Pin> {
        Pin::take(&self.root, key, self.wait, kind)
    }

    /// The lock of whoever fetches block `block` (or the whole object):
    /// one fetch per block machine-wide, the others wait and find it done.
    /// The lock file goes when the lock is dropped: it guards one fetch,
    /// and a tier that kept one per block ever fetched would grow without
    /// bound.
    pub(crate) fn fetch_lock(&self, key: &str, block: Option<u64>) -> Result<FileLock> {
        let name = match block {
            Some(i) => format!("{key}.{i}.fetch"),
            None => format!("{key}.all.fetch"),
        };
        Ok(FileLock::exclusive_live_within(&self.locks.join(name), self.wait)?.remove_on_drop())
    }

    /// The tier lock: held (briefly) while a block map is rewritten, a
    /// sparse file created, or objects evicted.
    pub(crate) fn lock_tier(&self) -> Result<FileLock> {
        Ok(FileLock::exclusive_within(
            &self.root.join(LOCK_FILE),
            self.wait,
        )?)
    }

    /// Local objects by key, from one listing of `objects/` and a `stat`
    /// of each file.
    pub(crate) fn scan(&self) -> Result<HashMap<String, Found>> {
        #[cfg(test)]
        self.scans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut found: HashMap<String, Found> = HashMap::new();
        let entries =
            std::fs::read_dir(&self.objects).map_err(Error::io("list directory", &self.objects))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list directory", &self.objects))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let (key, data, sparse) = if let Some(k) = name.strip_suffix(WHOLE) {
                (k, true, false)
            } else if let Some(k) = name.strip_suffix(SPARSE) {
                (k, true, true)
            } else if let Some(k) = name.strip_suffix(BLOCKS) {
                (k, false, true)
            } else if let Some(k) = name.strip_suffix(TOUCH) {
                (k, false, true)
            } else {
                continue;
            };
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Removed by another process meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("stat", &entry.path())(e)),
            };
            let slot = found.entry(key.to_string()).or_insert(Found {
                bytes: 0,
                used: SystemTime::UNIX_EPOCH,
                sparse,
                whole: false,
            });
            slot.bytes += meta.blocks() * 512;
            slot.sparse |= sparse;
            slot.whole |= data && !sparse;
            if data {
                slot.used = slot
                    .used
                    .max(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
            }
        }
        Ok(found)
    }

    /// Bytes the local tier holds on disk (sparse files count only their
    /// fetched blocks).
    pub(crate) fn usage(&self) -> Result<u64> {
        Ok(self.scan()?.values().map(|v| v.bytes).sum())
    }

    /// What the count holds for the copy of `key` (`found`, as a scan saw
    /// it): a whole copy its allocated bytes; a sparse copy its metadata
    /// allowance ([`meta_bytes`]) and the pages of the blocks its map
    /// marks present — exactly what its creation and its fetches added.
    /// A sparse file without a valid map counts what its files allocate.
    pub(crate) fn counted(&self, key: &str, found: &Found) -> u64 {
        if !found.sparse {
            return found.bytes;
        }
        let whole = if found.whole {
            std::fs::metadata(self.whole(key)).map_or(0, |m| m.blocks() * 512)
        } else {
            0
        };
        self.sparse_counted(key) + whole
    }

    /// What the count holds for the sparse copy of `key` (its map, touch
    /// clocks and data): see [`counted`](Self::counted).
    pub(crate) fn sparse_counted(&self, key: &str) -> u64 {
        let Some(map) = self.read_map(key) else {
            return [self.map(key), self.sparse(key), self.touch(key)]
                .iter()
                .filter_map(|p| std::fs::metadata(p).ok())
                .map(|m| m.blocks() * 512)
                .sum();
        };
        let data: u64 = (0..map.blocks())
            .filter(|&b| map.has(b))
            .map(|b| units(map.block_range(b)))
            .sum();
        meta_bytes(map.blocks(), map.etag.len()) + data
    }

    /// The pin records of the living processes (call with `tier.lock`
    /// held): dead processes' records are removed, and their reservations
    /// in flight, never settled, taken off the count.
    pub(crate) fn held(&self) -> Result<pins::Held> {
        let held = pins::held(&self.root)?;
        if held.dead_reserved > 0 {
            let _changing = self.state.changing();
            self.state.sub(held.dead_reserved);
        }
        Ok(held)
    }

    /// Makes the count of `tier.state` trustworthy (call with `tier.lock`
    /// held): rebuilt when a holder died mid-change, the boot changed, or
    /// the file is new or damaged — to what each copy counts
    /// ([`counted`](Self::counted)) plus the reservations in flight of the
    /// living processes. Fetches in flight write their bytes before they
    /// mark them (a sparse copy's) or rename them into `objects/` (a whole
    /// one's) under `tier.lock`, so none of their bytes is counted twice.
    pub(crate) fn check(&self) -> Result<()> {
        if self.state.stale() {
            self.rebuild(&pins::held(&self.root)?)?;
        }
        Ok(())
    }

    /// [`check`](Self::check), and the living processes' records looked
    /// at in the same listing ([`held`](Self::held): dead processes'
    /// reservations leave the count). Call with `tier.lock` held.
    pub(crate) fn check_all(&self) -> Result<()> {
        let held = self.held()?;
        if self.state.stale() {
            self.rebuild(&held)?;
        }
        Ok(())
    }

    /// Sets the count to what each copy counts plus the reservations in
    /// flight of the living processes (`held`).
    fn rebuild(&self, held: &pins::Held) -> Result<()> {
        let copies: u64 = self
            .scan()?
            .iter()
            .map(|(key, found)| self.counted(key, found))
            .sum();
        self.state
            .rebuilt(copies.saturating_add(held.sum(Word::Reserved)));
        Ok(())
    }
}

/// One object of `objects/`, as a scan found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Found {
    /// Allocated bytes of all its files.
    pub(crate) bytes: u64,
    /// The last use of its data file (its mtime).
    pub(crate) used: SystemTime,
    /// Whether it has a sparse copy (or a map, or touch clocks).
    pub(crate) sparse: bool,
    /// Whether it has a whole copy.
    pub(crate) whole: bool,
}

impl LocalDir {
    /// Removes the fetch locks no one holds (`<key>.<n>.fetch`, left by a
    /// process that died mid-fetch). One held is left (its holder removes
    /// it, or a later sweep does).
    fn sweep_locks(&self) -> Result<()> {
        let entries =
            std::fs::read_dir(&self.locks).map_err(Error::io("list directory", &self.locks))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list directory", &self.locks))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.ends_with(".fetch") {
                continue;
            }
            if let Some(held) = FileLock::try_exclusive_live(&entry.path())? {
                drop(held.remove_on_drop());
            }
        }
        Ok(())
    }
}

/// Bytes reserved for a fetch: counted before it starts (in `tier.state`
/// and in this process's pin record, [`Word::Reserved`]), so that the
/// count stays within the budget and a rebuild keeps them; settled to
/// what the fetch really added (under `tier.lock`), and what is never
/// settled (a failed fetch) is given back on drop.
#[derive(Debug)]
pub(crate) struct Reservation<'a> {
    dir: &'a LocalDir,
    left: u64,
    pid: u32,
}

impl<'a> Reservation<'a> {
    /// Counts `bytes` for a fetch (call with `tier.lock` held).
    pub(crate) fn new(dir: &'a LocalDir, bytes: u64) -> Result<Reservation<'a>> {
        pins::add_word(&dir.root, Word::Reserved, bytes)?;
        dir.state.add(bytes);
        Ok(Reservation {
            dir,
            left: bytes,
            pid: std::process::id(),
        })
    }

    /// The fetch added `used` bytes (call with `tier.lock` held and the
    /// change marked): the rest of the reservation is given back, or the
    /// excess counted.
    pub(crate) fn settle(mut self, used: u64) {
        pins::sub_word(&self.dir.root, Word::Reserved, self.left);
        let state = &self.dir.state;
        if used > self.left {
            state.add(used - self.left);
        } else {
            state.sub(self.left - used);
        }
        self.left = 0;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.left == 0 || self.pid != std::process::id() {
            return;
        }
        // Under tier.lock, as every change of the count: a rebuild then
        // sees it either still reserved or given back, never both. The
        // record first: a death in between leaves the count high, never
        // low.
        let tier = self.dir.lock_tier();
        let _changing = tier.is_ok().then(|| self.dir.state.changing());
        pins::sub_word(&self.dir.root, Word::Reserved, self.left);
        self.dir.state.sub(self.left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of `blocks` blocks of 64 KiB with the blocks `present`
    /// marked, made as the tier makes one: its allowance counted, then
    /// each block's pages.
    fn sparse_copy(dir: &LocalDir, key: &str, blocks: u64, present: &[u64]) {
        let mut map = crate::format::BlockMap::new(64 << 10, blocks * (64 << 10), "e".into(), None);
        dir.state.add(meta_bytes(map.blocks(), map.etag.len()));
        let file = std::fs::File::create(dir.sparse(key)).unwrap();
        file.set_len(map.size).unwrap();
        for &b in present {
            use std::os::unix::fs::FileExt;
            file.write_all_at(&vec![7u8; 64 << 10], b * (64 << 10))
                .unwrap();
            map.set(b);
            dir.state.add(units(map.block_range(b)));
        }
        std::fs::write(dir.map(key), map.encode()).unwrap();
    }

    /// A rebuild counts what each copy counted (allowances included) and
    /// the reservations in flight, so that one settled after it leaves
    /// the count where an unbroken count would be.
    #[test]
    fn a_rebuild_keeps_the_reservations_in_flight() {
        let root = tempfile::tempdir().unwrap();
        let dir = LocalDir::open(root.path(), Duration::from_secs(10)).unwrap();
        {
            let _tier = dir.lock_tier().unwrap();
            dir.check().unwrap();
        }
        sparse_copy(&dir, "a", 40, &[0, 1, 7]);
        std::fs::write(dir.whole("b"), vec![1u8; 10_000]).unwrap();
        dir.state
            .add(std::fs::metadata(dir.whole("b")).unwrap().blocks() * 512);
        let exact = dir.state.allocated();
        // A fetch in flight: reserved, its block written, not yet marked.
        let reserved = {
            let _tier = dir.lock_tier().unwrap();
            Reservation::new(&dir, 64 << 10).unwrap()
        };
        assert_eq!(dir.state.allocated(), exact + (64 << 10));
        // A holder dies mid-change, its count lost: the next check rebuilds.
        dir.state.rebuilt(123);
        let _mid = std::mem::ManuallyDrop::new(dir.state.changing());
        {
            let _tier = dir.lock_tier().unwrap();
            dir.check().unwrap();
        }
        assert_eq!(
            dir.state.allocated(),
            exact + (64 << 10),
            "the reservation survives"
        );
        {
            let _tier = dir.lock_tier().unwrap();
            let _changing = dir.state.changing();
            reserved.settle(64 << 10);
        }
        assert_eq!(dir.state.allocated(), exact + (64 << 10), "settled exactly");
        // Without a mark, the block's bytes are given back.
        let failed = {
            let _tier = dir.lock_tier().unwrap();
            Reservation::new(&dir, 4096).unwrap()
        };
        drop(failed);
        assert_eq!(dir.state.allocated(), exact + (64 << 10));
    }

    /// What a copy counted is what its removal gives back: a sparse
    /// copy's allowance with its blocks, however little of its metadata
    /// files the disk holds.
    #[test]
    fn a_copy_counts_its_allowance_and_its_marked_blocks() {
        let root = tempfile::tempdir().unwrap();
        let dir = LocalDir::open(root.path(), Duration::from_secs(10)).unwrap();
        sparse_copy(&dir, "a", 1000, &[3, 4, 999]);
        let found = dir.scan().unwrap();
        let counted = dir.counted("a", &found["a"]);
        assert_eq!(counted, dir.state.allocated());
        assert_eq!(counted, meta_bytes(1000, 1) + 3 * (64 << 10));
        assert!(found["a"].bytes <= counted, "{found:?} vs {counted}");
    }

    #[test]
    fn keys_are_flat_and_distinct() {
        assert_eq!(LocalDir::key("a/b%c"), "a%2Fb%25c");
        assert_ne!(LocalDir::key("a/b"), LocalDir::key("a%2Fb"));
        let long = "x/".repeat(200);
        let key = LocalDir::key(&long);
        assert!(key.len() < 200 && !key.contains('/'));
        assert_ne!(key, LocalDir::key(&format!("{long}y")));
    }
}
