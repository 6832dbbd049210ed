//! Plan records: the upcoming uses of an object's blocks, as the readers
//! of a node registered them, so eviction can keep what is needed soonest
//! (Belady's rule) instead of what was used last.
//!
//! Each reader (a rank, a DataLoader worker) that knows its order of the
//! epoch registers it with [`RemoteFile::set_plan`](crate::RemoteFile::set_plan):
//! for every block it reads, the position (in its own batch clock) of its
//! first and last use this epoch and of its first use in the next one.
//! The reader then moves its progress forward with
//! [`PlanHandle::advance`] after each batch, and dropping the handle
//! removes the record. Eviction reads every live record ([`next_uses`]):
//! the node's next use of a block is the nearest over the records, each
//! at its own progress. A block no live record reads again is unplanned,
//! and is evicted by LRU as without plans.
//!
//! # On disk
//! ```text
//! <tier_dir>/plans/<host>-<pid>-<nanos>-<n>.plan   one registrant's record,
//!                     flocked (exclusive) by it for the record's life
//! <tier_dir>/plans/plan.<host>.<pid>.<n>.tmp        a record being written
//! ```
//! A record, little-endian, every field at its natural alignment up to
//! the first object:
//! ```text
//! 0   magic "CXPLAN\0\0"
//! 8   version u32 = 1
//! 12  flags u32 = 0
//! 16  progress u64        the registrant's position: written in place (one
//!                         aligned 8-byte pwrite) after each batch
//! 24  epoch_len u64       L: positions 0..L are this epoch, L..2L the next
//! 32  objects u64         K
//! 40  K × object:
//!       key_len u16, key (UTF-8, the tier's escaped object key),
//!       block_size u64, n u32,
//!       n × { block u32, first u32, last u32, next_first u32 }
//!                         (u32::MAX = none; first ≤ last < L; L ≤ next_first < 2L)
//! end BLAKE3 (32 bytes) of every byte before it except progress
//! ```
//! The record is written whole under a temporary name, locked, and renamed
//! into place, so a `.plan` is never seen half written. A record that does
//! not check (another version, a torn or altered file, positions out of
//! their epoch) is ignored: its blocks count as unplanned. A record whose
//! lock is free belongs to a registrant that is gone, and is removed. (A
//! child forked by the registrant shares the lock's open file, so a
//! registrant's record lives as long as such a child too: its plan is
//! then stale, which costs hits, never data.)
//!
//! The distance of a block at progress `p`: while this epoch still reads
//! it (`first` set and `p ≤ last`), `first − p` (0 = in use now);
//! otherwise, when the next epoch reads it, `next_first − p`; otherwise
//! none. The ranks of a node move in lockstep (their collectives), so
//! their batch indices are one clock, and the node's distance is the
//! minimum over the records.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::{Error, RemoteFile, Result};

/// A position no use has (`first`, `last` or `next_first` unset).
pub const NONE: u32 = u32::MAX;

/// The directory of the plan records, inside the tier directory.
pub(crate) const PLANS_DIR: &str = "plans";

/// The first bytes of every plan record.
const MAGIC: &[u8; 8] = b"CXPLAN\0\0";

/// The record version this build writes and reads.
const VERSION: u32 = 1;

/// Where the progress is, in a record.
const PROGRESS_AT: u64 = 16;

/// The fixed part of a record, before its objects.
const HEADER_LEN: usize = 40;

/// The bytes of one block's uses.
const USE_LEN: usize = 16;

/// The suffix of a record's name.
const PLAN_SUFFIX: &str = ".plan";

/// How old a temporary record with no live writer must be before it is
/// removed (its writer takes its lock right after creating it).
const STALE_TEMP: Duration = Duration::from_secs(60);

/// One block's uses in one reader's plan, in the reader's batch clock:
/// positions `0..epoch_len` are this epoch, `epoch_len..2·epoch_len` the
/// next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockUse {
    /// The block's index in its object (offset / block size).
    pub block: u32,
    /// Its first use this epoch, or `u32::MAX` (none).
    pub first: u32,
    /// Its last use this epoch, or `u32::MAX` (none).
    pub last: u32,
    /// Its first use in the next epoch (a position ≥ `epoch_len`), or
    /// `u32::MAX` (none).
    pub next_first: u32,
}

impl BlockUse {
    /// A block with no use yet.
    fn unused(block: u32) -> BlockUse {
        BlockUse {
            block,
            first: NONE,
            last: NONE,
            next_first: NONE,
        }
    }

    /// Adds a use at `position` (`epoch_len` tells this epoch's from the
    /// next one's).
    fn add(&mut self, position: u32, epoch_len: u64) {
        if u64::from(position) < epoch_len {
            self.first = if self.first == NONE {
                position
            } else {
                self.first.min(position)
            };
            self.last = if self.last == NONE {
                position
            } else {
                self.last.max(position)
            };
        } else {
            self.next_first = self.next_first.min(position);
        }
    }

