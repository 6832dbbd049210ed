//! Entry points of the fuzz targets (`fuzz/`), public so that ordinary
//! tests run the same code over their seeds: a commit record (or a
//! checkpoint) read and applied as a reader reads and applies one.
//!
//! The commit log lives in memory (`memory:///`), holding the objects of
//! [`payloads`]; each input is published as commit 1 and read (every check
//! a fetched commit gets), or read and applied to a fresh working
//! directory, or published as checkpoint 1 and applied to a fresh working
//! directory (which starts from the newest checkpoint). Must return (an
//! error or a result) — never panic, never write outside the working
//! directory.

use std::path::{Path, PathBuf};

use remote_tier::{RemoteTier, TierConfig};

use crate::commit::{OBJECTS, checkpoint_name, commit_name};
use crate::{Next, RemoteDir, Result};

/// The bytes of the objects every input may point at (`objects/<blake3>`):
/// empty, small, a few blocks, and larger than the tier fetches whole.
pub fn payloads() -> Vec<Vec<u8>> {
    [0usize, 11, 5000, 70_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (j * 31 + i * 7) as u8).collect())
        .collect()
}

/// Files read by blocks in the fuzzed working directories (linked into
/// the tier when larger than it fetches whole).
pub fn by_blocks(path: &str, _size: u64) -> bool {
    path.ends_with(".bin")
}

fn private(path: &str) -> bool {
    path.ends_with(".private")
}

fn files() -> crate::StoreFiles {
    crate::StoreFiles {
        private,
        by_blocks,
        ..crate::StoreFiles::PLAIN
    }
}

/// The local tier of [`CommitLog`]: 4 KiB blocks, objects up to 16 KiB
/// fetched whole.
pub fn tier_config(dir: &Path) -> TierConfig {
    let mut config = TierConfig::new(dir, 1 << 30);
    config.block_size = 4 << 10;
    config.whole_file_max = 16 << 10;
    config.part_size = 1 << 20;
    config.prefetch_blocks = 0;
    config.parallelism = 1;
    config
}

/// A commit log in memory holding [`payloads`], and the scratch directory
/// of the working directories that read it.
#[derive(Debug)]
pub struct CommitLog {
    tier: RemoteTier,
    scratch: PathBuf,
}

impl CommitLog {
    /// A commit log whose local tier and working directories live under
    /// `scratch`.
    pub fn new(scratch: &Path) -> Result<CommitLog> {
        let tier = RemoteTier::open("memory:///fuzz", tier_config(&scratch.join("tier")))?;
        for p in payloads() {
            let name = format!("{OBJECTS}/{}", blake3::hash(&p).to_hex());
            tier.put_bytes(&name, p)?;
        }
        Ok(CommitLog {
            tier,
            scratch: scratch.to_path_buf(),
        })
    }

    /// Publishes `bytes` as commit 1 and reads it back as a reader does.
    pub fn read(&self, bytes: &[u8]) -> Result<Option<Next>> {
        self.tier.put_bytes(&commit_name(1), bytes.to_vec())?;
        let dir = self.scratch.join("read");
        let remote = RemoteDir::open_unapplied(self.tier.clone(), &dir, files())?;
        remote.fetch_next()
    }

    /// Publishes `bytes` as commit 1, then reads and applies it to a fresh
    /// working directory; returns the commit applied there (0: none).
    pub fn apply(&self, bytes: &[u8]) -> Result<u64> {
        self.tier.put_bytes(&commit_name(1), bytes.to_vec())?;
        self.apply_fresh()
    }

    /// Publishes `bytes` as checkpoint 1 (over a commit 1 that is not
    /// there), then applies the log to a fresh working directory, which
    /// starts from it; returns the commit applied there (0: none).
    pub fn apply_checkpoint(&self, bytes: &[u8]) -> Result<u64> {
        self.tier.delete(&commit_name(1))?;
        self.tier.put_bytes(&checkpoint_name(1), bytes.to_vec())?;
        let applied = self.apply_fresh();
        self.tier.delete(&checkpoint_name(1))?;
        applied
    }

    /// The working directory `apply` makes afresh for each input.
    pub fn apply_dir(&self) -> PathBuf {
        self.scratch.join("apply")
    }

    fn apply_fresh(&self) -> Result<u64> {
        let dir = self.apply_dir();
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(crate::Error::io("remove", &dir))?;
        }
        let remote = RemoteDir::open_unapplied(self.tier.clone(), &dir, files())?;
        let next = remote.fetch_next()?;
        Ok(remote.refresh_from(next)?.seq)
    }
}
