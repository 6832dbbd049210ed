//! The advisory writer lock (`flock` through `fs2`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use fs2::FileExt;

use crate::{Error, Result};

/// An advisory `flock` on a lock file, held until dropped.
///
/// `flock` locks belong to an open file description, so each `FileLock`
/// opens the file anew: two takers in one process exclude each other just
/// as two processes do. Dropping unlocks explicitly: a child forked
/// meanwhile by another thread shares the descriptor until it execs, and a
/// mere close would leave the lock held through that copy.
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// The exclusive lock of `path`, or [`Error::Locked`] at once when
    /// someone else holds it: the one-writer lock of a cache.
    pub fn writer(path: &Path) -> Result<FileLock> {
        FileLock::try_exclusive(path)?.ok_or_else(|| Error::Locked {
            lock_path: path.to_path_buf(),
        })
    }

    /// The exclusive lock of `path` if it is free right now, else `None`.
    pub fn try_exclusive(path: &Path) -> Result<Option<FileLock>> {
        let file = open(path)?;
        match FileExt::try_lock_exclusive(&file) {
            Ok(()) => Ok(Some(FileLock {
                file,
                path: path.to_path_buf(),
            })),
            Err(e) if contended(&e) => Ok(None),
            Err(e) => Err(Error::io("lock", path)(e)),
        }
    }

    /// Blocks until the exclusive lock of `path` is held.
    pub fn exclusive(path: &Path) -> Result<FileLock> {
        let file = open(path)?;
        FileExt::lock_exclusive(&file).map_err(Error::io("lock", path))?;
        Ok(FileLock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Blocks until a shared lock of `path` is held.
    pub fn shared(path: &Path) -> Result<FileLock> {
        let file = open(path)?;
        FileExt::lock_shared(&file).map_err(Error::io("lock", path))?;
        Ok(FileLock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = FileExt::unlock(&self.file);
    }
}

/// Opens (creating) the lock file. A read-only lock file (a copied or
/// read-only cache) is opened read-only: `flock` works on such a
/// descriptor too.
fn open(path: &Path) -> Result<File> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            File::open(path).map_err(Error::io("open lock file", path))
        }
        Err(e) => Err(Error::io("open lock file", path)(e)),
    }
}

/// Whether a failed `try_lock` means "held by someone else" rather than a
/// real error (say `ENOLCK` on a file system without locks).
fn contended(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
        || e.raw_os_error() == fs2::lock_contended_error().raw_os_error()
}
