//! The advisory writer lock (`flock` through `fs2`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use fs2::FileExt;

use crate::{Error, PerProcess, Result};

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
    /// This process's turn at the lock, for the waiting calls: let go
    /// after the `flock` (fields drop after [`Drop::drop`] ran).
    _turn: Option<Turn>,
    /// The process that took it. A child forked while it was held shares
    /// the open file description, so its copy only closes the descriptor:
    /// unlocking (or removing the file) would let go of the parent's lock.
    pid: u32,
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
                _turn: None,
                pid: std::process::id(),
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
                _turn: None,
                pid: std::process::id(),
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
            _turn: None,
            pid: std::process::id(),
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
            _turn: None,
            pid: std::process::id(),
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
    ///
    /// Threads of one process that wait for the same lock queue in the
    /// process and the next one tries the moment the holder lets go;
    /// only a holder in another process is polled for (pauses of 0.1 to
    /// 5 ms).
    pub fn exclusive_within(path: &Path, wait: Duration) -> Result<FileLock> {
        poll_in_turn(path, wait, FileLock::try_exclusive)
    }

    /// [`FileLock::exclusive_live`], waiting at most `wait` (see
    /// [`FileLock::exclusive_within`]).
    pub fn exclusive_live_within(path: &Path, wait: Duration) -> Result<FileLock> {
        poll_in_turn(path, wait, FileLock::try_exclusive_live)
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

/// [`poll`] for an exclusive lock, once this process's turn at `path`
/// came: threads of the process wait for each other on a condition
/// variable, woken when the holder lets go, not on pauses.
fn poll_in_turn(
    path: &Path,
    wait: Duration,
    try_take: impl Fn(&Path) -> Result<Option<FileLock>>,
) -> Result<FileLock> {
    let start = Instant::now();
    let timeout = || Error::LockTimeout {
        lock_path: path.to_path_buf(),
        waited: start.elapsed(),
    };
    let turn = Turn::take(path, start + wait).ok_or_else(timeout)?;
    // The wait reported is the whole call's, the turn's part included.
    let mut lock =
        poll(path, wait.saturating_sub(start.elapsed()), try_take).map_err(|e| match e {
            Error::LockTimeout { .. } => timeout(),
            e => e,
        })?;
    lock._turn = Some(turn);
    Ok(lock)
}

/// One process's queue for one exclusive lock path.
#[derive(Debug, Default)]
struct Gate {
    taken: Mutex<bool>,
    freed: Condvar,
}

/// The gates of this process by lock path. A forked child starts with
/// none (its parent's holders are not in it), and never touches its copy
/// of the parent's, which another thread of the parent may have held
/// locked at the fork ([`PerProcess`]).
static GATES: PerProcess<Mutex<Gates>> = PerProcess::new();

/// One process's gates by lock path.
type Gates = HashMap<PathBuf, Arc<Gate>>;

/// Runs `f` on this process's gates (held only for a lookup, an insert
/// or a removal).
fn with_gates<R>(f: impl FnOnce(&mut Gates) -> R) -> R {
    f(&mut GATES.get().lock().unwrap_or_else(|p| p.into_inner()))
}

/// This process's turn at one exclusive lock path, held while a thread
/// takes and holds the `flock`.
#[derive(Debug)]
struct Turn {
    path: PathBuf,
    gate: Arc<Gate>,
    /// The process that took it: a child forked while it was held drops
    /// its copy without touching the gate, which belongs to the parent.
    pid: u32,
}

impl Turn {
    /// Waits (until `deadline`) for the turn at `path`.
    fn take(path: &Path, deadline: Instant) -> Option<Turn> {
        let gate = with_gates(|gates| Arc::clone(gates.entry(path.to_path_buf()).or_default()));
        let turn = Turn {
            path: path.to_path_buf(),
            gate,
            pid: std::process::id(),
        };
        let mut taken = turn.gate.taken.lock().unwrap_or_else(|p| p.into_inner());
        while *taken {
            let now = Instant::now();
            if now >= deadline {
                drop(taken);
                turn.forget();
                return None;
            }
            taken = turn
                .gate
                .freed
                .wait_timeout(taken, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *taken = true;
        drop(taken);
        Some(turn)
    }

    /// Drops this process's gate of the path once nobody else uses it.
    fn forget(&self) {
        with_gates(|gates| {
            if gates
                .get(&self.path)
                .is_some_and(|g| Arc::ptr_eq(g, &self.gate) && Arc::strong_count(g) == 2)
            {
                gates.remove(&self.path);
            }
        });
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // The parent's gate, perhaps locked by a thread the child does
            // not have: leave it (the parent's own copy lets go).
            return;
        }
        *self.gate.taken.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.gate.freed.notify_one();
        self.forget();
    }
}

/// Takes a lock with `try_take` until it succeeds or `wait` has passed;
/// the pauses between tries grow from 0.1 ms to 5 ms.
fn poll(
    path: &Path,
    wait: Duration,
    try_take: impl Fn(&Path) -> Result<Option<FileLock>>,
) -> Result<FileLock> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(100);
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
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_of_one_process_take_a_lock_in_turn_and_time_out_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("turns.lock");
        let counter = Arc::new(Mutex::new((0u32, 0u32)));
        std::thread::scope(|s| {
            for _ in 0..8 {
                let (path, counter) = (&path, Arc::clone(&counter));
                s.spawn(move || {
                    for _ in 0..50 {
                        let _held = FileLock::exclusive_within(path, Duration::from_secs(30))
                            .expect("a turn within the bound");
                        let mut c = counter.lock().unwrap();
                        c.0 += 1;
                        c.1 = c.1.max(c.0);
                        drop(c);
                        std::thread::yield_now();
                        counter.lock().unwrap().0 -= 1;
                    }
                });
            }
        });
        assert_eq!(counter.lock().unwrap().1, 1, "never two holders at once");
        // The gates of released paths are gone.
        let left = with_gates(|g| g.len());
        assert_eq!(left, 0);
        // A waiter behind a holder in this process gives up at its bound.
        let held = FileLock::exclusive_within(&path, Duration::from_secs(1)).unwrap();
        let start = Instant::now();
        let err = FileLock::exclusive_within(&path, Duration::from_millis(50)).unwrap_err();
        assert!(matches!(err, Error::LockTimeout { .. }), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        drop(held);
        assert!(FileLock::exclusive_within(&path, Duration::from_millis(50)).is_ok());
    }
}
