//! [`LogState`]: the files a commit log holds after one commit — its
//! newest checkpoint and the commits after it folded together, from the
//! records alone (no file's bytes fetched): what gc, `du` and `push`
//! reason about.

use std::collections::{BTreeMap, HashSet};

use remote_tier::RemoteTier;

use crate::commit::{Checkpoint, Commit, Piece, commit_name, newest_checkpoint_after, read_commit};
use crate::{Error, Result};

/// Every file of a commit log after commit `seq`, as the pieces that make
/// it, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    /// The last commit folded in (0: none).
    pub seq: u64,
    /// Each file's pieces: the first at offset 0, each next one where the
    /// previous ended.
    pub files: BTreeMap<String, Vec<Piece>>,
}

impl LogState {
    /// The state a checkpoint stands for.
    pub fn from_checkpoint(cp: &Checkpoint) -> LogState {
        let mut files: BTreeMap<String, Vec<Piece>> = BTreeMap::new();
        for p in &cp.pieces {
            let mut p = p.clone();
            p.replace = false;
            files.entry(p.path.clone()).or_default().push(p);
        }
        LogState { seq: cp.seq, files }
    }

    /// Reads the state after the last commit at `tier`'s URL: the newest
    /// checkpoint, then every commit after it, one GET each.
    pub fn read(tier: &RemoteTier) -> Result<LogState> {
        let mut state = match newest_checkpoint_after(tier, 0)? {
            Some(cp) => LogState::from_checkpoint(&cp),
            None => LogState::default(),
        };
        state.read_after(tier, &mut |_| {})?;
        Ok(state)
    }

    /// Folds in every commit after this state's, reading them from
    /// `tier` until the first number not published; `seen` gets each.
    pub fn read_after(&mut self, tier: &RemoteTier, seen: &mut dyn FnMut(&Commit)) -> Result<()> {
        while let Some(next) = self.seq.checked_add(1) {
            let Some(commit) = read_commit(tier, next)? else {
                break;
            };
            self.apply(tier.url(), &commit)?;
            seen(&commit);
        }
        Ok(())
    }

    /// Folds in `commit` (the one after this state's): its pieces, then
    /// its removals. A piece that neither starts a file nor continues it
    /// where it ends is [`Error::Corrupt`], naming the commit.
    pub fn apply(&mut self, url: &str, commit: &Commit) -> Result<()> {
        for p in &commit.pieces {
            let pieces = self.files.entry(p.path.clone()).or_default();
            if p.replace || p.offset == 0 {
                pieces.clear();
            }
            let end = pieces.last().map_or(0, |q| q.offset + q.size);
            if p.offset != end {
                return Err(Error::Corrupt {
                    url: url.to_string(),
                    name: commit_name(commit.seq),
                    problem: format!(
                        "{}: appends at byte {}, where the file ends at {end}",
                        p.path, p.offset
                    ),
                });
            }
            let mut p = p.clone();
            p.replace = false;
            pieces.push(p);
        }
        for path in &commit.removed {
            self.files.remove(path);
        }
        self.seq = commit.seq;
        Ok(())
    }

    /// The size of every file together.
    pub fn bytes(&self) -> u64 {
        self.files
            .values()
            .map(|ps| ps.last().map_or(0, |p| p.offset + p.size))
            .sum()
    }

    /// The objects its files are made of.
    pub fn objects(&self) -> HashSet<String> {
        self.files.values().flatten().map(Piece::object).collect()
    }
}
