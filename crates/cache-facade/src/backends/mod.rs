//! [`CacheBackend`] over each store, and [`open`] / [`open_with_source`],
//! which pick one from a config.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::{CacheBackend, CacheConfig, Operation, Result, Source, Stats, StoreKind};

pub(crate) mod memmap;
pub(crate) mod pages;
pub(crate) mod segment;
pub(crate) mod shards;

pub use memmap::MemmapBackend;
pub use pages::{PAGE_FILE, PageBackend};
pub use segment::SegmentBackend;
pub use shards::ShardBackend;

/// A backend behind the trait, as [`open`] returns it.
pub type Cache = Box<dyn CacheBackend>;

/// Opens the cache `config` names. Build-once caches (memmap-array,
/// page-alloc) must be built already (else [`crate::FacadeError::NotBuilt`]);
/// a shard-store cache without a source serves only what is on disk.
///
/// A `root` that is a URL (`s3://bucket/prefix`, ...) opens the cache
/// published at `<root>/<name>/<key>` from a local working directory (see
/// [`crate::TierOptions`]); its `flush` publishes.
pub fn open(config: &CacheConfig) -> Result<Cache> {
    if let Some((local, remote)) = crate::remote::localize(config)? {
        let inner = open_local(config.backend, &local)?;
        return Ok(Box::new(crate::remote::RemoteBackend::new(inner, remote)));
    }
    open_local(config.backend, config)
}

fn open_local(kind: StoreKind, config: &CacheConfig) -> Result<Cache> {
    Ok(match kind {
        StoreKind::SegmentStore => Box::new(SegmentBackend::open(config)?),
        StoreKind::MemmapArray => Box::new(MemmapBackend::open(config)?),
        StoreKind::ShardStore => Box::new(ShardBackend::open(config)?),
        StoreKind::PageAlloc => Box::new(PageBackend::open(config)?),
    })
}

/// Opens the cache `config` names, building (resuming, rebuilding) it from
/// `source` when needed. segment-store caches are filled by puts and take
/// no source: that is [`crate::FacadeError::Unsupported`].
///
/// With a URL `root`, a cache built here is published before this returns.
pub fn open_with_source(config: &CacheConfig, source: Source) -> Result<Cache> {
    if let Some((local, remote)) = crate::remote::localize(config)? {
        let inner = open_local_with_source(&local, source)?;
        let backend = crate::remote::RemoteBackend::new(inner, remote);
        backend.publish()?;
        return Ok(Box::new(backend));
    }
    open_local_with_source(config, source)
}

fn open_local_with_source(config: &CacheConfig, source: Source) -> Result<Cache> {
    Ok(match config.backend {
        StoreKind::SegmentStore => {
            return Err(crate::FacadeError::Unsupported {
                dir: config.cache_dir()?,
                backend: config.backend.name(),
                op: "build from a source",
                why: "it is filled by put_batch (or CachedFn); open it with open",
            });
        }
        StoreKind::MemmapArray => Box::new(MemmapBackend::open_with_source(config, source)?),
        StoreKind::ShardStore => Box::new(ShardBackend::open_with_source(config, source)?),
        StoreKind::PageAlloc => Box::new(PageBackend::open_with_source(config, source)?),
    })
}

/// Why `kind` does not serve `op` (for [`crate::FacadeError::Unsupported`]).
pub(crate) fn why_unsupported(kind: StoreKind, op: Operation) -> &'static str {
    match (kind, op) {
        (StoreKind::SegmentStore, Operation::GetByIndex) => {
            "segment-store is keyed: its records have no order; use get_batch with string ids"
        }
        (StoreKind::MemmapArray, Operation::Put) => {
            "memmap-array caches are built once from a Source (open_with_source); rebuild to change them"
        }
        (StoreKind::ShardStore, Operation::GetByKey) => {
            "shard-store items are addressed by index; use get_indices"
        }
        (StoreKind::ShardStore, Operation::Put) => {
            "shard-store items come from the source iterator; change the source and rebuild"
        }
        (StoreKind::PageAlloc, Operation::GetByKey) => {
            "page-alloc samples are addressed by index; use get_indices"
        }
        (StoreKind::PageAlloc, Operation::Put) => {
            "a page file is built once from a Source and then only read; rebuild it to change it"
        }
        _ => "not supported by this backend",
    }
}

/// Counters shared by the backends.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
}

impl Counters {
    pub(crate) fn lookup(&self, hits: usize, misses: usize, bytes: usize) {
        self.hits.fetch_add(hits as u64, Ordering::Relaxed);
        if misses > 0 {
            self.misses.fetch_add(misses as u64, Ordering::Relaxed);
        }
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn written(&self, bytes: usize) {
        self.bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn flushed(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

/// `index` (negative: from the end) as a position in `0..len`.
pub(crate) fn resolve_index(dir: &std::path::Path, index: i64, len: u64) -> Result<u64> {
    let at = if index >= 0 {
        Some(index as u64)
    } else {
        len.checked_sub(index.unsigned_abs())
    };
    at.filter(|&i| i < len)
        .ok_or_else(|| crate::FacadeError::IndexOutOfRange {
            dir: dir.to_path_buf(),
            index,
            len,
        })
}
