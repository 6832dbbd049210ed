//! Generating shards from the source and making them durable.
//!
//! A shard is generated under its own lock file (`locks/shard-<start>.lock`,
//! an `flock` that also excludes other threads of this process, since each
//! taker opens the file anew), so that across threads and processes it is
//! generated once. The pickle goes to `scratch/`, is fsynced, and is renamed
//! into `shards/` under the root-wide `writer_lock.lock` (which loadit takes
//! too), after which the directory is fsynced. A reader therefore only ever
//! sees complete shard files.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fs2::FileExt;

use crate::error::{Error, Result};
use crate::format::{self, COMPLETED_FILE, Metadata, ShardName};
use crate::store::{Cursor, Inner, StoreItem};

/// An advisory `flock` held until dropped.
#[derive(Debug)]
pub(crate) struct FileLock {
    file: File,
}

impl FileLock {
    fn open(path: &Path) -> Result<File> {
        match OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
        {
            Ok(f) => Ok(f),
            // A read-only lock file (a copied or read-only root): flock
            // works on a read-only descriptor too.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                File::open(path).map_err(|e| Error::io(path, "open lock file", e))
            }
            Err(e) => Err(Error::io(path, "open lock file", e)),
        }
    }

    /// Blocks until the exclusive lock is held.
    pub(crate) fn exclusive(path: &Path) -> Result<FileLock> {
        let file = FileLock::open(path)?;
        FileExt::lock_exclusive(&file).map_err(|e| Error::io(path, "lock", e))?;
        Ok(FileLock { file })
    }

    /// Blocks until a shared lock is held.
    pub(crate) fn shared(path: &Path) -> Result<FileLock> {
        let file = FileLock::open(path)?;
        FileExt::lock_shared(&file).map_err(|e| Error::io(path, "lock", e))?;
        Ok(FileLock { file })
    }

    /// The exclusive lock if it is free right now.
    pub(crate) fn try_exclusive(path: &Path) -> Result<Option<FileLock>> {
        let file = FileLock::open(path)?;
        match FileExt::try_lock_exclusive(&file) {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.raw_os_error() == fs2::lock_contended_error().raw_os_error() => Ok(None),
            Err(e) => Err(Error::io(path, "lock", e)),
        }
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock too; unlocking first is explicit.
        let _ = FileExt::unlock(&self.file);
    }
}

/// fsyncs a directory so that renames and creations in it are durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, "open directory", e))?;
    d.sync_all()
        .map_err(|e| Error::io(dir, "fsync directory", e))
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique temporary name in `scratch` (pid + counter: never shared).
pub(crate) fn temp_path(scratch: &Path, stem: &str) -> PathBuf {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    scratch.join(format!("{stem}.{}.{n}.tmp", std::process::id()))
}

/// Writes `bytes` to a new file at `tmp` and fsyncs it.
pub(crate) fn write_synced(tmp: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(tmp)
        .map_err(|e| Error::io(tmp, "create temp file", e))?;
    f.write_all(bytes).map_err(|e| Error::io(tmp, "write", e))?;
    f.sync_all().map_err(|e| Error::io(tmp, "fsync", e))
}

