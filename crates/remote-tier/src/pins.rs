//! Pins: which local copies a process has open, so that eviction (in any
//! process) leaves them alone — with one descriptor per tier and process,
//! whatever the number of objects open.
//!
//! Each process that opens objects in a tier keeps one pin record,
//! `pins/<host>-<pid>-<nanos>-<n>`, exclusively `flock`ed for the
//! process's life: a bitmap of [`BUCKETS`] bits, bit `b` set while the
//! process holds any object whose key hashes to bucket `b`. Eviction
//! (under `tier.lock`) reads the records whose lock it cannot take (their
//! process lives; one it can take is a dead process's, and is removed)
//! and keeps every object whose bucket is set in any of them. Two keys of
//! one bucket only keep a copy longer than needed: never less.
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
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use durable_fs::{FileLock, PerProcess};

use crate::{Error, Result};

/// Buckets of a pin record: 4 Mi bits, a 512 KiB (sparse) file. With
/// 100,000 objects open, about one unpinned object in 40 shares a bucket
/// with an open one (and is kept too).
pub(crate) const BUCKETS: u64 = 1 << 22;

/// The directory of the pin records, inside the tier directory.
pub(crate) const PINS_DIR: &str = "pins";

/// The pin records of this process, by tier directory.
#[derive(Default)]
struct Records {
    tiers: HashMap<PathBuf, Record>,
}

/// This process's pin record of one tier.
struct Record {
    file: File,
    path: PathBuf,
    /// Handles per bucket; a bucket is set in the file while above zero.
    counts: HashMap<u64, u32>,
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
    pid: u32,
}

impl Pin {
    /// Pins the object `key` of the tier at `root` for this process:
    /// takes `tier.lock` (at most `wait`) when the bucket is not yet set.
    pub(crate) fn take(root: &Path, key: &str, wait: Duration) -> Result<Pin> {
        let bucket = bucket(key);
        let pin = Pin {
            root: root.to_path_buf(),
            bucket,
            pid: std::process::id(),
        };
        {
            let mut records = records();
            let record = records.record(root)?;
            if let Some(n) = record.counts.get_mut(&bucket) {
                *n += 1;
                return Ok(pin);
            }
        }
        // Set under the tier lock, which every eviction holds: one that
        // already looked for pins has removed what it evicts by the time
        // this holds it.
        let _tier = FileLock::exclusive_within(&root.join("tier.lock"), wait)?;
        let mut records = records();
        let record = records.record(root)?;
        let n = record.counts.entry(bucket).or_insert(0);
        *n += 1;
        if *n == 1 {
            record.write_byte(bucket)?;
        }
        Ok(pin)
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
        let gone = match record.counts.get_mut(&self.bucket) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => true,
            None => false,
        };
        if gone {
            record.counts.remove(&self.bucket);
            // Best effort: a bit left set only keeps a copy longer.
            let _ = record.write_byte(self.bucket);
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
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(Error::io("create pin record", &path))?;
            file.set_len(BUCKETS / 8)
                .map_err(Error::io("size pin record", &path))?;
            // SAFETY: flock on a descriptor this function owns; it takes no
            // pointer and has no other effect on memory.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if locked != 0 {
                let e = std::io::Error::last_os_error();
                let _ = std::fs::remove_file(&path);
                return Err(Error::io("lock pin record", &path)(e));
            }
            self.tiers.insert(
                root.to_path_buf(),
                Record {
                    file,
                    path,
                    counts: HashMap::new(),
                },
            );
        }
        Ok(self.tiers.get_mut(root).expect("inserted above"))
    }
}

impl Record {
    /// Writes the byte that holds `bucket` as the counts say.
    fn write_byte(&self, bucket: u64) -> Result<()> {
        let first = bucket / 8 * 8;
        let byte = (0..8u64)
            .filter(|i| self.counts.contains_key(&(first + i)))
            .fold(0u8, |b, i| b | (1 << i));
        self.file
            .write_all_at(&[byte], bucket / 8)
            .map_err(Error::io("write pin record", &self.path))
    }
}

/// The buckets every living process of the tier at `root` holds, read
/// from their pin records (call with `tier.lock` held). Records of dead
/// processes are removed.
pub(crate) fn held(root: &Path) -> Result<Held> {
    let dir = root.join(PINS_DIR);
    let mut bits = vec![0u8; (BUCKETS / 8) as usize];
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Held(bits)),
        Err(e) => return Err(Error::io("list directory", &dir)(e)),
    };
    let mut buf = vec![0u8; bits.len()];
    for entry in entries {
        let entry = entry.map_err(Error::io("list directory", &dir))?;
        let path = entry.path();
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("open pin record", &path)(e)),
        };
        // SAFETY: flock on a descriptor this function owns.
        let free = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0;
        if free {
            // Its process is gone: nothing it held is open.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        buf.fill(0);
        let mut at = 0;
        while at < buf.len() {
            match file.read_at(&mut buf[at..], at as u64) {
                Ok(0) => break,
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("read pin record", &path)(e)),
            }
        }
        for (b, r) in bits.iter_mut().zip(&buf) {
            *b |= r;
        }
    }
    Ok(Held(bits))
}

/// The union of the living pin records of a tier.
pub(crate) struct Held(Vec<u8>);

impl Held {
    /// Whether some process may hold the object `key`.
    pub(crate) fn has(&self, key: &str) -> bool {
        let b = bucket(key);
        self.0
            .get((b / 8) as usize)
            .is_some_and(|byte| byte & (1 << (b % 8)) != 0)
    }
}

/// Removes the pin records of dead processes of the tier at `root` (their
/// lock is free), best effort.
pub(crate) fn remove_dead(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root.join(PINS_DIR)) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(file) = File::open(entry.path()) else {
            continue;
        };
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
