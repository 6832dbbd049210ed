//! The small JSON records a remote cache names by sequence number
//! (snapshot manifests, remote-cache's commit records): one decoder with the
//! checks every such record gets on read — a size cap, the format version,
//! the sequence number its name promises, and paths that stay inside the
//! cache.

use std::path::{Component, Path};

use serde::de::DeserializeOwned;

/// A record stored under a name that carries its sequence number.
pub trait SeqRecord: DeserializeOwned {
    /// What the record is called in error messages (`"manifest"`).
    const KIND: &'static str;
    /// The format version this build reads.
    const VERSION: u32;
    /// The largest record read, in bytes.
    const MAX_BYTES: usize;
    /// The record's format version.
    fn version(&self) -> u32;
    /// The record's sequence number.
    fn seq(&self) -> u64;
}

/// Decodes record `seq` from `bytes`, checking its size, version and
/// sequence number. The error is the problem, for the caller's own
/// `Corrupt` error (which names the URL and the object).
pub fn decode_record<T: SeqRecord>(bytes: &[u8], seq: u64) -> std::result::Result<T, String> {
    if bytes.len() > T::MAX_BYTES {
        return Err(format!("{} bytes, limit {}", bytes.len(), T::MAX_BYTES));
    }
    let record: T = serde_json::from_slice(bytes).map_err(|e| format!("not a {}: {e}", T::KIND))?;
    if record.version() != T::VERSION {
        return Err(format!(
            "version {}, this build reads {}",
            record.version(),
            T::VERSION
        ));
    }
    if record.seq() != seq {
        return Err(format!("says seq {} under the name of {seq}", record.seq()));
    }
    Ok(record)
}

/// Whether a record's `/`-separated `path` is a non-empty relative path
/// that stays inside the cache directory (no `..`, no root, no `.`).
pub fn is_relative_inside(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}