/// Atomically replaces `dest` by `bytes` (temp in `scratch`, fsync, rename, fsync dir).
pub(crate) fn replace_file(scratch: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(scratch, "metadata");
    write_synced(&tmp, bytes)?;
    std::fs::rename(&tmp, dest).map_err(|e| Error::io(dest, "rename into place", e))?;
    if let Some(dir) = dest.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

impl<T: StoreItem> Inner<T> {
    /// Generates the shard at `start` once across threads and processes.
    /// `Ok(None)` when `start` is past the end of the source.
    pub(crate) fn generate(&self, start: u64) -> Result<Option<Arc<Vec<T>>>> {
        let _lock = FileLock::exclusive(&self.shard_lock_path(start))?;
        // Someone else may have written it while we waited.
        if let Some(shard) = self.load_from_disk_or_quarantine(start)? {
            return Ok(Some(shard));
        }
        if let Some(len) = self.final_length_refreshed()?
            && start >= len
        {
            return Ok(None);
        }
        let items = self.produce(start)?;
        if items.is_empty() {
            return Ok(None);
        }
        let shard = Arc::new(items);
        self.persist(start, &shard)?;
        Ok(Some(shard))
    }

    /// Drives a cursor to the end of the source and records the length.
    pub(crate) fn drive_to_end(&self) -> Result<u64> {
        let mut guard = self.take_cursor(u64::MAX);
        let cursor = self.fresh_cursor_if_needed(&mut guard, u64::MAX)?;
        self.advance(cursor, u64::MAX)?;
        Ok(cursor.pos)
    }

    /// The items `[start, start + shard_len)` from the source (fewer at the end).
    fn produce(&self, start: u64) -> Result<Vec<T>> {
        let mut guard = self.take_cursor(start);
        let cursor = self.fresh_cursor_if_needed(&mut guard, start)?;
        self.advance(cursor, start)?;
        if cursor.done {
            return Ok(Vec::new());
        }
        self.take_shard(cursor)
    }

    /// The next `shard_len` items of `cursor` (fewer when the source ends).
    fn take_shard(&self, cursor: &mut Cursor<T>) -> Result<Vec<T>> {
        let mut items = Vec::with_capacity(self.shard_len.min(1 << 16) as usize);
        while (items.len() as u64) < self.shard_len {
            match cursor.iter.next() {
                Some(x) => {
                    items.push(x);
                    cursor.pos += 1;
                }
                None => {
                    self.source_ended(cursor)?;
                    break;
                }
            }
        }
        Ok(items)
    }

    fn fresh_cursor_if_needed<'g>(
        &self,
        guard: &'g mut parking_lot::MutexGuard<'_, Option<Cursor<T>>>,
        start: u64,
    ) -> Result<&'g mut Cursor<T>> {
        let source = self.source.as_ref().ok_or_else(|| Error::NotCached {
            root: self.root.clone(),
            index: start as usize,
        })?;
        let restart = match guard.as_ref() {
            Some(c) => c.pos > start,
            None => true,
        };
        if restart {
            **guard = Some(Cursor {
                iter: source(),
                pos: 0,
                done: false,
            });
        }
        match guard.as_mut() {
            Some(c) => Ok(c),
            None => unreachable!("cursor was just set"),
        }
    }

    /// Moves `cursor` to `target` (or the end). Full shards passed on the
    /// way are written when there is no disk budget and nobody has them.
    fn advance(&self, cursor: &mut Cursor<T>, target: u64) -> Result<()> {
        while !cursor.done && cursor.pos < target {
            let write_passed = self.opts.memory_limit.is_none()
                && cursor.pos.is_multiple_of(self.shard_len)
                && target - cursor.pos >= self.shard_len
                && self.source.is_some()
                && !self.shard_on_disk(cursor.pos);
            if write_passed {
                let start = cursor.pos;
                if let Some(_lock) = FileLock::try_exclusive(&self.shard_lock_path(start))? {
                    let items = self.take_shard(cursor)?;
                    if !items.is_empty() && !self.shard_on_disk(start) {
                        self.persist(start, &items)?;
                    }
                    continue;
                }
            }
            // Skip to the next shard boundary (or the target).
            let boundary = (cursor.pos / self.shard_len + 1).saturating_mul(self.shard_len);
            let step = boundary.min(target) - cursor.pos;
            for _ in 0..step {
                if cursor.iter.next().is_some() {
                    cursor.pos += 1;
                } else {
                    self.source_ended(cursor)?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Records that the source ended at `cursor.pos`.
    fn source_ended(&self, cursor: &mut Cursor<T>) -> Result<()> {
        cursor.done = true;
        let len = cursor.pos;
        if let Some(known) = self.final_length_refreshed()? {
            if known != len {
                return Err(Error::NondeterministicSource {
                    root: self.root.clone(),
                    reason: format!("it yielded {len} items, the store recorded {known}"),
                });
            }
            return Ok(());
        }
        self.set_final_length(len)
    }

    /// Stores `len` as the final length in memory and in `metadata.json`.
    pub(crate) fn set_final_length(&self, len: u64) -> Result<()> {
        self.state.lock().length = Some(len);
        let _lock = FileLock::exclusive(&self.paths.writer_lock)?;
        let mut meta = self.read_metadata_unlocked()?;
        if !meta.length_final {
            meta.length = len;
            meta.length_final = true;
            self.write_metadata_unlocked(&meta)?;
        }
        self.update_completed_flag_unlocked(&meta)?;
        Ok(())
    }

    /// Writes one shard durably, honouring the disk budget.
    pub(crate) fn persist(&self, start: u64, items: &[T]) -> Result<()> {
        let name = ShardName {
            start,
            end: start + items.len() as u64,
        };
        let file_name = name.file_name(self.compression);
        let dest = self.paths.shards.join(&file_name);
        let bytes = format::encode_shard(&dest, items, self.compression)?;
        let tmp = temp_path(&self.paths.scratch, &file_name);
        if let Err(e) = write_synced(&tmp, &bytes) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let _lock = FileLock::exclusive(&self.paths.writer_lock)?;
        if let Some(existing) = self.find_shard_file(start)?
            && existing.end >= name.end
        {
            // Someone (loadit, another process) wrote it already.
            let _ = std::fs::remove_file(&tmp);
            return Ok(());
        }
        if let Some(limit) = self.opts.memory_limit {
            self.evict_for_unlocked(bytes.len() as u64, limit, start)?;
        }
        std::fs::rename(&tmp, &dest).map_err(|e| Error::io(&dest, "rename shard into place", e))?;
        fsync_dir(&self.paths.shards)?;
        self.touch_disk(start);
        // Shorter shards with the same start are superseded (only the last
        // shard of a deterministic source can have a shorter twin).
        if (items.len() as u64) < self.shard_len || self.state.lock().length.is_none() {
            for other in self.shard_files()? {
                if other.start == start && other.end < name.end {
                    let path = self.paths.shards.join(other.file_name(self.compression));
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        if (items.len() as u64) < self.shard_len {
            self.state.lock().length = Some(name.end);
            let mut meta = self.read_metadata_unlocked()?;
            if !meta.length_final {
                meta.length = name.end;
                meta.length_final = true;
                self.write_metadata_unlocked(&meta)?;
            }
        }
        let meta = self.read_metadata_unlocked()?;
        if meta.length_final {
            self.update_completed_flag_unlocked(&meta)?;
        }
        Ok(())
    }

    /// Deletes least recently used shard files (never `keep`) until
    /// `incoming` more bytes fit in `limit`. Caller holds the writer lock.
    fn evict_for_unlocked(&self, incoming: u64, limit: u64, keep: u64) -> Result<()> {
        let mut files: Vec<(ShardName, u64)> = Vec::new();
        for name in self.shard_files()? {
            let path = self.paths.shards.join(name.file_name(self.compression));
            if let Ok(md) = std::fs::metadata(&path) {
                files.push((name, md.len()));
            }
        }
        let mut total: u64 = files.iter().map(|(_, s)| s).sum();
        if total.saturating_add(incoming) <= limit {
            return Ok(());
        }
        {
            let state = self.state.lock();
            files.sort_by_key(|(n, _)| state.disk_access.get(&n.start).copied().unwrap_or(0));
        }
        let mut evicted = false;
        for (name, size) in files {
            if total.saturating_add(incoming) <= limit {
                break;
            }
            if name.start == keep {
                continue;
            }
            let path = self.paths.shards.join(name.file_name(self.compression));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(&path, "evict shard", e)),
            }
            self.state.lock().disk_access.remove(&name.start);
            total = total.saturating_sub(size);
            evicted = true;
        }
        if evicted {
            let completed = self.root.join(COMPLETED_FILE);
            let _ = std::fs::remove_file(completed);
        }
        Ok(())
    }

    /// Writes `completed` when the length is final and every shard exists.
    /// Caller holds the writer lock.
    fn update_completed_flag_unlocked(&self, meta: &Metadata) -> Result<()> {
        if !meta.length_final {
            return Ok(());
        }
        let flag = self.root.join(COMPLETED_FILE);
        if covers(&self.shard_files()?, meta.length) {
            if !flag.exists() {
                File::create(&flag).map_err(|e| Error::io(&flag, "create", e))?;
                fsync_dir(&self.root)?;
            }
        } else if flag.exists() {
            let _ = std::fs::remove_file(&flag);
        }
        Ok(())
    }

    /// Replaces `metadata.json` atomically. Caller holds the writer lock.
    pub(crate) fn write_metadata_unlocked(&self, meta: &Metadata) -> Result<()> {
        replace_file(&self.paths.scratch, &self.paths.metadata, &meta.to_json())
    }

    pub(crate) fn shard_lock_path(&self, start: u64) -> PathBuf {
        self.paths.locks.join(format!("shard-{start}.lock"))
    }
}

/// Whether `shards` cover `[0, len)` without a gap.
pub(crate) fn covers(shards: &[ShardName], len: u64) -> bool {
    let mut sorted: Vec<ShardName> = shards.to_vec();
    sorted.sort();
    let mut next = 0u64;
    for s in sorted {
        if s.start > next {
            return false;
        }
        next = next.max(s.end);
    }
    next >= len
}
