//! Pins: which local copies a process has open, so that eviction (in any
//! process) leaves them alone — with one descriptor per tier and process,
//! whatever the number of objects open — and the bytes the process has
//! counted in the tier but not yet placed (fetches in flight) or claimed
//! for whole copies.
//!
//! Each process that opens objects in a tier keeps one pin record,
//! `pins/<host>-<pid>-<nanos>-<n>`, exclusively `flock`ed for the
//! process's life: three bitmaps ([`Region`]) of [`BUCKETS`] bits each,
//! 512 KiB apiece, then a page of words ([`Word`]). Region 0 ("open"):
//! bit `b` set while the process holds any object whose key hashes to
//! bucket `b`. Region 1 ("whole"): the same for handles that need the
//! whole copy (they map it); a handle opened with
//! [`RemoteTier::open_leased`](crate::RemoteTier::open_leased) sets only
//! region 0, so eviction may free blocks of its copy. Region 2
//! ("leased"): bit `bucket("<key>#<block>")` set while a [`Lease`] of
//! the process holds that block, which is then never freed. The words:
//! the bytes of the process's reservations in flight (counted in
//! `tier.state`, not yet on disk where a scan counts them), and the bytes
//! of its whole claims ([`Claim`]).
//!
//! A record is made under a temporary name in `tmp/`, locked and sized
//! there, and only then renamed into `pins/`: no other process ever sees
//! a record of a living process unlocked. Eviction and the count's
//! rebuild (under `tier.lock`) map the records whose lock they cannot
//! take (their process lives); one whose lock is free is a dead
//! process's, and is removed — and its reservations in flight, never
//! settled, are taken off the count. Every object whose bucket is set in
//! a living record is kept. Two keys of one bucket only keep a copy
//! longer than needed: never less.
//!
//! A bucket is set under `tier.lock`, before the object's copy is looked
//! for: an eviction either ran before (the copy is gone, and is fetched
//! again) or sees the bit. Handles of one process count per bucket; the
//! last one clears it (no lock needed to give a pin up). A forked child
//! keeps its own record (see [`durable_fs::PerProcess`]): it never clears, nor
//! unlocks, its parent's.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use durable_fs::{FileLock, PerProcess};

use crate::constants::{LOCK_FILE, PINS_DIR, STICKY, TMP_DIR};
use crate::{Error, Result};

/// Buckets of a pin record: 4 Mi bits, a 512 KiB (sparse) file. With
/// 100,000 objects open, about one unpinned object in 40 shares a bucket
/// with an open one (and is kept too).
pub(crate) const BUCKETS: u64 = 1 << 22;

/// The bytes of one region of a pin record.
const REGION_BYTES: u64 = BUCKETS / 8;

/// Where a record's page of words starts (after its three regions).
const WORDS_AT: u64 = 3 * REGION_BYTES;

/// The bytes of a record: three regions and a page of words.
pub(crate) const RECORD_BYTES: u64 = WORDS_AT + 4096;

/// The words of a pin record: little-endian `u64`s at the start of its
/// last page, written by its process through a mapping, as atomics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Word {
    /// Bytes of this process's reservations in flight: counted in
    /// `tier.state`, not yet settled.
    Reserved = 0,
    /// Bytes of this process's whole claims ([`Claim`]).
    Claimed = 1,
}

/// The regions of a pin record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Region {
    /// Objects open (any handle).
    Open = 0,
    /// Objects open by a handle that needs the whole copy.
    Whole = 1,
    /// Blocks leased (`bucket("<key>#<block>")`).
    Leased = 2,
}

/// What a handle needs of its object's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PinKind {
    /// All of it, for its life (a mapping of the whole file).
    Whole,
    /// Only the blocks it leases, while it leases them.
    Blocks,
}

/// The pin records of this process, by tier directory.
#[derive(Default)]
struct Records {
    tiers: HashMap<PathBuf, Record>,
}

/// This process's pin record of one tier.
struct Record {
    file: File,
    path: PathBuf,
    /// The record's page of words, mapped.
    words: memmap2::MmapMut,
    /// Holders per (region, bucket); a bucket is set in the file while
    /// above zero (or, for leases, while sticky).
    counts: HashMap<(Region, u64), u32>,
    /// Lease buckets released but left set, oldest first.
    sticky: std::collections::VecDeque<u64>,
}

