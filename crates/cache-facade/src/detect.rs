//! Which kind of cache a path holds, from the files each store writes.
//! `open` refuses a directory of another kind with it, and the `cachex`
//! tool picks its adapter with it.

use std::io::Read;
use std::path::Path;

use page_alloc::beton::{self, HEADER_LEN};

/// The kinds of cache `cachex` understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CacheKind {
    /// A segment-store directory (segments plus our index log).
    SegmentStore,
    /// A torchcachex directory (segments, no index of ours).
    Torchcachex,
    /// A memmap-array directory (finished or being written).
    MemmapArray,
    /// A shard-store or loadit root (the same layout).
    ShardStore,
    /// A page-alloc file.
    PageAlloc,
    /// An FFCV `.beton` file.
    Beton,
}

impl CacheKind {
    /// The kind's name in messages and `--json` output.
    pub fn name(self) -> &'static str {
        match self {
            CacheKind::SegmentStore => "segment-store",
            CacheKind::Torchcachex => "torchcachex",
            CacheKind::MemmapArray => "memmap-array",
            CacheKind::ShardStore => "shard-store",
            CacheKind::PageAlloc => "page-alloc",
            CacheKind::Beton => "beton",
        }
    }
}

/// The kind of cache at `path`, or `None` when it is none we know.
pub fn detect(path: &Path) -> Option<CacheKind> {
    if path.is_dir() {
        if path.join(segment_store::format::INDEX_FILE).is_file() {
            return Some(CacheKind::SegmentStore);
        }
        if path.join(segment_store::format::SEGMENTS_DIR).is_dir() {
            return Some(CacheKind::Torchcachex);
        }
        if path.join(memmap_array::SHAPES_FILE).is_file()
            || path.join(memmap_array::MANIFEST_FILE).is_file()
        {
            return Some(CacheKind::MemmapArray);
        }
        if path.join(shard_store::format::METADATA_FILE).is_file()
            && path.join(shard_store::format::SHARDS_DIR).is_dir()
        {
            return Some(CacheKind::ShardStore);
        }
    }
    if path.is_file() {
        let mut head = Vec::with_capacity(HEADER_LEN);
        let len = std::fs::File::open(path).and_then(|f| {
            let len = f.metadata()?.len();
            f.take(HEADER_LEN as u64).read_to_end(&mut head)?;
            Ok(len)
        });
        let Ok(len) = len else {
            return None;
        };
        if head.get(..8) == Some(&page_alloc::format::MAGIC[..]) {
            return Some(CacheKind::PageAlloc);
        }
        // FFCV has no magic. A file named `.beton` is taken at its word
        // when it starts with version 2 (so a damaged one is verified, not
        // ignored); any other file needs a plausible whole header: version,
        // counts, and pointers within the file.
        let named = path.extension().is_some_and(|e| e == "beton");
        let version_2 = head.get(..2) == Some(&beton::BETON_VERSION.to_le_bytes()[..]);
        if (named && version_2) || beton::is_beton_header(&head, len) {
            return Some(CacheKind::Beton);
        }
    }
    None
}
