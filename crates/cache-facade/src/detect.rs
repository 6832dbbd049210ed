//! Which kind of cache a path holds, from the files each store writes.

use std::path::Path;

/// The kinds of cache `cachex` understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
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
            CacheKind::ShardStore => "shard-store (loadit layout)",
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
        let mut head = [0u8; 8];
        let n = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
            .unwrap_or(0);
        if n == 8 && head == page_alloc::format::MAGIC {
            return Some(CacheKind::PageAlloc);
        }
        // FFCV has no magic: the extension, or header version 2.
        let is_beton_ext = path.extension().is_some_and(|e| e == "beton");
        if is_beton_ext || (n >= 2 && head[..2] == [2, 0]) {
            return Some(CacheKind::Beton);
        }
    }
    None
}
