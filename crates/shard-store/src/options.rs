//! Options of [`ShardStore::open`](crate::ShardStore::open), with loadit's defaults.

use std::str::FromStr;

use crate::error::Error;
pub use crate::format::Compression;

/// How long a shard is: a fixed item count, or a byte target from which the
/// count is estimated by pickling the first
/// [`SIZE_ESTIMATE_ITEMS`](crate::format::SIZE_ESTIMATE_ITEMS) items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardLength {
    /// Exactly this many items per full shard.
    Items(u64),
    /// About this many bytes per shard file (loadit's `"64mb"`).
    Bytes(u64),
}

impl Default for ShardLength {
    fn default() -> ShardLength {
        ShardLength::Bytes(64 << 20)
    }
}

impl FromStr for ShardLength {
    type Err = Error;
    /// Parses `"4096"` (items) or `"64mb"` (MiB, as loadit).
    fn from_str(s: &str) -> Result<ShardLength, Error> {
        let bad = || Error::InvalidOption {
            option: "max_shard_length",
            reason: format!("{s:?} is neither an item count nor <N>mb"),
        };
        let lower = s.trim().to_ascii_lowercase();
        if let Some(mb) = lower.strip_suffix("mb") {
            let mb: u64 = mb.parse().map_err(|_| bad())?;
            mb.checked_mul(1 << 20)
                .filter(|&b| b > 0)
                .map(ShardLength::Bytes)
                .ok_or_else(bad)
        } else {
            let n: u64 = lower.parse().map_err(|_| bad())?;
            (n > 0).then_some(ShardLength::Items(n)).ok_or_else(bad)
        }
    }
}

/// Which shards background workers load ahead of an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preload {
    /// Nothing.
    None,
    /// The next `n` shards after the one just accessed.
    NextShards(usize),
}

/// Options of a store; `Options::default()` is loadit's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Items per shard, or a byte target (default `"64mb"`). Ignored (the
    /// stored value is adopted) when the root exists and this is a byte
    /// target; an item count that differs from the stored one is an error.
    pub max_shard_length: ShardLength,
    /// Decoded shards kept in memory (default 128).
    pub max_cache_size: usize,
    /// Iterator replays and background workers (default 1: no background
    /// work). With `n > 1`, `n - 1` threads preload shards.
    pub max_workers: usize,
    /// Disk budget in bytes for the shard files (default `None`: unlimited).
    /// Least recently used shards are deleted to stay under it, and
    /// regenerated from the source on demand.
    pub memory_limit: Option<u64>,
    /// Shard compression (default none). Must match a stored root.
    pub compression: Compression,
    /// Preload policy (default: the next `max_workers / 2` shards, at least one).
    pub preload: Option<Preload>,
    /// Fill the whole cache in the background once opened (needs `max_workers > 1`).
    pub preload_all_async: bool,
    /// A known length, used before the true length is discovered.
    pub length: Option<u64>,
    /// `info` to store when the root is new (`None` keeps what is stored).
    pub info: Option<serde_json::Value>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            max_shard_length: ShardLength::default(),
            max_cache_size: 128,
            max_workers: 1,
            memory_limit: None,
            compression: Compression::None,
            preload: None,
            preload_all_async: false,
            length: None,
            info: None,
        }
    }
}

impl Options {
    /// Sets `max_shard_length` to a fixed item count.
    pub fn shard_items(mut self, n: u64) -> Options {
        self.max_shard_length = ShardLength::Items(n);
        self
    }

    /// The effective preload policy.
    pub fn preload_policy(&self) -> Preload {
        self.preload.unwrap_or(if self.max_workers > 1 {
            Preload::NextShards((self.max_workers / 2).max(1))
        } else {
            Preload::None
        })
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        if self.max_cache_size == 0 {
            return Err(Error::InvalidOption {
                option: "max_cache_size",
                reason: "must be at least 1".into(),
            });
        }
        if self.max_workers == 0 {
            return Err(Error::InvalidOption {
                option: "max_workers",
                reason: "must be at least 1".into(),
            });
        }
        if matches!(
            self.max_shard_length,
            ShardLength::Items(0) | ShardLength::Bytes(0)
        ) {
            return Err(Error::InvalidOption {
                option: "max_shard_length",
                reason: "must be positive".into(),
            });
        }
        if self.preload_all_async && self.max_workers < 2 {
            return Err(Error::InvalidOption {
                option: "preload_all_async",
                reason: "needs max_workers > 1".into(),
            });
        }
        Ok(())
    }
}