static RECORDS: PerProcess<Mutex<Records>> = PerProcess::new();

/// This process's pin records. A forked child closes its parent's (if no
/// thread of the parent held them at the fork) and starts its own:
/// closing only, as the parent still holds each record's lock through
/// its own descriptor of the same open file.
fn records() -> MutexGuard<'static, Records> {
    RECORDS
        .get_leaving(|parent| {
            if let Ok(mut parent) = parent.try_lock() {
                parent.tiers.clear();
            }
        })
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The bucket of the object key `key`.
pub(crate) fn bucket(key: &str) -> u64 {
    let hash = blake3::hash(key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_le_bytes(first) % BUCKETS
}

/// An object held by this process: its bucket stays set while this
/// lives (dropped in the process that pinned it; a forked child's copy
/// of it does nothing).
#[derive(Debug)]
pub(crate) struct Pin {
    root: PathBuf,
    bucket: u64,
    kind: PinKind,
    pid: u32,
}

impl Pin {
    /// Pins the object `key` of the tier at `root` for this process (its
    /// whole copy, or only the blocks later leased): takes `tier.lock` (at
    /// most `wait`) when a bucket is not yet set.
    pub(crate) fn take(root: &Path, key: &str, wait: Duration, kind: PinKind) -> Result<Pin> {
        let bucket = bucket(key);
        let pin = Pin {
            root: root.to_path_buf(),
            bucket,
            kind,
            pid: std::process::id(),
        };
        let regions: &[Region] = match kind {
            PinKind::Whole => &[Region::Open, Region::Whole],
            PinKind::Blocks => &[Region::Open],
        };
        let set: Vec<(Region, u64)> = regions.iter().map(|&r| (r, bucket)).collect();
        take_buckets(root, wait, &set)?;
        Ok(pin)
    }

    /// What this pin keeps.
    pub(crate) fn kind(&self) -> PinKind {
        self.kind
    }

    /// Whether this pin was taken by this process (not inherited through
    /// `fork()`).
    pub(crate) fn is_own(&self) -> bool {
        self.pid == std::process::id()
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        if !self.is_own() {
            return;
        }
        let mut records = records();
        let Some(record) = records.tiers.get_mut(&self.root) else {
            return;
        };
        record.release(Region::Open, self.bucket);
        if self.kind == PinKind::Whole {
            record.release(Region::Whole, self.bucket);
        }
    }
}

/// Counts a holder of each `(region, bucket)` of `set` in this process,
/// setting in the record (under `tier.lock`, which every eviction holds,
/// so that one that already looked for pins is done by then) the buckets
/// not yet set.
fn take_buckets(root: &Path, wait: Duration, set: &[(Region, u64)]) -> Result<()> {
    {
        let mut records = records();
        let record = records.record(root)?;
        if set.iter().all(|rb| record.is_set(*rb)) {
            for rb in set {
                record.hold(*rb);
            }
            return Ok(());
        }
    }
    let _tier = FileLock::exclusive_within(&root.join(LOCK_FILE), wait)?;
    let mut records = records();
    let record = records.record(root)?;
    for rb in set {
        if record.hold(*rb) {
            record.write_byte(rb.0, rb.1)?;
        }
    }
    Ok(())
}

/// The blocks of one object a read is using: while a lease lives, no
/// process of the tier frees them (their buckets are set in region 2 of
/// this process's pin record). Dropping it releases them; up to
/// 4 buckets per process stay set a while longer, so that the
/// next lease of the same block takes no lock.
#[derive(Debug)]
pub struct Lease {
    root: PathBuf,
    buckets: Vec<u64>,
    pid: u32,
}

impl Lease {
    /// A lease of nothing (an object whose copy is whole-pinned anyway).
    pub(crate) fn empty(root: &Path) -> Lease {
        Lease {
            root: root.to_path_buf(),
            buckets: Vec::new(),
            pid: std::process::id(),
        }
    }

    /// Leases `blocks` of the object `key` of the tier at `root`: takes
    /// `tier.lock` (at most `wait`) only when a bucket is not yet set.
    pub(crate) fn take(root: &Path, key: &str, blocks: &[u64], wait: Duration) -> Result<Lease> {
        let mut buckets: Vec<u64> = blocks
            .iter()
            .map(|b| bucket(&format!("{key}#{b}")))
            .collect();
        buckets.sort_unstable();
        buckets.dedup();
        let set: Vec<(Region, u64)> = buckets.iter().map(|&b| (Region::Leased, b)).collect();
        take_buckets(root, wait, &set)?;
        Ok(Lease {
            root: root.to_path_buf(),
            buckets,
            pid: std::process::id(),
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.pid != std::process::id() || self.buckets.is_empty() {
            return;
        }
        let mut records = records();
        let Some(record) = records.tiers.get_mut(&self.root) else {
            return;
        };
        for &b in &self.buckets {
            record.release(Region::Leased, b);
        }
    }
}

impl Records {
    /// This process's record of the tier at `root`, made on first use.
    fn record(&mut self, root: &Path) -> Result<&mut Record> {
        if !self.tiers.contains_key(root) {
            let dir = root.join(PINS_DIR);
            std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
            let path = dir.join(durable_fs::host_pid_token());
            // Made, locked and sized under a temporary name, then renamed
            // into place: a record another process can list is always
            // locked while its process lives.
            let tmp_dir = root.join(TMP_DIR);
            std::fs::create_dir_all(&tmp_dir).map_err(Error::io("create directory", &tmp_dir))?;
            let tmp = durable_fs::unique_temp_path(&tmp_dir, "pin-record");
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(Error::io("create pin record", &tmp))?;
            let made = (|| {
                // SAFETY: flock on a descriptor this function owns; it takes
                // no pointer and has no other effect on memory.
                let locked =
                    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
                if locked != 0 {
                    return Err(Error::io("lock pin record", &tmp)(
                        std::io::Error::last_os_error(),
                    ));
                }
                file.set_len(RECORD_BYTES)
                    .map_err(Error::io("size pin record", &tmp))?;
                // SAFETY: the record is sized above and never truncated;
                // the page mapped is its last, page-aligned. This process
                // writes it and others read it concurrently, so its bytes
                // are only ever accessed as `AtomicU64`s (`Record::word`).
                let words = unsafe {
                    memmap2::MmapOptions::new()
                        .offset(WORDS_AT)
                        .len(4096)
                        .map_mut(&file)
                }
                .map_err(Error::io("map pin record", &tmp))?;
                std::fs::rename(&tmp, &path).map_err(Error::io("rename pin record", &path))?;
                Ok(words)
            })();
            let words = match made {
                Ok(words) => words,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            self.tiers.insert(
                root.to_path_buf(),
                Record {
                    file,
                    path,
                    words,
                    counts: HashMap::new(),
                    sticky: Default::default(),
                },
            );
        }
        Ok(self.tiers.get_mut(root).expect("inserted above"))
    }
}

impl Record {
    /// The word `w` of this record.
    fn word(&self, w: Word) -> &AtomicU64 {
        // SAFETY: the mapping is a page, page-aligned, living as long as
        // `self`; every word lies at an 8-byte-aligned offset inside it.
        // Other processes read it concurrently, so it is only ever
        // accessed as an atomic.
        unsafe { &*(self.words.as_ptr().add(w as usize * 8) as *const AtomicU64) }
    }

    /// Whether `(region, bucket)` is set in the file now.
    fn is_set(&self, rb: (Region, u64)) -> bool {
        self.counts.contains_key(&rb) || (rb.0 == Region::Leased && self.sticky.contains(&rb.1))
    }

    /// Counts one more holder; whether the bucket must be written (it
    /// was not set).
    fn hold(&mut self, rb: (Region, u64)) -> bool {
        let was_set = self.is_set(rb);
        if rb.0 == Region::Leased {
            self.sticky.retain(|&b| b != rb.1);
        }
        *self.counts.entry(rb).or_insert(0) += 1;
        !was_set
    }

    /// Counts one holder less; the last one clears the bucket (no lock
    /// needed to give a pin up), except that released lease buckets stay
    /// set while they are among the [`STICKY`] most recent.
    fn release(&mut self, region: Region, bucket: u64) {
        let rb = (region, bucket);
        match self.counts.get_mut(&rb) {
            Some(n) if *n > 1 => {
                *n -= 1;
                return;
            }
            Some(_) => {
                self.counts.remove(&rb);
            }
            None => return,
        }
        // Best effort below: a bit left set only keeps a copy longer.
        if region != Region::Leased {
            let _ = self.write_byte(region, bucket);
            return;
        }
        self.sticky.push_back(bucket);
        while self.sticky.len() > STICKY {
            if let Some(old) = self.sticky.pop_front() {
                let _ = self.write_byte(Region::Leased, old);
            }
        }
    }

    /// Writes the byte that holds `bucket` of `region` as the counts say.
    fn write_byte(&self, region: Region, bucket: u64) -> Result<()> {
        let first = bucket / 8 * 8;
        let byte = (0..8u64)
            .filter(|i| self.is_set((region, first + i)))
            .fold(0u8, |b, i| b | (1 << i));
        self.file
            .write_all_at(&[byte], region as u64 * REGION_BYTES + bucket / 8)
            .map_err(Error::io("write pin record", &self.path))
    }
}

/// Adds `n` bytes to this process's word `w` of the tier at `root` (its
/// record made on first use).
pub(crate) fn add_word(root: &Path, w: Word, n: u64) -> Result<()> {
    if n > 0 {
        records()
            .record(root)?
            .word(w)
            .fetch_add(n, Ordering::AcqRel);
    }
    Ok(())
}

/// Takes `n` bytes off this process's word `w` of the tier at `root`,
/// stopping at zero.
pub(crate) fn sub_word(root: &Path, w: Word, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(record) = records().tiers.get(root) {
        let _ = record
            .word(w)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            });
    }
}

/// Room the tier granted for copies a reader keeps whole (mapped) for as
/// long as this lives: the claims of every living process of the tier
/// together stay within its budget
/// ([`RemoteTier::claim_whole`](crate::RemoteTier::claim_whole)). Given
/// back on drop, in the process that took it.
#[derive(Debug)]
pub struct Claim {
    root: PathBuf,
    bytes: u64,
    pid: u32,
}

impl Claim {
    /// Records `bytes` claimed by this process in the tier at `root` (the
    /// caller checked, under `tier.lock`, that they fit).
    pub(crate) fn take(root: &Path, bytes: u64) -> Result<Claim> {
        add_word(root, Word::Claimed, bytes)?;
        Ok(Claim {
            root: root.to_path_buf(),
            bytes,
            pid: std::process::id(),
        })
    }

    /// The bytes claimed.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            sub_word(&self.root, Word::Claimed, self.bytes);
        }
    }
}