    /// How many batches after `progress` the block is read next, `None`
    /// when this plan does not read it again.
    pub(crate) fn distance(&self, progress: u64) -> Option<u64> {
        if self.first != NONE && progress <= u64::from(self.last) {
            return Some(u64::from(self.first).saturating_sub(progress));
        }
        if self.next_first != NONE && progress <= u64::from(self.next_first) {
            return Some(u64::from(self.next_first) - progress);
        }
        None
    }

    /// Whether the positions lie where a record of `epoch_len` allows.
    fn fits(&self, epoch_len: u64) -> bool {
        let this = match (self.first, self.last) {
            (NONE, NONE) => true,
            (NONE, _) | (_, NONE) => false,
            (first, last) => first <= last && u64::from(last) < epoch_len,
        };
        let next = self.next_first == NONE
            || (epoch_len..epoch_len.saturating_mul(2)).contains(&u64::from(self.next_first));
        this && next
    }
}

/// The plan of one object in a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectPlan {
    /// The object's key in the tier (its escaped name).
    pub(crate) key: String,
    /// The block size the block indices count in.
    pub(crate) block_size: u64,
    /// The planned blocks, each once.
    pub(crate) uses: Vec<BlockUse>,
}

/// One registrant's record, as written and read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanRecord {
    /// The registrant's position in its batch clock.
    pub(crate) progress: u64,
    /// The batches of this epoch (`L`).
    pub(crate) epoch_len: u64,
    /// The objects it reads.
    pub(crate) objects: Vec<ObjectPlan>,
}

impl PlanRecord {
    /// The record's bytes (see the module docs).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let body: usize = self
            .objects
            .iter()
            .map(|o| 2 + o.key.len() + 8 + 4 + o.uses.len() * USE_LEN)
            .sum();
        let mut out = Vec::with_capacity(HEADER_LEN + body + 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.progress.to_le_bytes());
        out.extend_from_slice(&self.epoch_len.to_le_bytes());
        out.extend_from_slice(&(self.objects.len() as u64).to_le_bytes());
        for o in &self.objects {
            out.extend_from_slice(&(o.key.len() as u16).to_le_bytes());
            out.extend_from_slice(o.key.as_bytes());
            out.extend_from_slice(&o.block_size.to_le_bytes());
            out.extend_from_slice(&(o.uses.len() as u32).to_le_bytes());
            for u in &o.uses {
                for v in [u.block, u.first, u.last, u.next_first] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Reads a record, or says what is wrong with it.
    pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<PlanRecord, String> {
        if bytes.len() < HEADER_LEN + 32 {
            return Err(format!("{} bytes, shorter than any record", bytes.len()));
        }
        if &bytes[..8] != MAGIC {
            return Err("not a plan record (bad magic)".into());
        }
        let (data, sum) = bytes.split_at(bytes.len() - 32);
        let mut cur = Cursor { bytes: data, at: 8 };
        let version = cur.u32()?;
        if version != VERSION {
            return Err(format!("version {version}, this build reads {VERSION}"));
        }
        if checksum(data) != sum {
            return Err("checksum mismatch (torn or altered)".into());
        }
        let _flags = cur.u32()?;
        let progress = cur.u64()?;
        let epoch_len = cur.u64()?;
        let count = cur.u64()?;
        if epoch_len.saturating_mul(2) > u64::from(NONE) {
            return Err(format!("epoch length {epoch_len} too large"));
        }
        let mut objects = Vec::new();
        for _ in 0..count {
            let key_len = usize::from(cur.u16()?);
            let key = std::str::from_utf8(cur.take(key_len)?)
                .map_err(|_| "an object key is not UTF-8".to_string())?
                .to_string();
            let block_size = cur.u64()?;
            if block_size == 0 {
                return Err(format!("{key}: block size 0"));
            }
            let n = cur.u32()? as usize;
            if n > cur.left() / USE_LEN {
                return Err(format!("{key}: {n} blocks past the record's end"));
            }
            let mut uses = Vec::with_capacity(n);
            for _ in 0..n {
                let u = BlockUse {
                    block: cur.u32()?,
                    first: cur.u32()?,
                    last: cur.u32()?,
                    next_first: cur.u32()?,
                };
                if !u.fits(epoch_len) {
                    return Err(format!(
                        "{key}: block {} has positions outside its epochs of {epoch_len}",
                        u.block
                    ));
                }
                uses.push(u);
            }
            objects.push(ObjectPlan {
                key,
                block_size,
                uses,
            });
        }
        if cur.left() != 0 {
            return Err(format!("{} bytes after the last object", cur.left()));
        }
        Ok(PlanRecord {
            progress,
            epoch_len,
            objects,
        })
    }
}

/// BLAKE3 of a record's bytes (checksum excluded) but its progress.
fn checksum(data: &[u8]) -> [u8; 32] {
    let progress = PROGRESS_AT as usize..PROGRESS_AT as usize + 8;
    let mut h = blake3::Hasher::new();
    h.update(&data[..progress.start]);
    h.update(&data[progress.end..]);
    *h.finalize().as_bytes()
}

/// Reads a record's fields in order.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> std::result::Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("ends inside a field at byte {}", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u16(&mut self) -> std::result::Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
}

/// The node's next use of every planned block: the nearest over the live
/// plan records, each at its own progress, looked up block by block (a
/// record is decoded and indexed once per process, see [`live_records`]).
#[derive(Debug, Default)]
pub(crate) struct NextUses {
    /// Each live record's progress and its indexed uses.
    records: Vec<(u64, Arc<Indexed>)>,
}

/// A decoded record, indexed by object and block.
#[derive(Debug)]
struct Indexed {
    objects: HashMap<String, IndexedObject>,
    /// The bytes of the blocks the record reads this epoch.
    epoch_bytes: u64,
}

/// One object's uses in a record.
#[derive(Debug)]
struct IndexedObject {
    /// The block size the block indices count in.
    block_size: u64,
    uses: HashMap<u32, BlockUse>,
    /// The last position any block is read at (this epoch or the next):
    /// past it the record reads the object no more.
    horizon: Option<u64>,
}

impl Indexed {
    fn of(record: PlanRecord) -> Indexed {
        let epoch_bytes = record
            .objects
            .iter()
            .map(|o| {
                let read = o.uses.iter().filter(|u| u.first != NONE).count() as u64;
                read.saturating_mul(o.block_size)
            })
            .fold(0u64, u64::saturating_add);
        let objects = record
            .objects
            .into_iter()
            .map(|o| {
                let horizon = o
                    .uses
                    .iter()
                    .flat_map(|u| [u.last, u.next_first])
                    .filter(|&p| p != NONE)
                    .max()
                    .map(u64::from);
                let uses = o.uses.into_iter().map(|u| (u.block, u)).collect();
                (
                    o.key,
                    IndexedObject {
                        block_size: o.block_size,
                        uses,
                        horizon,
                    },
                )
            })
            .collect();
        Indexed {
            objects,
            epoch_bytes,
        }
    }
}

impl NextUses {
    /// How many batches until `block` of the object `key` is read next,
    /// `None` when no live plan reads it again (see [`ObjectUses`]; the
    /// tier looks an object up once for all its blocks).
    #[cfg(test)]
    pub(crate) fn distance(&self, key: &str, block: u64) -> Option<u64> {
        self.object(key).distance(block)
    }

