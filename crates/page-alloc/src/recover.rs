//! Crash recovery: what a crashed writer leaves, and how it is cleaned up.
//!
//! A writer only ever writes `<name>.tmp` and renames it to `<name>` after
//! the footer is durable, so a crash leaves at most a stale temporary file
//! next to an untouched (old or absent) final file. [`recover`] removes
//! that leftover when no writer holds `<name>.lock`;
//! [`crate::PageWriter::create`] does the same before it starts.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// `<name>.tmp` next to `path`: where a writer builds the file.
pub fn temp_path(path: &Path) -> PathBuf {
    with_suffix(path, ".tmp")
}

/// `<name>.lock` next to `path`: the writers' advisory lock.
pub fn lock_path(path: &Path) -> PathBuf {
    with_suffix(path, ".lock")
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// Removes the temporary file a crashed writer of `path` left behind.
/// Returns whether there was one. Leaves everything alone (and returns
/// [`Error::Locked`]) while a writer holds the lock.
pub fn recover(path: impl AsRef<Path>) -> Result<bool> {
    let path = path.as_ref();
    let tmp = temp_path(path);
    if !tmp.exists() {
        return Ok(false);
    }
    let _lock = lock_writer(path)?;
    std::fs::remove_file(&tmp).map_err(|e| Error::io(&tmp, "remove stale temporary file", e))?;
    Ok(true)
}

/// The exclusive writer lock of `path` (on `<path>.lock`), released on drop.
#[derive(Debug)]
pub(crate) struct WriterLock(File);

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Unlock explicitly: a child forked meanwhile by another thread
        // shares the descriptor until it execs, so a close alone could
        // leave the lock held.
        let _ = fs2::FileExt::unlock(&self.0);
    }
}

/// Takes the writer lock of `path`, or [`Error::Locked`] when another
/// writer holds it.
pub(crate) fn lock_writer(path: &Path) -> Result<WriterLock> {
    let lock_file = lock_path(path);
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_file)
        .map_err(|e| Error::io(&lock_file, "open lock file", e))?;
    if fs2::FileExt::try_lock_exclusive(&lock).is_err() {
        return Err(Error::Locked {
            path: path.to_path_buf(),
            lock: lock_file,
        });
    }
    Ok(WriterLock(lock))
}

/// fsyncs the directory holding `path`, making a rename in it durable.
pub(crate) fn sync_parent_dir(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "fsync directory", e))
}
