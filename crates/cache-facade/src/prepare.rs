//! The one staleness path every backend opens through: the cache's
//! fingerprint (config identity, source stamps, store version) is checked
//! under a shared lock; a cache that must be built, resumed or rebuilt is
//! handled only by the holder of the exclusive lock.
//!
//! The lock is `root/<name>/<key>.lock`, beside the cache directory (never
//! inside it, so clearing the directory cannot remove it). Openers hold it
//! shared while they check and open a cache, so a rebuild — which holds it
//! exclusive from its re-check to its last write — is never seen half done:
//! an opener either opens the committed cache before the rebuild starts
//! (its maps keep the old files alive) or waits and opens the new one.

use std::path::{Path, PathBuf};

use durable_fs::FileLock;
use fingerprint::{
    COMPLETE_FILE, FINGERPRINT_FILE, Fingerprint, Stale, compute_fingerprint, stamp_sources,
};

use crate::{CacheConfig, FacadeError, OnStale, Result};
use crate::{Detected, detect};

/// What a backend tells [`prepare`] about its store.
pub(crate) struct Spec {
    /// The kind `detect` must find in the directory (if any).
    pub kind: Option<Detected>,
    /// The store's format version, recorded in the fingerprint.
    pub version: u32,
    /// Whether the cache can be (re)built by this opener.
    pub can_build: bool,
    /// Whether a fingerprinted cache is finished (memmap-array: `_COMPLETE`).
    pub complete: fn(&Path) -> bool,
    /// The store's own writer lock files inside the directory: a stale
    /// cache is not cleared while another writer holds one.
    pub store_locks: fn(&Path) -> Vec<PathBuf>,
}

/// The state of the directory once [`prepare`] returns.
#[derive(Debug)]
pub(crate) enum DirState {
    /// Fingerprint current, cache finished: open it.
    Fresh,
    /// No cache: build it.
    Empty,
    /// Content without a current, finished fingerprint (an interrupted
    /// build or a crash before the fingerprint was written): resume or
    /// build it.
    Incomplete,
    /// A stale cache was cleared (the reason): build it.
    Cleared(Stale),
}

/// A cache directory ready to open, with the lock that keeps it so.
pub(crate) struct Prepared {
    pub dir: PathBuf,
    pub fingerprint: Fingerprint,
    pub state: DirState,
    /// Shared when `state` is `Fresh` and nothing needs writing; exclusive
    /// otherwise. Dropped once the backend is open (and, when it built the
    /// cache, after the fingerprint is written).
    pub _lock: DirLock,
}

/// The lock on a cache's lock file (shared or exclusive, blocking);
/// released on drop.
pub(crate) struct DirLock {
    _lock: FileLock,
}

impl DirLock {
    fn take(dir: &Path, exclusive: bool) -> Result<DirLock> {
        let path = lock_file(dir);
        let lock = if exclusive {
            FileLock::exclusive(&path)
        } else {
            FileLock::shared(&path)
        };
        Ok(DirLock {
            _lock: lock.map_err(FacadeError::durable)?,
        })
    }
}

/// `root/<name>/<key>.lock` for the cache directory `root/<name>/<key>`.
pub(crate) fn lock_file(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

/// Makes `config`'s cache directory ready for the backend `spec` describes;
/// see the module docs for the protocol.
pub(crate) fn prepare(config: &CacheConfig, spec: &Spec) -> Result<Prepared> {
    if !config.root.is_dir() {
        if !config.create_root {
            return Err(FacadeError::MissingRoot(config.root.clone()));
        }
        std::fs::create_dir_all(&config.root)
            .map_err(FacadeError::io("create directory", &config.root))?;
    }
    let dir = config.cache_dir()?;
    let stamps = match &config.sources {
        None => Vec::new(),
        Some(s) => stamp_sources(&s.root, &s.paths, s.mode())?,
    };
    let current = compute_fingerprint(&config.identity()?, stamps, spec.version)?;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent).map_err(FacadeError::io("create directory", parent))?;
    }

    let shared = DirLock::take(&dir, false)?;
    let seen = examine(&dir, spec, &current)?;
    match seen {
        DirState::Fresh => return Ok(ready(dir, current, seen, shared)),
        DirState::Cleared(stale) => refuse_or_allow(config, spec, &dir, &stale)?,
        DirState::Empty | DirState::Incomplete => {
            not_buildable(config, spec, &dir, "is not built")?
        }
    }
    drop(shared);

    let exclusive = DirLock::take(&dir, true)?;
    // Another process may have built or rebuilt it while we waited.
    let state = match examine(&dir, spec, &current)? {
        DirState::Cleared(stale) => {
            refuse_or_allow(config, spec, &dir, &stale)?;
            eprintln!("cachex: rebuilding {}: {stale}", dir.display());
            clear(&dir, spec)?;
            DirState::Cleared(stale)
        }
        other => other,
    };
    std::fs::create_dir_all(&dir).map_err(FacadeError::io("create directory", &dir))?;
    Ok(ready(dir, current, state, exclusive))
}

