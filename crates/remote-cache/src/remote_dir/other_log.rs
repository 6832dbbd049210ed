//! Another log at a directory's URL ([`LOG_OBJECT`](crate::LOG_OBJECT)): started over
//! from on open, refused by an open handle.

use super::*;

impl RemoteDir {
    /// The URL holds the log `found`, not the one applied here: start
    /// over from it, or refuse it for good.
    pub(super) fn other_log(
        &self,
        state: &mut State,
        found: Option<String>,
        on_other: OnOtherLog,
    ) -> Result<()> {
        match on_other {
            OnOtherLog::StartOver => self.start_over(state, found),
            OnOtherLog::Refuse => {
                let had = state.log_id.clone();
                let _ = self.other_log.set((had.clone(), found.clone()));
                Err(self.other_log_error(had, found))
            }
        }
    }

    pub(super) fn other_log_error(&self, had: Option<String>, found: Option<String>) -> Error {
        Error::OtherLog {
            url: self.tier.url().to_string(),
            dir: self.dir.clone(),
            had,
            found,
        }
    }

    /// Drops every file and record of the working directory (it holds
    /// another log's) and records that it holds the log `found`, with
    /// nothing applied. The record of applied commits goes first: a crash
    /// part-way leaves a directory that still names the old log, and is
    /// started over again.
    pub(super) fn start_over(&self, state: &mut State, found: Option<String>) -> Result<()> {
        state.by_blocks.clear();
        let mut view = self.view_mut();
        view.clear();
        self.count_leased(&view);
        drop(view);
        let log_path = self.dir.join(STATE_DIR).join("applied.jsonl");
        cut_log(&state.log, &log_path, 0)?;
        state.log_len = 0;
        state.seq = 0;
        self.applied.store(0, Ordering::Release);
        state.files.clear();
        state.behind = false;
        state.dirs_to_sync.clear();
        clear_work_dir(&self.dir)?;
        log_id::write_local(&self.dir.join(STATE_DIR), found.as_deref())?;
        state.log_id = found;
        Ok(())
    }

    /// The id to commit under: the log's own, created if it has none yet
    /// (a new log), and recorded here.
    pub(super) fn ensure_log(&self, state: &mut State) -> Result<String> {
        if let Some(id) = &state.log_id {
            return Ok(id.clone());
        }
        // The refresh before found none: create it (or learn the one a
        // publisher racing this one created).
        let id = log_id::ensure_log_id(&self.tier, None)?;
        log_id::write_local(&self.dir.join(STATE_DIR), Some(&id))?;
        state.log_id = Some(id.clone());
        Ok(id)
    }
}

/// Removes every file of the working directory `dir` but its state
/// directory's lock and records (and any working directory nested in
/// it), and the block lists kept there.
pub(super) fn clear_work_dir(dir: &Path) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("list directory", dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(Error::io("list directory", dir))?;
        let path = entry.path();
        if entry.file_name() == STATE_DIR {
            continue;
        }
        let kind = entry.file_type().map_err(Error::io("stat", &path))?;
        let removed = if kind.is_dir() {
            if path.join(STATE_DIR).exists() {
                continue;
            }
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &path)(e)),
        }
    }
    let blocks = dir.join(STATE_DIR).join("blocks");
    match std::fs::remove_dir_all(&blocks) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove", &blocks)(e)),
    }
    durable_fs::sync_dir(&dir.join(STATE_DIR))?;
    durable_fs::sync_dir(dir)?;
    Ok(())
}
