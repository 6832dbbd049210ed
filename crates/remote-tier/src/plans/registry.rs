//! The plan records' life on disk: registered (written whole under a
//! temporary name, locked, and renamed into place, so a `.plan` is never
//! seen half written), advanced in place, removed when their handle
//! drops; for their readers, the records of the live registrants; and,
//! for a report, every record with whether its registrant lives.
//!
//! A registrant holds its record's `flock` (exclusive) for the record's
//! life: a record whose lock is free belongs to a registrant that is
//! gone, and its next reader removes it. (A child forked by the
//! registrant shares the lock's open file, so a registrant's record lives
//! as long as such a child too: its plan is then stale, which costs hits,
//! never data.)

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::constants::{PLAN_SUFFIX, PLANS_DIR, STALE_TEMP};
use crate::plans::record::{ObjectPlan, PROGRESS_AT, PlanRecord};
use crate::{Error, Result};

/// Calls `each` with the path and open file of every live registrant's
/// record of the tier at `tier_root`, in no order; removes the records of
/// dead ones (and their stale temporary files), best effort. Whether the
/// records' directory could be listed.
pub(crate) fn live_records(tier_root: &Path, mut each: impl FnMut(&Path, &File)) -> bool {
    let dir = tier_root.join(PLANS_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return false;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let free = try_lock_shared(&file);
        if name.ends_with(durable_fs::TMP_SUFFIX) {
            let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
                SystemTime::now().duration_since(t).unwrap_or_default() > STALE_TEMP
            });
            if free && old {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        if !name.ends_with(PLAN_SUFFIX) {
            continue;
        }
        if free {
            // Its registrant is gone (it holds the lock for the record's life).
            let _ = std::fs::remove_file(&path);
            continue;
        }
        each(&path, &file);
    }
    true
}

/// Calls `each` with the file name, open file and liveness (whether its
/// registrant still holds its lock) of every plan record of the tier at
/// `tier_root`, temporary files left out, in file-name order. Removes
/// nothing (a report looks; the next reader of [`live_records`] removes
/// dead records). A tier with no `plans/` has no record.
pub(crate) fn each_record(tier_root: &Path, mut each: impl FnMut(&str, &File, bool)) -> Result<()> {
    let dir = tier_root.join(PLANS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("list plan records", &dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("list plan records", &dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(PLAN_SUFFIX) {
            names.push(name);
        }
    }
    names.sort_unstable();
    for name in names {
        // Gone since the listing: its registrant dropped it.
        let Ok(file) = File::open(dir.join(&name)) else {
            continue;
        };
        let alive = !try_lock_shared(&file);
        each(&name, &file, alive);
    }
    Ok(())
}

/// The progress a record `file` holds now (one 8-byte read).
pub(crate) fn read_progress(file: &File) -> Option<u64> {
    let mut progress = [0u8; 8];
    file.read_exact_at(&mut progress, PROGRESS_AT).ok()?;
    Some(u64::from_le_bytes(progress))
}

/// Takes a shared `flock` of `file` if no one holds it exclusively;
/// returns whether it did (the lock goes with the descriptor).
fn try_lock_shared(file: &File) -> bool {
    // SAFETY: flock on a descriptor the caller owns; it takes no pointer
    // and has no other effect on memory.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0 }
}

/// A registered plan: its record lives (and counts for eviction) until
/// this is dropped. Dropped in a process forked from the registrant, it
/// does nothing (the registrant's record stays the registrant's).
#[derive(Debug)]
pub struct PlanHandle {
    file: File,
    path: PathBuf,
    epoch_len: u64,
    pid: u32,
}

impl PlanHandle {
    /// Moves the registrant's progress to `position` (the batches it has
    /// read in its clock: the blocks of earlier positions are no longer
    /// needed this epoch). One 8-byte write in place; nothing in a
    /// process forked from the registrant (the progress is the
    /// registrant's).
    pub fn advance(&self, position: u64) -> Result<()> {
        if self.pid != std::process::id() {
            return Ok(());
        }
        let position = position.min(self.epoch_len.saturating_mul(2));
        self.file
            .write_all_at(&position.to_le_bytes(), PROGRESS_AT)
            .map_err(Error::io("advance plan record", &self.path))
    }

    /// The record's path (`<tier_dir>/plans/<token>.plan`).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PlanHandle {
    fn drop(&mut self) {
        if self.pid == std::process::id() {
            // Removed while still locked: a reader never takes a record
            // being dropped for a dead one and then meets another's file.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes the record of `objects` under `<tier_root>/plans/` and returns
/// its handle (progress 0).
pub(crate) fn register(
    tier_root: &Path,
    objects: Vec<ObjectPlan>,
    epoch_len: u64,
) -> Result<PlanHandle> {
    let dir = tier_root.join(PLANS_DIR);
    std::fs::create_dir_all(&dir).map_err(Error::io("create directory", &dir))?;
    let bytes = PlanRecord {
        progress: 0,
        epoch_len,
        objects,
    }
    .encode();
    let tmp = durable_fs::unique_temp_path(&dir, "plan");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(Error::io("create plan record", &tmp))?;
    let written = lock_exclusive(&file)
        .and_then(|()| file.write_all_at(&bytes, 0))
        .map_err(Error::io("write plan record", &tmp));
    let path = dir.join(format!("{}{PLAN_SUFFIX}", durable_fs::host_pid_token()));
    let placed = written.and_then(|()| {
        std::fs::rename(&tmp, &path).map_err(Error::io("rename plan record into place", &path))
    });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(PlanHandle {
        file,
        path,
        epoch_len,
        pid: std::process::id(),
    })
}

/// Takes an exclusive `flock` of `file`, waiting for a reader that holds
/// a shared one for a moment.
fn lock_exclusive(file: &File) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor the caller owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
