//! segment-store directories and torchcachex directories (the same
//! segments; only ours have an index log).

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::{Detected, PeerFormat, StoreKind};
use segment_store::{Options, SegmentStore};
use serde_json::{Value, json};

use crate::adapter::{CacheAdapter, ratio};
use crate::error::{CliError, Result};
use crate::json::record_json;

/// A segment-store or torchcachex directory.
pub(crate) struct Segments {
    torchcachex: bool,
}

/// Directories with our index log.
pub(crate) static SEGMENT_STORE: Segments = Segments { torchcachex: false };
/// Directories of segments without it.
pub(crate) static TORCHCACHEX: Segments = Segments { torchcachex: true };

/// Opens `path` for reading only, with no LRU.
pub(crate) fn open(path: &Path, read_only: bool) -> Result<SegmentStore> {
    let opts = Options {
        read_only,
        lru_bytes: 0,
        ..Options::default()
    };
    SegmentStore::open(path, opts).map_err(CliError::store)
}

impl CacheAdapter for Segments {
    fn kind(&self) -> Detected {
        if self.torchcachex {
            Detected::peer(PeerFormat::Torchcachex)
        } else {
            Detected::own(StoreKind::SegmentStore)
        }
    }

    fn inspect(&self, path: &Path) -> Result<Summary> {
        let mut summary = open(path, true)?.inspect().summary();
        summary.kind = self.kind().name().into();
        Ok(summary)
    }

    fn verify(&self, path: &Path) -> Vec<Problem> {
        cache_facade::verify(self.kind(), path)
    }

    fn get(&self, path: &Path, key: &str) -> Result<Value> {
        let store = open(path, true)?;
        let (mut values, _) = store.get_batch(&[key]).map_err(CliError::store)?;
        let record = values.pop().flatten().ok_or_else(|| CliError::NotFound {
            path: path.to_path_buf(),
            what: format!("no record with key {key:?}"),
        })?;
        Ok(record_json(&record))
    }

    fn stats(&self, path: &Path) -> Result<Summary> {
        let store = open(path, true)?;
        let s = store.stats();
        let report = store.inspect();
        let rows: usize = report.segments.iter().filter_map(|s| s.rows).sum();
        let live: usize = report.segments.iter().map(|s| s.live_rows).sum();
        let unreadable = report.segments.iter().filter(|s| s.rows.is_none()).count();
        Ok(Summary::new(self.kind().name(), path)
            .fact("entries", s.entries)
            .fact("segments", s.segments)
            .fact("unreadable_segments", unreadable)
            .fact("rows", rows)
            .fact("dead_rows", rows.saturating_sub(live))
            .fact("disk_bytes", report.disk_bytes)
            .fact(
                "bytes_per_entry",
                ratio(report.disk_bytes, s.entries as u64),
            )
            .fact("index_bytes", s.index_bytes)
            .fact("index_bytes_per_entry", json!(s.index_bytes_per_entry)))
    }
}
