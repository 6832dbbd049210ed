//! The advisory writer lock (`flock` through `fs2`).

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Remove the lock file on drop, before unlocking.
    remove: bool,
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
                remove: false,
            })),
            Err(e) if contended(&e) => Ok(None),
            Err(e) => Err(Error::io("lock", path)(e)),
        }
    }

    /// A shared lock of `path` if no one holds it exclusively right now,
    /// else `None`: many holders of shared locks never wait on each other.
    pub fn try_shared(path: &Path) -> Result<Option<FileLock>> {
        let file = open(path)?;
        match FileExt::try_lock_shared(&file) {
            Ok(()) => Ok(Some(FileLock {
                file,
                path: path.to_path_buf(),
                remove: false,
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
            remove: false,
        })
    }

    /// Blocks until a shared lock of `path` is held.
    pub fn shared(path: &Path) -> Result<FileLock> {
        let file = open(path)?;
        FileExt::lock_shared(&file).map_err(Error::io("lock", path))?;
        Ok(FileLock {
            file,
            path: path.to_path_buf(),
            remove: false,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the lock file when this lock is dropped, while it is still
    /// held: for lock files that guard something short-lived (one fetch,
    /// one local copy), so that they go with it. Everyone who may take
    /// such a lock must take it through the `*_live` calls, which let go
    /// of a lock file removed while they waited and take the new one.
    pub fn remove_on_drop(mut self) -> FileLock {
        self.remove = true;
        self
    }

    /// [`FileLock::exclusive`] of a lock file that its holders may remove
    /// ([`FileLock::remove_on_drop`]): waits until the lock is held on the
    /// file `path` names now.
    pub fn exclusive_live(path: &Path) -> Result<FileLock> {
        loop {
            let lock = FileLock::exclusive(path)?;
            if lock.is_live()? {
                return Ok(lock);
            }
        }
    }

    /// [`FileLock::shared`] of a lock file that its holders may remove
    /// (see [`FileLock::exclusive_live`]).
    pub fn shared_live(path: &Path) -> Result<FileLock> {
        loop {
            let lock = FileLock::shared(path)?;
            if lock.is_live()? {
                return Ok(lock);
            }
        }
    }

    /// [`FileLock::exclusive`], waiting at most `wait`: past it,
    /// [`Error::LockTimeout`] (a holder that stopped never blocks a waiter
    /// for good).
    pub fn exclusive_within(path: &Path, wait: Duration) -> Result<FileLock> {
        poll(path, wait, FileLock::try_exclusive)
    }

    /// [`FileLock::exclusive_live`], waiting at most `wait` (see
    /// [`FileLock::exclusive_within`]).
    pub fn exclusive_live_within(path: &Path, wait: Duration) -> Result<FileLock> {
        poll(path, wait, FileLock::try_exclusive_live)
    }

    /// [`FileLock::shared_live`], waiting at most `wait` (see
    /// [`FileLock::exclusive_within`]).
    pub fn shared_live_within(path: &Path, wait: Duration) -> Result<FileLock> {
        poll(path, wait, |p| match FileLock::try_shared(p)? {
            Some(lock) if lock.is_live()? => Ok(Some(lock)),
            _ => Ok(None),
        })
    }

    /// [`FileLock::try_exclusive`] of a lock file that its holders may
    /// remove (see [`FileLock::exclusive_live`]): `None` also when the
    /// file was removed meanwhile.
    pub fn try_exclusive_live(path: &Path) -> Result<Option<FileLock>> {
        match FileLock::try_exclusive(path)? {
            Some(lock) if lock.is_live()? => Ok(Some(lock)),
            _ => Ok(None),
        }
    }

    /// Whether the locked file is still the one `path` names (not removed
    /// by a holder while this waited for it).
    fn is_live(&self) -> Result<bool> {
        use std::os::unix::fs::MetadataExt;
        let held = self
            .file
            .metadata()
            .map_err(Error::io("stat lock file", &self.path))?;
        match std::fs::metadata(&self.path) {
            Ok(now) => Ok(now.ino() == held.ino() && now.dev() == held.dev()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io("stat lock file", &self.path)(e)),
        }
    }
}

/// Takes a lock with `try_take` until it succeeds or `wait` has passed;
/// the pauses between tries grow from 1 ms to 20 ms.
fn poll(
    path: &Path,
    wait: Duration,
    try_take: impl Fn(&Path) -> Result<Option<FileLock>>,
) -> Result<FileLock> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(lock) = try_take(path)? {
            return Ok(lock);
        }
        let waited = start.elapsed();
        if waited >= wait {
            return Err(Error::LockTimeout {
                lock_path: path.to_path_buf(),
                waited,
            });
        }
        std::thread::sleep(pause.min(wait - waited));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if self.remove {
            // Removed while held: whoever waits on it wakes to a removed
            // file and takes the new one (`*_live`).
            let _ = std::fs::remove_file(&self.path);
        }
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
