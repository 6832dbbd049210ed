//! The adapters, one file per store, and the registry the commands loop over.

pub(crate) mod beton;
pub(crate) mod memmap;
pub(crate) mod pages;
pub(crate) mod segments;
pub(crate) mod shards;

use std::path::Path;

use crate::adapter::CacheAdapter;
use crate::error::{CliError, Result};

/// Every adapter, one per kind of cache [`cache_facade::detect`] finds.
pub static ADAPTERS: &[&dyn CacheAdapter] = &[
    &segments::SEGMENT_STORE,
    &segments::TORCHCACHEX,
    &memmap::MemmapArray,
    &shards::ShardStore,
    &pages::PageAlloc,
    &beton::Beton,
];

/// The adapter for the cache at `path`, or `None` when it is no cache we know.
pub fn detect(path: &Path) -> Option<&'static dyn CacheAdapter> {
    let kind = cache_facade::detect(path)?;
    ADAPTERS.iter().copied().find(|a| a.kind() == kind)
}

/// The adapter for `path`, or the usage error saying why there is none.
pub fn adapter_for(path: &Path) -> Result<&'static dyn CacheAdapter> {
    if !path.exists() {
        return Err(CliError::NoSuchPath(path.to_path_buf()));
    }
    detect(path).ok_or_else(|| CliError::NotACache {
        path: path.to_path_buf(),
        known: known_kinds(),
    })
}

/// The kinds we know, for messages.
fn known_kinds() -> String {
    ADAPTERS
        .iter()
        .map(|a| a.kind().name())
        .collect::<Vec<_>>()
        .join(", ")
}