fn ready(dir: PathBuf, fingerprint: Fingerprint, state: DirState, lock: DirLock) -> Prepared {
    Prepared {
        dir,
        fingerprint,
        state,
        _lock: lock,
    }
}

fn refuse_or_allow(config: &CacheConfig, spec: &Spec, dir: &Path, stale: &Stale) -> Result<()> {
    match config.on_stale {
        OnStale::Error => Err(FacadeError::Stale {
            dir: dir.to_path_buf(),
            stale: stale.clone(),
        }),
        OnStale::Rebuild => not_buildable(config, spec, dir, &format!("is stale ({stale})")),
    }
}

fn not_buildable(config: &CacheConfig, spec: &Spec, dir: &Path, what: &str) -> Result<()> {
    if spec.can_build {
        return Ok(());
    }
    Err(FacadeError::NotBuilt {
        dir: dir.to_path_buf(),
        backend: config.backend.name(),
        what: what.to_owned(),
    })
}

/// What is in `dir`, judged against `current`. A stale cache is reported as
/// `Cleared` (it is cleared only by the caller, under the exclusive lock).
fn examine(dir: &Path, spec: &Spec, current: &Fingerprint) -> Result<DirState> {
    let mut entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(DirState::Empty),
        Err(e) => return Err(FacadeError::io("list directory", dir)(e)),
    };
    if entries.next().is_none() {
        return Ok(DirState::Empty);
    }
    if let Some(expected) = spec.kind
        && let Some(found) = detect(dir).filter(|&found| found != expected)
    {
        return Err(FacadeError::KindMismatch {
            dir: dir.to_path_buf(),
            found: found.name().to_owned(),
            expected: expected.name().to_owned(),
        });
    }
    let stored = match Fingerprint::read(&dir.join(FINGERPRINT_FILE)) {
        Ok(stored) => stored,
        Err(Stale::Missing { .. }) => return Ok(DirState::Incomplete),
        Err(unreadable) => return Ok(DirState::Cleared(unreadable)),
    };
    Ok(match fingerprint::validate(&stored, current) {
        Err(stale) => DirState::Cleared(stale),
        Ok(()) if (spec.complete)(dir) => DirState::Fresh,
        Ok(()) => DirState::Incomplete,
    })
}

/// Empties `dir` (the caller holds the exclusive lock): the fingerprint
/// and `_COMPLETE` go first and durably, so a crash part-way leaves a
/// directory no opener trusts. A working directory's commit-log record
/// (`.cachex-remote/`) stays.
pub(crate) fn clear(dir: &Path, spec: &Spec) -> Result<()> {
    let mut held = Vec::new();
    for lock in (spec.store_locks)(dir) {
        if !lock.exists() {
            continue;
        }
        match FileLock::try_exclusive(&lock).map_err(FacadeError::durable)? {
            Some(held_lock) => held.push(held_lock),
            None => {
                return Err(FacadeError::InUse {
                    dir: dir.to_path_buf(),
                    lock,
                });
            }
        }
    }
    for marker in [FINGERPRINT_FILE, COMPLETE_FILE] {
        let path = dir.join(marker);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(FacadeError::io("remove", &path)(e)),
        }
    }
    durable_fs::sync_dir(dir).map_err(FacadeError::durable)?;
    for entry in std::fs::read_dir(dir).map_err(FacadeError::io("list directory", dir))? {
        let entry = entry.map_err(FacadeError::io("list directory", dir))?;
        if entry.file_name() == remote_cache::STATE_DIR {
            // A working directory's record of its commit log (its lock,
            // the commits applied, the log's identity): the log's, not
            // the cache's, and held open by the handle clearing it.
            continue;
        }
        let path = entry.path();
        let is_dir = entry
            .file_type()
            .map_err(FacadeError::io("stat", &path))?
            .is_dir();
        let removed = if is_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(FacadeError::io("remove", &path))?;
    }
    durable_fs::sync_dir(dir).map_err(FacadeError::durable)?;
    drop(held);
    Ok(())
}

/// Writes the fingerprint that commits a freshly built (or adopted) cache.
pub(crate) fn commit(prepared: &Prepared) -> Result<()> {
    Ok(prepared
        .fingerprint
        .write(&prepared.dir.join(FINGERPRINT_FILE))?)
}

/// Always finished once fingerprinted.
pub(crate) fn fingerprinted(_: &Path) -> bool {
    true
}

/// No store lock of its own.
pub(crate) fn no_locks(_: &Path) -> Vec<PathBuf> {
    Vec::new()
}
