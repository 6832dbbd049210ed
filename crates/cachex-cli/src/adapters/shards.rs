//! shard-store (and loadit) roots.

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::{Detected, StoreKind};
use serde_json::Value;
use shard_store::{Options, PickleValue};

use crate::adapter::{CacheAdapter, ratio};
use crate::error::{CliError, Result};
use crate::json::pickle_to_json;

/// A shard-store or loadit root (the same layout).
pub(crate) struct ShardStore;

impl CacheAdapter for ShardStore {
    fn kind(&self) -> Detected {
        Detected::own(StoreKind::ShardStore)
    }

    fn inspect(&self, path: &Path) -> Result<Summary> {
        let summary = shard_store::inspect(path).map_err(CliError::store)?;
        Ok(summary.summary())
    }

    fn verify(&self, path: &Path) -> Vec<Problem> {
        shard_store::verify(path)
    }

    /// By index (negative from the end), without a source: only cached
    /// items read.
    fn get(&self, path: &Path, key: &str) -> Result<Value> {
        let index: i64 = key.parse().map_err(|_| CliError::BadKey {
            path: path.to_path_buf(),
            key: key.to_owned(),
        })?;
        let store: shard_store::ShardStore<PickleValue> =
            shard_store::ShardStore::open(path, Options::default()).map_err(CliError::store)?;
        match store.get(index) {
            Ok(item) => Ok(pickle_to_json(&item.0)),
            Err(shard_store::Error::IndexOutOfRange { .. }) => Err(CliError::NotFound {
                path: path.to_path_buf(),
                what: format!("index {index} out of range"),
            }),
            Err(e) => Err(CliError::store(e)),
        }
    }

    fn stats(&self, path: &Path) -> Result<Summary> {
        let s = shard_store::inspect(path).map_err(CliError::store)?;
        let mut out = Summary::new(self.kind().name(), path)
            .fact("items_cached", s.items_cached)
            .fact("length", s.length)
            .fact("shards", s.shards)
            .fact("items_per_shard", ratio(s.items_cached, s.shards as u64))
            .fact("bytes_on_disk", s.bytes_on_disk)
            .fact("bytes_per_item", ratio(s.bytes_on_disk, s.items_cached));
        if let Some(length) = s.length {
            out.push_fact("cached_fraction", ratio(s.items_cached, length));
            out.push_fact("items_missing", length.saturating_sub(s.items_cached));
        }
        Ok(out)
    }
}
