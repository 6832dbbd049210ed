//! The local tier directory: names, locks, usage and LRU eviction.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use std::time::SystemTime;

use durable_fs::FileLock;

use crate::pins::{self, Pin};
use crate::{Error, Result};

/// Suffix of a whole fetched object (complete and verified).
pub(crate) const WHOLE: &str = ".whole";
/// Suffix of the sparse local file of a block-fetched object.
pub(crate) const SPARSE: &str = ".sparse";
/// Suffix of a block-fetched object's block map.
pub(crate) const BLOCKS: &str = ".blocks";

/// Names longer than this are shortened (file names stop at 255 bytes).
const MAX_KEY: usize = 160;

/// The local tier's directories.
#[derive(Debug)]
pub(crate) struct LocalDir {
    pub(crate) root: PathBuf,
    objects: PathBuf,
    locks: PathBuf,
    pub(crate) tmp: PathBuf,
    /// The longest wait for a lock another process holds: a fetch it
    /// guards ends within a call's bound, so a holder past it has stopped.
    wait: Duration,
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
    /// Objects kept over budget because a reader has them open.
    pub pinned: u64,
}

impl LocalDir {
    /// Opens (creating) the tier directory and sweeps what dead processes
    /// left: their fetches' temporary files, fetch-lock files no one
    /// holds, and pins of the older layout (`locks/<key>.pin`) no one
    /// holds, and the pin records of dead processes.
    pub(crate) fn open(root: &Path, wait: Duration) -> Result<LocalDir> {
        let dir = LocalDir {
            root: root.to_path_buf(),
            objects: root.join("objects"),
            locks: root.join("locks"),
            tmp: root.join("tmp"),
            wait,
        };
        for d in [&dir.root, &dir.objects, &dir.locks, &dir.tmp] {
            std::fs::create_dir_all(d).map_err(Error::io("create directory", d))?;
        }
        durable_fs::remove_dead_temp_files(&dir.tmp);
        dir.sweep_locks()?;
        pins::remove_dead(&dir.root);
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

    /// Held by every open handle of the object: eviction skips an object
    /// that any living process pins (see [`crate::pins`]).
    pub(crate) fn pin(&self, key: &str) -> Result<Pin> {
        Pin::take(&self.root, key, self.wait)
    }

    /// The pin of the older layout: a shared `flock` per object, which a
    /// process of an older build may still hold.
    fn legacy_pin_path(&self, key: &str) -> PathBuf {
        self.locks.join(format!("{key}.pin"))
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
            &self.root.join("tier.lock"),
            self.wait,
        )?)
    }

    /// Local objects by key: allocated bytes and last use.
    fn scan(&self) -> Result<HashMap<String, (u64, SystemTime, bool)>> {
        let mut found: HashMap<String, (u64, SystemTime, bool)> = HashMap::new();
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
            } else {
                continue;
            };
            let meta = match entry.metadata() {
                Ok(m) => m,
                // Removed by another process meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("stat", &entry.path())(e)),
            };
            let slot = found
                .entry(key.to_string())
                .or_insert((0, SystemTime::UNIX_EPOCH, sparse));
            slot.0 += meta.blocks() * 512;
            slot.2 |= sparse;
            if data {
                slot.1 = slot
                    .1
                    .max(meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
            }
        }
        Ok(found)
    }

    /// Bytes the local tier holds on disk (sparse files count only their
    /// fetched blocks).
    pub(crate) fn usage(&self) -> Result<u64> {
        Ok(self.scan()?.values().map(|v| v.0).sum())
    }

    /// Removes least-recently-used local copies until the tier holds at
    /// most `budget` bytes. Only fetched copies live here, so nothing
    /// removed is the only copy; objects a reader has open are skipped.
    pub(crate) fn evict(&self, budget: u64) -> Result<EvictReport> {
        let _tier = self.lock_tier()?;
        let found = self.scan()?;
        let total: u64 = found.values().map(|v| v.0).sum();
        let mut report = EvictReport {
            bytes_before: total,
            bytes_after: total,
            ..EvictReport::default()
        };
        if total <= budget {
            return Ok(report);
        }
        let held = pins::held(&self.root)?;
        let mut by_age: Vec<_> = found.into_iter().collect();
        by_age.sort_by_key(|(_, (_, used, _))| *used);
        for (key, (bytes, _, sparse)) in by_age {
            if report.bytes_after <= budget {
                break;
            }
            if held.has(&key) {
                report.pinned += 1;
                continue;
            }
            // A handle of an older build holds its own pin file: honoured,
            // and removed with the copy it guards.
            let legacy = self.legacy_pin_path(&key);
            let _legacy = match legacy.exists() {
                true => match FileLock::try_exclusive_live(&legacy)? {
                    Some(lock) => Some(lock.remove_on_drop()),
                    None => {
                        report.pinned += 1;
                        continue;
                    }
                },
                false => None,
            };
            // The map goes first: a sparse file without a map is only
            // space, never mistaken for fetched blocks.
            if sparse {
                durable_fs::remove_and_sync(&self.map(&key))?;
                durable_fs::remove_and_sync(&self.sparse(&key))?;
            }
            durable_fs::remove_and_sync(&self.whole(&key))?;
            report.bytes_after = report.bytes_after.saturating_sub(bytes);
            report.evicted += 1;
        }
        Ok(report)
    }
}

impl LocalDir {
    /// Removes the lock files no one holds: fetch locks (`<key>.<n>.fetch`,
    /// left by a process that died mid-fetch) and pins of the older layout
    /// (`<key>.pin`). One held is left (its holder removes it, or a later
    /// sweep does).
    fn sweep_locks(&self) -> Result<()> {
        let entries =
            std::fs::read_dir(&self.locks).map_err(Error::io("list directory", &self.locks))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list directory", &self.locks))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !(name.ends_with(".pin") || name.ends_with(".fetch")) {
                continue;
            }
            if let Some(held) = FileLock::try_exclusive_live(&entry.path())? {
                drop(held.remove_on_drop());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
