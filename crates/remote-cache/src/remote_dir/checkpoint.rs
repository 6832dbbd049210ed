//! Checkpoints: the whole file state a reader moves to when it is behind
//! one, or when gc removed an object of its next commit.

use super::*;

impl RemoteDir {
    /// The checkpoint `cp` as a commit applied to this directory: every
    /// file of it written whole (the first piece of each replacing what
    /// the file held), every file known here and not in it removed.
    pub(super) fn checkpoint_commit(&self, state: &State, cp: Checkpoint) -> Commit {
        let paths: HashSet<&str> = cp.pieces.iter().map(|p| p.path.as_str()).collect();
        let mut removed: Vec<String> = state
            .files
            .keys()
            .filter(|p| !paths.contains(p.as_str()))
            .cloned()
            .collect();
        removed.sort();
        let mut seen = HashSet::new();
        let pieces = cp
            .pieces
            .into_iter()
            .map(|mut p| {
                p.replace = seen.insert(p.path.clone());
                p
            })
            .collect();
        Commit {
            version: COMMIT_VERSION,
            seq: cp.seq,
            writer: cp.writer,
            pieces,
            removed,
            // A checkpoint names no log: it is read as one of the log the
            // directory holds.
            log: state.log_id.clone().unwrap_or_default(),
        }
    }
}