/// The buckets every living process of the tier at `root` holds, read
/// from their pin records (call with `tier.lock` held). Records of dead
/// processes are removed.
///
/// Each living record is mapped, not read: a pass looks up one bit per
/// candidate object or block in each record, so its cost follows the
/// candidates, not the records' 1.5 MiB (an eviction pass runs about once
/// per fetch while a plan is live). A bit set or cleared while the pass
/// runs is seen or not, as if the records were read a moment later; a
/// lease taken after the pass looked is caught by the generation the pass
/// bumps before it frees anything.
pub(crate) fn held(root: &Path) -> Result<Held> {
    let dir = root.join(PINS_DIR);
    let mut held = Held {
        records: Vec::new(),
        dead_reserved: 0,
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(held),
        Err(e) => return Err(Error::io("list directory", &dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io("list directory", &dir))?;
        let path = entry.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("open pin record", &path)(e)),
        };
        let len = file
            .metadata()
            .map_err(Error::io("stat pin record", &path))?
            .len();
        if is_dead(&file) {
            let reserved = read_word(&file, len, Word::Reserved);
            // Whoever removes it takes its reservations off the count.
            if std::fs::remove_file(&path).is_ok() {
                held.dead_reserved = held.dead_reserved.saturating_add(reserved);
            }
            continue;
        }
        if len == 0 {
            continue;
        }
        // SAFETY: pin records are never truncated (sized once when made,
        // before they are renamed into `pins/`), so the
        // mapping stays backed for its life, even once the file is
        // removed. Its process writes it concurrently, so its bytes are
        // only ever read as `AtomicU8`s (`MappedRecord::byte`), never
        // through a `&[u8]`.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map(&file) }
            .map_err(Error::io("map pin record", &path))?;
        held.records.push(MappedRecord { map });
    }
    Ok(held)
}

