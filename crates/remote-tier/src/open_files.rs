//! The local copies this process has open: at most [`OPEN_FILES`]
//! descriptors, however many objects are open through the tier. A handle
//! opens its copy when it reads or writes it, and the least recently used
//! copy is closed when the set is full; a copy is opened again by its
//! path when next needed (a pinned copy stays where it is). A copy whose
//! path no longer names it (replaced by a copy of another block list) is
//! never closed while its handle lives: it could not be opened again.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use durable_fs::PerProcess;

use crate::constants::OPEN_FILES;

/// The open copies, by handle.
#[derive(Default)]
struct OpenSet {
    tick: u64,
    open: HashMap<u64, Entry>,
}

struct Entry {
    file: Arc<File>,
    used: u64,
    path: PathBuf,
    ino: u64,
}

static OPEN: PerProcess<Mutex<OpenSet>> = PerProcess::new();

/// This process's open copies. A forked child closes its parent's (if no
/// thread of the parent held them at the fork) and starts its own.
fn open_set() -> MutexGuard<'static, OpenSet> {
    OPEN.get_leaving(|parent| {
        if let Ok(mut parent) = parent.try_lock() {
            parent.open.clear();
        }
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A number no other handle of this process uses.
pub(crate) fn new_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The copy of handle `id`, if it is open now.
pub(crate) fn get(id: u64) -> Option<Arc<File>> {
    let mut set = open_set();
    set.tick += 1;
    let tick = set.tick;
    let entry = set.open.get_mut(&id)?;
    entry.used = tick;
    Some(Arc::clone(&entry.file))
}

/// Keeps `file` (the copy at `path`, inode `ino`) open for handle `id`,
/// closing the least recently used copies past [`OPEN_FILES`]; returns
/// the copy kept for `id` (another thread's, if it opened it first).
pub(crate) fn keep(id: u64, file: File, path: &Path, ino: u64) -> Arc<File> {
    let mut set = open_set();
    set.tick += 1;
    let tick = set.tick;
    if let Some(entry) = set.open.get_mut(&id) {
        entry.used = tick;
        return Arc::clone(&entry.file);
    }
    let file = Arc::new(file);
    set.open.insert(
        id,
        Entry {
            file: Arc::clone(&file),
            used: tick,
            path: path.to_path_buf(),
            ino,
        },
    );
    if set.open.len() > OPEN_FILES {
        let mut by_use: Vec<(u64, u64)> = set
            .open
            .iter()
            .filter(|(k, _)| **k != id)
            .map(|(k, e)| (e.used, *k))
            .collect();
        by_use.sort_unstable();
        let mut excess = set.open.len() - OPEN_FILES;
        for (_, k) in by_use {
            if excess == 0 {
                break;
            }
            let replaced = set
                .open
                .get(&k)
                .is_some_and(|e| !std::fs::metadata(&e.path).is_ok_and(|m| m.ino() == e.ino));
            if !replaced {
                set.open.remove(&k);
                excess -= 1;
            }
        }
    }
    file
}

/// Closes the copy of handle `id` (its last handle is gone).
pub(crate) fn forget(id: u64) {
    open_set().open.remove(&id);
}
