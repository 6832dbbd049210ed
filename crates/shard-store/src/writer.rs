//! Generating shards from the source and making them durable.
//!
//! A shard is generated under its own lock file (`locks/shard-<start>.lock`,
//! an `flock` that also excludes other threads of this process, since each
//! taker opens the file anew), so that across threads and processes it is
//! generated once. The pickle goes to `scratch/`, is fsynced, and is renamed
//! into `shards/` under the root-wide `writer_lock.lock` (which loadit takes
//! too), after which the directory is fsynced. A reader therefore only ever
//! sees complete shard files.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use durable_fs::FileLock;

use crate::error::{Error, Result};
use crate::format::{self, COMPLETED_FILE, Metadata, ShardName, StoreItem};
use crate::inner::{Cursor, Inner};

/// Atomically replaces `dest` by `bytes`: a unique temporary file in
/// `scratch` (loadit's layout keeps temporaries out of the root), fsync,
/// rename, fsync of `dest`'s directory.
pub(crate) fn replace_file(scratch: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = durable_fs::unique_temp_path(scratch, "metadata");
    durable_fs::write_synced(&tmp, bytes)
        .and_then(|()| durable_fs::rename_and_sync(&tmp, dest))
        .map_err(Error::durable)
}

impl<T: StoreItem> Inner<T> {
    /// Generates the shard at `start` once across threads and processes.
    /// `Ok(None)` when `start` is past the end of the source.
    pub(crate) fn generate(&self, start: u64) -> Result<Option<Arc<Vec<T>>>> {
        let _lock = FileLock::exclusive(&self.shard_lock_path(start)).map_err(Error::durable)?;
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
        // A seekable source restarts at the shard wanted unless the cursor
        // is already there; a plain one only when the cursor is past it.
        let resume = if source.seekable {
            self.resume_point(start)?
        } else {
            0
        };
        let restart = match guard.as_ref() {
            Some(c) => c.pos > start || c.pos < resume,
            None => true,
        };
        if restart {
            **guard = Some(Cursor {
                iter: source.iter_from(resume),
                pos: resume,
                done: false,
            });
        }
        match guard.as_mut() {
            Some(c) => Ok(c),
            None => unreachable!("cursor was just set"),
        }
    }

    /// Where a seekable source resumes to reach `target`: the shard
    /// boundary at or below it, held below what is known to exist (the
    /// final length, else the furthest shard on disk), because a seek past
    /// the end could not tell where the end is.
    fn resume_point(&self, target: u64) -> Result<u64> {
        let known = match self.state.lock().length {
            Some(len) => len,
            None => self.shard_files()?.iter().map(|n| n.end).max().unwrap_or(0),
        };
        let at = target.min(known);
        Ok(at - at % self.shard_len)
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
                if let Some(_lock) =
                    FileLock::try_exclusive(&self.shard_lock_path(start)).map_err(Error::durable)?
                {
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
        let _lock = FileLock::exclusive(&self.paths.writer_lock).map_err(Error::durable)?;
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
        let tmp = durable_fs::unique_temp_path(&self.paths.scratch, &file_name);
        durable_fs::write_synced(&tmp, &bytes).map_err(Error::durable)?;
        let _lock = FileLock::exclusive(&self.paths.writer_lock).map_err(Error::durable)?;
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
        durable_fs::rename_and_sync(&tmp, &dest).map_err(Error::durable)?;
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
        let names = self.shard_files()?;
        {
            let mut state = self.state.lock();
            // Names gone since (evicted by another process) are forgotten.
            if state.disk_size.len() > names.len() {
                let listed: std::collections::HashSet<&ShardName> = names.iter().collect();
                state.disk_size.retain(|n, _| listed.contains(n));
            }
            for name in names {
                let size = match state.disk_size.get(&name) {
                    Some(&s) => s,
                    None => {
                        let path = self.paths.shards.join(name.file_name(self.compression));
                        let Ok(md) = std::fs::metadata(&path) else {
                            continue;
                        };
                        state.disk_size.insert(name, md.len());
                        md.len()
                    }
                };
                files.push((name, size));
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
                Err(e) => return Err(Error::io("evict shard", &path)(e)),
            }
            let mut state = self.state.lock();
            state.disk_access.remove(&name.start);
            state.disk_size.remove(&name);
            drop(state);
            total = total.saturating_sub(size);
            evicted = true;
        }
        if evicted {
            durable_fs::remove_and_sync(&self.root.join(COMPLETED_FILE)).map_err(Error::durable)?;
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
                // loadit's flag is an empty file: creating it and
                // fsyncing the root is its whole commit.
                File::create(&flag).map_err(Error::io("create", &flag))?;
                durable_fs::sync_dir(&self.root).map_err(Error::durable)?;
            }
        } else {
            durable_fs::remove_and_sync(&flag).map_err(Error::durable)?;
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