/// Whether the pin record `file` belongs to a dead process: its lock is
/// free (a living process locks its record before it is renamed into
/// `pins/`).
fn is_dead(file: &File) -> bool {
    // SAFETY: flock on a descriptor the caller owns.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0 }
}

/// Word `w` of the record `file` of `len` bytes, read (0 for a record
/// too short to hold it: damaged, as no process of the tier writes one).
fn read_word(file: &File, len: u64, w: Word) -> u64 {
    let at = WORDS_AT + w as u64 * 8;
    let mut bytes = [0u8; 8];
    if len < at + 8 || file.read_exact_at(&mut bytes, at).is_err() {
        return 0;
    }
    u64::from_le_bytes(bytes)
}

/// The union of the living pin records of a tier: their mappings.
pub(crate) struct Held {
    records: Vec<MappedRecord>,
    /// Reservations in flight of the dead processes whose records this
    /// look removed: the caller takes them off the count.
    pub(crate) dead_reserved: u64,
}

/// One living process's pin record, mapped read-only.
struct MappedRecord {
    map: memmap2::Mmap,
}

impl MappedRecord {
    /// Word `w` of the record (0 for one too short to hold it).
    fn word(&self, w: Word) -> u64 {
        let off = (WORDS_AT + w as u64 * 8) as usize;
        if off + 8 > self.map.len() {
            return 0;
        }
        // SAFETY: `off` is 8-byte aligned (the mapping is page-aligned)
        // and the word lies within the mapping; its process writes it
        // concurrently, so it is only read atomically.
        let word = unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) };
        word.load(Ordering::Acquire)
    }

    /// The record's byte at `off`, if it has one.
    fn byte(&self, off: usize) -> Option<u8> {
        if off >= self.map.len() {
            return None;
        }
        // SAFETY: `off` is within the mapping; `AtomicU8` has the size and
        // alignment of `u8`, and the byte is only read atomically, as its
        // writer (another process, `write_all_at`) changes it meanwhile.
        let byte = unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU8) };
        Some(byte.load(Ordering::Relaxed))
    }

    /// Whether bit `b` of `region` is set.
    fn has(&self, region: Region, b: u64) -> bool {
        let off = (region as u64 * REGION_BYTES + b / 8) as usize;
        self.byte(off)
            .is_some_and(|byte| byte & (1 << (b % 8)) != 0)
    }
}

