//! What a store reports about its own state — the shard files on disk and
//! their sizes, the decoded shards it holds, its cache-miss counters, its
//! source cursors, its preload — and [`ShardStore::finalize`]. These are
//! the internals loadit users read (`loader.shards.size()`,
//! `get_all_shards()`, `memory_cache.size()`, `_cache_miss_count`,
//! `writer_pool.writers[i].current_idx`), answered from the engine's state.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use crate::error::Result;
use crate::format::{ShardName, StoreItem};
use crate::options::Preload;
use crate::store::ShardStore;

/// One shard file on disk, from [`ShardStore::shard_files`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardFile {
    /// The items it holds: `start..end`, parsed from its name.
    pub name: ShardName,
    /// Where it is.
    pub path: PathBuf,
    /// Its size in bytes (compressed, when the root is).
    pub bytes: u64,
}

/// Cache-miss counts of a store since it was opened (all its handles), from
/// [`ShardStore::counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Foreground lookups (`get`, `get_many`, iteration) whose shard was
    /// not decoded in memory: it was read from disk or generated.
    pub memory_misses: u64,
    /// Lookups, foreground or by a background worker, whose shard had no
    /// file on disk: it was generated from the source (or, without one,
    /// reported as not cached).
    pub disk_misses: u64,
}

/// How far one replay of the source has got, from [`ShardStore::cursors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CursorState {
    /// Items pulled from this replay so far (the next item's index).
    pub pos: u64,
    /// Whether this replay reached the end of the source.
    pub done: bool,
}

impl<T: StoreItem> ShardStore<T> {
    /// Every shard file in `shards/`, by start (a file evicted between
    /// the listing and its size is left out).
    pub fn shard_files(&self) -> Result<Vec<ShardFile>> {
        let inner = &self.inner;
        let mut names = inner.shard_files()?;
        names.sort_unstable();
        Ok(names
            .into_iter()
            .filter_map(|name| {
                let path = inner.paths.shards.join(name.file_name(inner.compression));
                let bytes = std::fs::metadata(&path).ok()?.len();
                Some(ShardFile { name, path, bytes })
            })
            .collect())
    }

    /// Bytes of the shard files on disk: what `memory_limit` bounds.
    pub fn disk_bytes(&self) -> Result<u64> {
        Ok(self.shard_files()?.iter().map(|f| f.bytes).sum())
    }

    /// Decoded shards held in memory (at most `max_cache_size`).
    pub fn cached_shards(&self) -> usize {
        self.inner.state.lock().cache.len()
    }

    /// Whether the shard starting at `start` is decoded in memory.
    pub fn is_cached(&self, start: u64) -> bool {
        self.inner.state.lock().cache.contains_key(&start)
    }

    /// The cache-miss counts since the store was opened.
    pub fn counters(&self) -> Counters {
        Counters {
            memory_misses: self.inner.memory_misses.load(Ordering::Relaxed),
            disk_misses: self.inner.disk_misses.load(Ordering::Relaxed),
        }
    }

    /// What the background workers load after a foreground access now.
    pub fn preload(&self) -> Preload {
        match self.inner.preload.load(Ordering::Relaxed) {
            0 => Preload::None,
            n => Preload::NextShards(n),
        }
    }

    /// Changes what the background workers load after a foreground access
    /// (from the next access on; shards already queued still load). Has no
    /// effect without workers (`max_workers` 1).
    pub fn set_preload(&self, preload: Preload) {
        let n = match preload {
            Preload::None => 0,
            Preload::NextShards(n) => n,
        };
        self.inner.preload.store(n, Ordering::Relaxed);
    }

    /// The source cursors (`max_workers` of them): `None` for one never
    /// used. Waits for a cursor that is generating a shard.
    pub fn cursors(&self) -> Vec<Option<CursorState>> {
        self.inner
            .cursors
            .iter()
            .map(|c| {
                c.lock().as_ref().map(|c| CursorState {
                    pos: c.pos,
                    done: c.done,
                })
            })
            .collect()
    }

    /// Declares that the items end where the shards on disk end (loadit's
    /// `finalize`): the end of the furthest shard file becomes the final
    /// length, recorded in `metadata.json`. A length already final is kept.
    /// Returns the final length.
    pub fn finalize(&self) -> Result<u64> {
        if let Some(len) = self.inner.final_length_refreshed()? {
            return Ok(len);
        }
        let len = self
            .inner
            .shard_files()?
            .iter()
            .map(|n| n.end)
            .max()
            .unwrap_or(0);
        self.inner.set_final_length(len)?;
        Ok(len)
    }
}
