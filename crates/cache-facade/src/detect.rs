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
}

impl CacheKind {
    /// The kind's name in messages and `--json` output.
    pub fn name(self) -> &'static str {
        match self {
            CacheKind::SegmentStore => "segment-store",
            CacheKind::Torchcachex => "torchcachex",
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
    }
    None
}