impl Held {
    /// The sum of word `w` over the living records.
    pub(crate) fn sum(&self, w: Word) -> u64 {
        self.records
            .iter()
            .fold(0u64, |a, r| a.saturating_add(r.word(w)))
    }

    /// Whether bucket `b` of `region` is set in any living record.
    fn any(&self, region: Region, b: u64) -> bool {
        self.records.iter().any(|r| r.has(region, b))
    }

    /// Whether some process may hold the object `key` open.
    pub(crate) fn has(&self, key: &str) -> bool {
        self.any(Region::Open, bucket(key))
    }

    /// Whether some process may need the whole copy of `key`.
    pub(crate) fn whole(&self, key: &str) -> bool {
        self.any(Region::Whole, bucket(key))
    }

    /// Whether some process may be reading block `block` of `key`.
    pub(crate) fn leased(&self, key: &str, block: u64) -> bool {
        !self.records.is_empty() && self.any(Region::Leased, bucket(&format!("{key}#{block}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record whose lock is free is a dead process's: it goes, its pins
    /// with it, and its reservations in flight are handed to the caller
    /// to take off the count.
    #[test]
    fn a_dead_processs_record_goes_with_its_reservations() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(PINS_DIR);
        std::fs::create_dir_all(&dir).unwrap();
        let dead = dir.join("host-2-dead");
        let file = File::create(&dead).unwrap();
        file.set_len(RECORD_BYTES).unwrap();
        let b = bucket("obj");
        file.write_all_at(&[1 << (b % 8)], b / 8).unwrap();
        file.write_all_at(&12_288u64.to_le_bytes(), WORDS_AT)
            .unwrap();
        drop(file);

        let seen = held(root.path()).unwrap();
        assert!(!seen.has("obj"), "a dead process's pin kept its object");
        assert!(!dead.exists(), "a dead process's record stayed");
        assert_eq!(seen.dead_reserved, 12_288);
        assert_eq!(held(root.path()).unwrap().dead_reserved, 0, "taken once");
    }

    /// A living process's words are seen by every look, and only its own.
    #[test]
    fn the_words_of_living_records_add_up() {
        let root = tempfile::tempdir().unwrap();
        add_word(root.path(), Word::Reserved, 4096).unwrap();
        let claim = Claim::take(root.path(), 1 << 20).unwrap();
        let mut other = Records::default();
        let record = other.record(root.path()).unwrap();
        record.word(Word::Claimed).store(300, Ordering::Release);
        let seen = held(root.path()).unwrap();
        assert_eq!(seen.sum(Word::Reserved), 4096);
        assert_eq!(seen.sum(Word::Claimed), (1 << 20) + 300);
        drop(claim);
        sub_word(root.path(), Word::Reserved, 4096);
        let seen = held(root.path()).unwrap();
        assert_eq!(
            (seen.sum(Word::Reserved), seen.sum(Word::Claimed)),
            (0, 300)
        );
        assert_eq!(seen.dead_reserved, 0);
    }

    /// Records made while another thread looks for dead ones (as every
    /// eviction does, with a shared lock on each record it lists) are
    /// never taken for dead, and their making never fails: a record is
    /// listed only once locked.
    #[test]
    fn records_made_beside_a_look_for_dead_ones_are_never_taken_for_dead() {
        let root = tempfile::tempdir().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let looker = {
            let (root, stop) = (root.path().to_path_buf(), stop.clone());
            std::thread::spawn(move || {
                let mut looks = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let seen = held(&root).unwrap();
                    assert_eq!(seen.dead_reserved, 0);
                    looks += 1;
                }
                looks
            })
        };
        // `CACHEX_TEST_PIN_RECORDS` records made (default 300), at most
        // 200 alive at once; each checked still listed before it goes.
        let count: usize = std::env::var("CACHEX_TEST_PIN_RECORDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        let mut alive = std::collections::VecDeque::new();
        for _ in 0..count {
            let mut records = Records::default();
            records.record(root.path()).unwrap();
            alive.push_back(records);
            if alive.len() > 200 {
                let old = alive.pop_front().unwrap();
                let path = &old.tiers[root.path()].path;
                assert!(path.exists(), "a living record was removed");
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(looker.join().unwrap() > 0);
        for records in &alive {
            assert!(
                records.tiers[root.path()].path.exists(),
                "a living record was removed"
            );
        }
    }

    /// The mapped records show a living process's pins as they change, in
    /// each region.
    #[test]
    fn held_sees_living_pins() {
        let root = tempfile::tempdir().unwrap();
        let wait = Duration::from_secs(10);
        let pin = Pin::take(root.path(), "blocks", wait, PinKind::Blocks).unwrap();
        let seen = held(root.path()).unwrap();
        assert!(seen.has("blocks") && !seen.whole("blocks"));
        assert!(!seen.has("other") && !seen.leased("blocks", 3));

        let lease = Lease::take(root.path(), "blocks", &[3], wait).unwrap();
        assert!(
            seen.leased("blocks", 3),
            "a lease taken after the mapping is seen"
        );
        assert!(!seen.leased("blocks", 4));
        drop(lease);
        drop(pin);
        assert!(!seen.has("blocks"), "a pin given up is no longer seen");
    }
}
