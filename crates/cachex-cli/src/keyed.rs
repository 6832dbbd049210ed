//! `cachex get URL KEY` on a segment store published at a URL: the key's
//! record read through byte ranges of its segment — the index (commit
//! records, index logs, schema) and the blocks that hold the key's row,
//! never whole segments nor the rest of the cache, so a key of a large
//! cache costs a few requests on an empty tier. Other caches at a URL are
//! materialised and read as before (`remote::materialise`).

use std::path::PathBuf;

use remote_cache::{Location, SegmentsAt, StoreKind};
use serde_json::Value;

use crate::error::{CliError, Result};
use crate::remote::remote_cache_error;
use cache_facade::json::record_json;

/// The record of `key` in the segment store at `url`, as JSON; `None`
/// when `url` holds another kind of cache.
pub(crate) fn get(url: &str, key: &str) -> Result<Option<Value>> {
    let location = Location::parse(url).map_err(remote_cache_error)?;
    // Applied as a segment store reads it (segments linked, not copied):
    // which kind of cache it is shows in the files then.
    let kind = {
        let opened = location
            .open_dir(StoreKind::SegmentStore)
            .map_err(remote_cache_error)?;
        cache_facade::detect(opened.path())
    };
    if kind.map(|found| found.kind) != Some(StoreKind::SegmentStore) {
        return Ok(None);
    }
    let options = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    let store = SegmentsAt::open(&location, options).map_err(remote_cache_error)?;
    let (mut got, _) = store.get_batch(&[key]).map_err(remote_cache_error)?;
    match got.pop().flatten() {
        Some(record) => Ok(Some(record_json(&record))),
        None => Err(CliError::NotFound {
            path: PathBuf::from(location.shown()),
            what: format!("no record with key {key:?}"),
        }),
    }
}
