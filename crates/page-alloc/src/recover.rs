//! Crash recovery: what a crashed writer leaves, and how it is cleaned up.
//!
//! A writer only ever writes `<name>.tmp` and renames it to `<name>` after
//! the footer is durable, so a crash leaves at most a stale temporary file
//! next to an untouched (old or absent) final file. [`recover`] removes
//! that leftover when no writer holds `<name>.lock`;
//! [`crate::PageWriter::create`] does the same before it starts.

use std::path::{Path, PathBuf};

use durable_fs::FileLock;

use crate::{Error, Result};

/// `<name>.tmp` next to `path`: where a writer builds the file.
pub fn temp_path(path: &Path) -> PathBuf {
    durable_fs::temp_path(path)
}

/// `<name>.lock` next to `path`: the writers' advisory lock.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
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
    std::fs::remove_file(&tmp).map_err(Error::io("remove stale temporary file", &tmp))?;
    Ok(true)
}

/// Takes the writer lock of `path` (on `<path>.lock`, released on drop),
/// or [`Error::Locked`] when another writer holds it.
pub(crate) fn lock_writer(path: &Path) -> Result<FileLock> {
    FileLock::writer(&lock_path(path)).map_err(|e| match e {
        durable_fs::Error::Locked { lock_path } => Error::Locked {
            path: path.to_path_buf(),
            lock: lock_path,
        },
        other => Error::durable(other),
    })
}