    /// The uses of the object `key` in every live record, resolved once
    /// for the lookups of its blocks. Block indices count in the block
    /// size of the first record that plans the object (a record of
    /// another block size, made for a copy under another block list, is
    /// left out).
    pub(crate) fn object(&self, key: &str) -> ObjectUses<'_> {
        let mut block_size = None;
        let records = self
            .records
            .iter()
            .filter_map(|(progress, record)| Some((*progress, record.objects.get(key)?)))
            .filter(|(_, o)| *block_size.get_or_insert(o.block_size) == o.block_size)
            .collect();
        ObjectUses { records }
    }

    /// The bytes of the blocks the live plans read this epoch, summed
    /// over the records (a block two records read counts twice: the
    /// ranks of a node read their own samples, and few blocks hold two
    /// ranks' samples).
    pub(crate) fn epoch_bytes(&self) -> u64 {
        self.records
            .iter()
            .map(|(_, r)| r.epoch_bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Whether some live plan reads the object `key` again.
    pub(crate) fn plans(&self, key: &str) -> bool {
        self.records.iter().any(|(progress, record)| {
            record
                .objects
                .get(key)
                .and_then(|o| o.horizon)
                .is_some_and(|h| *progress <= h)
        })
    }

    /// The keys of the objects some live plan reads again.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        let mut keys: Vec<&str> = self
            .records
            .iter()
            .flat_map(|(_, r)| r.objects.keys())
            .map(String::as_str)
            .filter(|k| self.plans(k))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys.into_iter()
    }
}

/// One object's uses in the live records, each at its record's progress
/// ([`NextUses::object`]).
#[derive(Debug)]
pub(crate) struct ObjectUses<'a> {
    records: Vec<(u64, &'a IndexedObject)>,
}

impl ObjectUses<'_> {
    /// How many batches until `block` is read next: the nearest over the
    /// records, `None` when none reads it again.
    pub(crate) fn distance(&self, block: u64) -> Option<u64> {
        let block = u32::try_from(block).ok()?;
        self.records
            .iter()
            .filter_map(|(progress, o)| o.uses.get(&block)?.distance(*progress))
            .min()
    }
}

