//! What an adapter is (one per kind of cache), and the argument and number
//! conventions every adapter shares. The registry is in `adapters/`.

use std::path::Path;

use cache_check::{Problem, Summary};
use cache_facade::Detected;
use serde_json::Value;

use crate::error::{CliError, Result};

/// What `cachex` does with one kind of cache. Each command finds the
/// adapter whose [`detect`](CacheAdapter::detect) accepts the path and
/// calls it; no command knows the stores.
pub trait CacheAdapter: Sync {
    /// The kind this adapter handles.
    fn kind(&self) -> Detected;
    /// Whether `path` holds a cache of this kind (from its files, cheaply:
    /// [`cache_facade::detect`], the rules `open` also uses).
    fn detect(&self, path: &Path) -> bool {
        cache_facade::detect(path) == Some(self.kind())
    }
    /// What the cache holds: schema, counts, per-file tables.
    fn inspect(&self, path: &Path) -> Result<Summary>;
    /// Everything wrong with the cache (empty when sound); never fails: a
    /// cache that does not open is a problem.
    fn verify(&self, path: &Path) -> Vec<Problem>;
    /// One record, by key or index, as JSON.
    fn get(&self, path: &Path, key: &str) -> Result<Value>;
    /// Counters and ratios `inspect` does not print: bytes per item,
    /// dead or absent data, fill and dedup ratios.
    fn stats(&self, path: &Path) -> Result<Summary>;
}

/// An index argument: `0 <= i < len`, or negative from the end.
pub(crate) fn parse_index(path: &Path, key: &str, len: u64) -> Result<u64> {
    let i: i64 = key.parse().map_err(|_| CliError::BadKey {
        path: path.to_path_buf(),
        key: key.to_owned(),
    })?;
    let resolved = if i < 0 {
        i128::from(len) + i128::from(i)
    } else {
        i128::from(i)
    };
    if resolved < 0 || resolved >= i128::from(len) {
        return Err(CliError::NotFound {
            path: path.to_path_buf(),
            what: format!("index {i} out of range for {len} items"),
        });
    }
    // In 0..len, so it fits.
    Ok(resolved as u64)
}

/// `a / b` as a JSON number, `null` when `b` is 0.
pub(crate) fn ratio(a: u64, b: u64) -> Value {
    if b == 0 {
        Value::Null
    } else {
        serde_json::json!(a as f64 / b as f64)
    }
}