/// The next uses the live plan records under `<tier_root>/plans/` give;
/// a record that is unreadable, torn or of another version counts as
/// absent (eviction then falls back to LRU for its blocks), and one whose
/// registrant is gone is removed.
pub(crate) fn next_uses(tier_root: &Path) -> NextUses {
    NextUses {
        records: live_records(tier_root),
    }
}

/// Records decoded in this process, by path: their inode and length when
/// read, and their uses. A record is written whole and renamed into
/// place, and only its progress changes after: one of the same inode and
/// length is read again for its progress alone (8 bytes), not decoded.
type Decoded = HashMap<PathBuf, (u64, u64, Arc<Indexed>)>;

fn decoded() -> std::sync::MutexGuard<'static, Decoded> {
    static DECODED: std::sync::OnceLock<Mutex<Decoded>> = std::sync::OnceLock::new();
    DECODED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The progress and uses of the live registrants' records of the tier at
/// `tier_root`, in no order; removes the records of dead ones (and their
/// stale temporary files), best effort.
fn live_records(tier_root: &Path) -> Vec<(u64, Arc<Indexed>)> {
    let dir = tier_root.join(PLANS_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let free = try_lock_shared(&file);
        if name.ends_with(durable_fs::TMP_SUFFIX) {
            let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
                SystemTime::now().duration_since(t).unwrap_or_default() > STALE_TEMP
            });
            if free && old {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(PLAN_SUFFIX) {
            continue;
        }
        if free {
            // Its registrant is gone (it holds the lock for the record's life).
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Ok(meta) = file.metadata() else {
            continue;
        };
        let (ino, len) = (meta.ino(), meta.len());
        let known = decoded()
            .get(&path)
            .filter(|(i, l, _)| (*i, *l) == (ino, len))
            .map(|(_, _, r)| Arc::clone(r));
        let found = match known {
            Some(indexed) => {
                let mut progress = [0u8; 8];
                match file.read_exact_at(&mut progress, PROGRESS_AT) {
                    Ok(()) => Some((u64::from_le_bytes(progress), indexed)),
                    Err(_) => None,
                }
            }
            None => {
                let mut bytes = Vec::new();
                match std::io::Read::read_to_end(&mut &file, &mut bytes) {
                    Ok(_) => PlanRecord::decode(&bytes).ok().map(|record| {
                        let progress = record.progress;
                        let indexed = Arc::new(Indexed::of(record));
                        decoded().insert(path.clone(), (ino, len, Arc::clone(&indexed)));
                        (progress, indexed)
                    }),
                    Err(_) => None,
                }
            }
        };
        if let Some(found) = found {
            seen.push(path);
            records.push(found);
        }
    }
    // Records of this tier that are gone (or no longer read) leave.
    decoded().retain(|p, _| !p.starts_with(&dir) || seen.contains(p));
    records
}

/// Takes a shared `flock` of `file` if no one holds it exclusively;
/// returns whether it did (the lock goes with the descriptor).
fn try_lock_shared(file: &File) -> bool {
    // SAFETY: flock on a descriptor the caller owns; it takes no pointer
    // and has no other effect on memory.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0 }
}

/// A registered plan: its record lives (and counts for eviction) until
/// this is dropped. Dropped in a process forked from the registrant, it
/// does nothing (the registrant's record stays the registrant's).
#[derive(Debug)]
pub struct PlanHandle {
    file: File,
    path: PathBuf,
    epoch_len: u64,
    pid: u32,
}

impl PlanHandle {
    /// Moves the registrant's progress to `position` (the batches it has
    /// read in its clock: the blocks of earlier positions are no longer
    /// needed this epoch). One 8-byte write in place; nothing in a
    /// process forked from the registrant (the progress is the
    /// registrant's).
    pub fn advance(&self, position: u64) -> Result<()> {
        if self.pid != std::process::id() {
            return Ok(());
        }
        let position = position.min(self.epoch_len.saturating_mul(2));
        self.file
            .write_all_at(&position.to_le_bytes(), PROGRESS_AT)
            .map_err(Error::io("advance plan record", &self.path))
    }

    /// The record's path (`<tier_dir>/plans/<token>.plan`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PlanHandle {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // Removed while still locked: a reader never takes a record
            // being dropped for a dead one and then meets another's file.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes the record of `objects` under `<tier_root>/plans/` and returns
/// its handle (progress 0).
pub(crate) fn register(
    tier_root: &Path,
    objects: Vec<ObjectPlan>,
    epoch_len: u64,
) -> Result<PlanHandle> {
    let dir = tier_root.join(PLANS_DIR);
    std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    let bytes = PlanRecord {
        progress: 0,
        epoch_len,
        objects,
    }
    .encode();
    let tmp = durable_fs::unique_temp_path(&dir, "plan");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(Error::io("create plan record", &tmp))?;
    let written = lock_exclusive(&file)
        .and_then(|()| file.write_all_at(&bytes, 0))
        .map_err(Error::io("write plan record", &tmp));
    let path = dir.join(format!("{}{PLAN_SUFFIX}", durable_fs::host_pid_token()));
    let placed = written.and_then(|()| {
        std::fs::rename(&tmp, &path).map_err(Error::io("rename plan record into place", &path))
    });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(PlanHandle {
        file,
        path,
        epoch_len,
        pid: std::process::id(),
    })
}

/// Takes an exclusive `flock` of `file`, waiting for a reader that holds
/// a shared one for a moment.
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl RemoteFile {
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

    /// This object's part of a record: its blocks' uses in every list of
    /// `uses` (see [`set_plan`](Self::set_plan)).
    fn object_plan(&self, uses: &[&Reads], epoch_len: u64) -> Result<ObjectPlan> {
        let state = self.state();
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

/// One object's part of a plan: the file and its reads, `(byte range,
/// position)` as [`RemoteFile::set_plan`] takes them.
pub type ObjectReads<'a> = (&'a RemoteFile, &'a Reads);

/// Reads of one object: `(byte range, position)`.
type Reads = [(Range<u64>, u64)];

/// [`RemoteFile::set_plan`] of several objects of one tier in one record
/// (a store of many files, such as a segment store, read in one order):
/// each `(file, uses)` as `set_plan` takes them; a file given twice counts
/// once, with both lists of uses. Fails as `set_plan` does, or on files of
/// different local tiers, or on none at all.
pub fn set_plans(files: &[ObjectReads<'_>], epoch_len: u64) -> Result<PlanHandle> {
    let Some((first, _)) = files.first() else {
        return Err(Error::Runtime("a plan of no object".into()));
    };
    let root = first.state().tier.dir.root.clone();
    // Each object once, with every list of uses it was given.
    let mut grouped: Vec<(&RemoteFile, Vec<&Reads>)> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for (file, uses) in files {
        let state = file.state();
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
        .map(|(file, uses)| file.object_plan(uses, epoch_len))
        .collect::<Result<Vec<ObjectPlan>>>()?;
    register(&root, objects, epoch_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the environment of the child of
    /// `a_dead_registrants_record_is_removed`: the tier directory.
    const CHILD_ROOT: &str = "REMOTE_TIER_PLAN_CHILD";

    fn plan(key: &str, uses: &[(u32, u32, u32, u32)]) -> ObjectPlan {
        ObjectPlan {
            key: key.into(),
            block_size: 4096,
            uses: uses
                .iter()
                .map(|&(block, first, last, next_first)| BlockUse {
                    block,
                    first,
                    last,
                    next_first,
                })
                .collect(),
        }
    }

    fn records_in(root: &Path) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(root.join(PLANS_DIR))
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        out.sort();
        out
    }

    #[test]
    fn a_record_round_trips_and_progress_is_outside_its_checksum() {
        let record = PlanRecord {
            progress: 3,
            epoch_len: 10,
            objects: vec![
                plan(
                    "a%2Fpages",
                    &[(0, 0, 4, 12), (7, 2, 2, NONE), (9, NONE, NONE, 10)],
                ),
                plan("b", &[]),
            ],
        };
        let mut bytes = record.encode();
        assert_eq!(PlanRecord::decode(&bytes), Ok(record.clone()));
        bytes[PROGRESS_AT as usize..][..8].copy_from_slice(&7u64.to_le_bytes());
        let moved = PlanRecord::decode(&bytes).unwrap();
        assert_eq!(moved.progress, 7);
        assert_eq!(moved.objects, record.objects);
    }

    #[test]
    fn a_torn_or_altered_record_does_not_decode() {
        let bytes = PlanRecord {
            progress: 0,
            epoch_len: 4,
            objects: vec![plan("a", &[(1, 0, 1, 5)])],
        }
        .encode();
        for cut in [0, 8, HEADER_LEN, bytes.len() - 1] {
            assert!(PlanRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut altered = bytes.clone();
        altered[HEADER_LEN + 4] ^= 1;
        assert!(PlanRecord::decode(&altered).is_err());
        let mut newer = bytes;
        newer[8] = 2;
        let err = PlanRecord::decode(&newer).unwrap_err();
        assert!(err.contains("version 2"), "{err}");
    }

    #[test]
    fn positions_outside_their_epoch_do_not_decode() {
        for bad in [
            (0, 3, 1, NONE),
            (0, 1, 4, NONE),
            (0, NONE, NONE, 3),
            (0, 1, NONE, NONE),
        ] {
            let bytes = PlanRecord {
                progress: 0,
                epoch_len: 4,
                objects: vec![plan("a", &[bad])],
            }
            .encode();
            assert!(PlanRecord::decode(&bytes).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn distance_follows_progress_through_this_epoch_into_the_next() {
        let u = BlockUse {
            block: 0,
            first: 2,
            last: 5,
            next_first: 9,
        };
        let at: Vec<Option<u64>> = [0, 2, 4, 5, 6, 9, 10].map(|p| u.distance(p)).into();
        assert_eq!(
            at,
            [Some(2), Some(0), Some(0), Some(0), Some(3), Some(0), None]
        );
        let only_next = BlockUse {
            next_first: 7,
            ..BlockUse::unused(1)
        };
        assert_eq!(only_next.distance(1), Some(6));
        assert_eq!(BlockUse::unused(2).distance(0), None);
    }

    #[test]
    fn next_uses_is_the_minimum_over_live_records_each_at_its_progress() {
        let dir = tempfile::tempdir().unwrap();
        let a = register(
            dir.path(),
            vec![plan(
                "k",
                &[(0, 1, 1, NONE), (1, 6, 7, NONE), (2, NONE, NONE, 9)],
            )],
            8,
        )
        .unwrap();
        let b = register(
            dir.path(),
            vec![plan("k", &[(0, 5, 5, NONE), (1, 3, 3, NONE)])],
            8,
        )
        .unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.keys().collect::<Vec<_>>(), ["k"]);
        assert_eq!(
            [0, 1, 2, 3].map(|b| uses.distance("k", b)),
            [Some(1), Some(3), Some(9), None]
        );
        // This epoch a reads blocks 0 and 1, b blocks 0 and 1 (block 2 is
        // a's next epoch only): four blocks of 4 KiB, shared ones twice.
        assert_eq!(uses.epoch_bytes(), 4 * 4096);
        let k = uses.object("k");
        assert_eq!(
            [0, 1, 2, 3].map(|b| k.distance(b)),
            [Some(1), Some(3), Some(9), None]
        );
        assert_eq!(uses.object("absent").distance(0), None);
        a.advance(2).unwrap();
        b.advance(4).unwrap();
        let uses = next_uses(dir.path());
        // a: block 0 is done (next none), block 1 at 6 → 4, block 2 at 9 → 7;
        // b: block 0 at 5 → 1, block 1 is done.
        assert_eq!(
            [0, 1, 2].map(|b| uses.distance("k", b)),
            [Some(1), Some(4), Some(7)]
        );
        drop(a);
        drop(b);
        assert_eq!(next_uses(dir.path()).keys().count(), 0);
        assert!(
            records_in(dir.path()).is_empty(),
            "dropping removes the record"
        );
    }

    #[test]
    fn a_torn_record_of_a_live_registrant_is_ignored_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let handle = register(dir.path(), vec![plan("k", &[(0, 0, 0, NONE)])], 2).unwrap();
        let torn = handle.path().to_path_buf();
        let len = std::fs::metadata(&torn).unwrap().len();
        let live = register(dir.path(), vec![plan("j", &[(3, 1, 1, NONE)])], 2).unwrap();
        // Torn: the tail is gone (a registrant that wrote it some other way).
        File::options()
            .write(true)
            .open(&torn)
            .unwrap()
            .set_len(len - 5)
            .unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.keys().collect::<Vec<_>>(), ["j"]);
        assert_eq!(uses.distance("k", 0), None);
        assert_eq!(uses.distance("j", 3), Some(1));
        assert!(torn.exists(), "a live registrant's record stays");
        drop((handle, live));
    }

    #[test]
    fn a_record_read_before_is_read_again_when_its_bytes_change() {
        let dir = tempfile::tempdir().unwrap();
        let handle = register(dir.path(), vec![plan("k", &[(0, 2, 2, NONE)])], 4).unwrap();
        let path = handle.path().to_path_buf();
        assert_eq!(next_uses(dir.path()).distance("k", 0), Some(2));
        assert!(decoded().contains_key(&path), "indexed once");
        // Only the progress moved: read from the record, not the index.
        handle.advance(1).unwrap();
        assert_eq!(next_uses(dir.path()).distance("k", 0), Some(1));
        handle.advance(3).unwrap();
        let uses = next_uses(dir.path());
        assert_eq!(uses.distance("k", 0), None);
        assert!(!uses.plans("k") && uses.keys().count() == 0, "read no more");
        // Cut in place (same inode): its length tells, and it no longer decodes.
        let len = std::fs::metadata(&path).unwrap().len();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        handle.advance(0).unwrap();
        assert_eq!(next_uses(dir.path()).distance("k", 0), None);
        assert!(
            !decoded().contains_key(&path),
            "a record that no longer decodes leaves"
        );
        drop(handle);
        assert_eq!(next_uses(dir.path()).keys().count(), 0);
    }

    /// The child half of `a_dead_registrants_record_is_removed` (does
    /// nothing unless spawned by it): registers a plan, says so, and
    /// waits to be killed.
    #[test]
    fn registrant_child() {
        let Ok(root) = std::env::var(CHILD_ROOT) else {
            return;
        };
        let _handle = register(Path::new(&root), vec![plan("k", &[(0, 0, 0, 2)])], 2).unwrap();
        println!("\nREGISTERED");
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
        // Killed before stdin closes; never drops its handle itself.
        std::thread::sleep(Duration::from_secs(60));
    }

    #[test]
    fn a_dead_registrants_record_is_removed() {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "plans::tests::registrant_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ROOT, dir.path())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let registered = lines.any(|l| l.is_ok_and(|l| l == "REGISTERED"));
        let live = next_uses(dir.path()).distance("k", 0);
        // SAFETY: kill takes no pointer; the pid is our own child's, not
        // yet waited for.
        let killed = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        let status = child.wait().unwrap();
        assert!(registered, "the child registered its plan");
        assert_eq!(killed, 0);
        assert!(!status.success());
        assert_eq!(live, Some(0), "the live child's plan counts");
        assert_eq!(records_in(dir.path()).len(), 1);
        assert_eq!(
            next_uses(dir.path()).keys().count(),
            0,
            "a dead registrant's plan does not"
        );
        assert!(
            records_in(dir.path()).is_empty(),
            "and its record is removed"
        );
    }

    /// A tier at `url` (`memory://`) in `local`, of 64 KiB blocks, which
    /// fetches only objects of one block whole.
    fn block_tier(local: &Path, url: &str) -> crate::RemoteTier {
        let mut config = crate::TierConfig::new(local, 64 << 20);
        config.block_size = 1 << 16;
        config.whole_file_max = 1 << 16;
        crate::RemoteTier::open(url, config).unwrap()
    }

    #[test]
    fn set_plan_records_each_blocks_first_last_and_next_use() {
        let local = tempfile::tempdir().unwrap();
        let tier = block_tier(local.path(), "memory:///plans/set");
        tier.put_bytes("pages", vec![7u8; 300_000]).unwrap();
        let file = tier.open_object("pages").unwrap();
        let b = 1u64 << 16;
        let handle = file
            .set_plan(
                &[
                    (0..10, 3),
                    (b - 1..b + 1, 1),
                    (0..1, 0),
                    (4 * b..4 * b + 5, 6),
                    (5..5, 0),
                ],
                4,
            )
            .unwrap();
        let uses = next_uses(local.path());
        let key = crate::local::LocalDir::key("pages");
        assert_eq!(
            [0, 1, 2, 3, 4].map(|i| uses.distance(&key, i)),
            [Some(0), Some(1), None, None, Some(6)]
        );
        let bytes = std::fs::read(handle.path()).unwrap();
        let record = PlanRecord::decode(&bytes).unwrap();
        assert_eq!(
            record.objects[0].uses,
            [
                BlockUse {
                    block: 0,
                    first: 0,
                    last: 3,
                    next_first: NONE
                },
                BlockUse {
                    block: 1,
                    first: 1,
                    last: 1,
                    next_first: NONE
                },
                BlockUse {
                    block: 4,
                    first: NONE,
                    last: NONE,
                    next_first: 6
                },
            ]
        );
        assert!(
            file.set_plan(&[(0..300_001, 0)], 4).is_err(),
            "past the end"
        );
        assert!(
            file.set_plan(&[(0..1, 8)], 4).is_err(),
            "past the next epoch"
        );
        drop(handle);
        assert_eq!(next_uses(local.path()).keys().count(), 0);
    }

    #[test]
    fn set_plans_records_several_objects_in_one_record() {
        let local = tempfile::tempdir().unwrap();
        let tier = block_tier(local.path(), "memory:///plans/many");
        let b = 1u64 << 16;
        for name in ["a", "b"] {
            tier.put_bytes(name, vec![1u8; 3 << 16]).unwrap();
        }
        let (a, bf) = (
            tier.open_object("a").unwrap(),
            tier.open_object("b").unwrap(),
        );
        let a_uses = [(0..10, 2), (2 * b..2 * b + 1, 5)];
        let b_uses = [(b..b + 1, 1)];
        let a_again = [(0..1, 1)];
        let handle = set_plans(
            &[(&a, &a_uses[..]), (&bf, &b_uses[..]), (&a, &a_again[..])],
            4,
        )
        .unwrap();
        let record = PlanRecord::decode(&std::fs::read(handle.path()).unwrap()).unwrap();
        assert_eq!(record.objects.len(), 2, "one entry per object");
        let uses = next_uses(local.path());
        let (ka, kb) = (
            crate::local::LocalDir::key("a"),
            crate::local::LocalDir::key("b"),
        );
        // a's block 0: both lists' uses (first 1, last 2); block 2 next epoch.
        assert_eq!(record.objects[0].uses[0].first, 1);
        assert_eq!(record.objects[0].uses[0].last, 2);
        assert_eq!(
            [0, 1, 2].map(|i| uses.distance(&ka, i)),
            [Some(1), None, Some(5)]
        );
        assert_eq!(
            [0, 1, 2].map(|i| uses.distance(&kb, i)),
            [None, Some(1), None]
        );
        assert!(set_plans(&[], 4).is_err(), "a plan of nothing");
        let other = tempfile::tempdir().unwrap();
        let elsewhere = block_tier(other.path(), "memory:///plans/many-other");
        elsewhere.put_bytes("c", vec![1u8; 10]).unwrap();
        let c = elsewhere.open_object("c").unwrap();
        let err = set_plans(&[(&a, &a_uses[..]), (&c, &[(0..1, 0)][..])], 4).unwrap_err();
        assert!(err.to_string().contains("two local tiers"), "{err}");
        drop(handle);
        assert_eq!(next_uses(local.path()).keys().count(), 0);
    }

    #[test]
    fn under_a_plan_a_prefetch_frees_a_quarter_of_a_reads_slack() {
        let local = tempfile::tempdir().unwrap();
        let b = 1u64 << 16;
        let mut config = crate::TierConfig::new(local.path(), 64 * b);
        config.block_size = b;
        config.whole_file_max = b;
        config.prefetch_blocks = 0;
        let tier = crate::RemoteTier::open("memory:///plans/slack", config).unwrap();
        let blocks = 640u64;
        tier.put_bytes("o", vec![3u8; (blocks * b) as usize])
            .unwrap();
        let file = tier.open_leased("o", None).unwrap();
        // Block i is read at batch i, this epoch and the next: the epoch
        // reads 640 blocks on a budget of 64, so the slack of a read is
        // (640 - 64) blocks / 64, capped at the LRU's four blocks, and a
        // prefetch's a quarter of that, one block.
        let uses: Vec<(Range<u64>, u64)> = (0..blocks)
            .flat_map(|i| [(i * b..i * b + 1, i), (i * b..i * b + 1, blocks + i)])
            .collect();
        let plan = file.set_plan(&uses, blocks).unwrap();
        let mut buf = [0u8; 1];
        for i in 0..63u64 {
            file.read_at(i * b, &mut buf).unwrap();
            plan.advance(i + 1).unwrap();
        }
        let evicted = || tier.stats().unwrap().evicted_bytes;
        // Full (63 blocks and the maps): a prefetch frees its block and
        // its slack, two blocks (those read furthest ahead); the next
        // prefetch then fits.
        let state = file.state();
        let before = evicted();
        assert!(state.prefetch_block(64, 1).unwrap());
        assert_eq!(evicted() - before, 2 * b, "a block and its slack");
        let before = evicted();
        assert!(state.prefetch_block(65, 2).unwrap());
        assert_eq!(evicted() - before, 0, "room left by the first");
        // A read frees its block and the slack.
        plan.advance(64).unwrap();
        let before = evicted();
        file.read_at(66 * b, &mut buf).unwrap();
        let freed = evicted() - before;
        assert_eq!(freed, 5 * b, "the read's block and the slack");
        let before = evicted();
        file.read_at(67 * b, &mut buf).unwrap();
        assert_eq!(
            evicted() - before,
            0,
            "the slack made room for the next read"
        );
        assert!(tier.stats().unwrap().allocated <= 64 * b);
    }

    #[test]
    fn under_a_plan_read_ahead_fetches_only_the_blocks_read_soon() {
        let local = tempfile::tempdir().unwrap();
        let tier = block_tier(local.path(), "memory:///plans/ahead");
        let b = 1u64 << 16;
        for name in ["planned", "unplanned"] {
            tier.put_bytes(name, vec![7u8; 16 << 16]).unwrap();
        }
        let present = |file: &RemoteFile, blocks: std::ops::Range<u64>| -> Vec<bool> {
            blocks.map(|i| file.state().has(i)).collect()
        };
        let settled = |file: &RemoteFile, want: std::ops::Range<u64>| {
            let until = std::time::Instant::now() + Duration::from_secs(10);
            while want.clone().any(|i| !file.state().has(i)) && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Let any other read-ahead land too.
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut buf = [0u8; 10];

        // No plan: a read that jumps reads nothing ahead; the next read,
        // which continues it, the four blocks after it.
        let file = tier.open_object("unplanned").unwrap();
        file.read_at(7 * b, &mut buf).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(present(&file, 7..9), [true, false]);
        file.read_at(8 * b, &mut buf).unwrap();
        settled(&file, 9..13);
        assert_eq!(
            present(&file, 7..14),
            [true, true, true, true, true, true, false]
        );

        // A plan reading block 2 next batch and block 3 ten batches on:
        // only block 2 of the window 1..5 is read ahead.
        let file = tier.open_object("planned").unwrap();
        let _plan = file
            .set_plan(
                &[(0..1, 0), (2 * b..2 * b + 1, 1), (3 * b..3 * b + 1, 10)],
                16,
            )
            .unwrap();
        file.read_at(0, &mut buf).unwrap();
        settled(&file, 2..3);
        assert_eq!(
            present(&file, 0..6),
            [true, false, true, false, false, false]
        );
    }
}
