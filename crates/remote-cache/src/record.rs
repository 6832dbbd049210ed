//! The small JSON records a commit log names by sequence number (commit
//! records, checkpoints): one encoder and one decoder with the checks
//! every such record gets on read — a size cap, the format version, a
//! BLAKE3 of the record itself, the sequence number its name promises,
//! and paths that stay inside the cache.
//!
//! The checksum is a `"checksum"` member: the BLAKE3 (hex) of the record's
//! JSON without it, keys in the order `serde_json` gives them. Without it a
//! byte flipped inside a path or a hash still parses: the reader would
//! write a file under the wrong name and record the commit as applied.
//! Every record carries it.

use std::path::{Component, Path};

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The member that holds a record's checksum.
pub const CHECKSUM: &str = "checksum";

/// A record stored under a name that carries its sequence number.
pub trait SeqRecord: DeserializeOwned {
    /// What the record is called in error messages (`"commit record"`).
    const KIND: &'static str;
    /// The format version this build writes and reads.
    const VERSION: u32;
    /// The largest record read, in bytes.
    const MAX_BYTES: usize;
    /// The record's format version.
    fn version(&self) -> u32;
    /// The record's sequence number.
    fn seq(&self) -> u64;
}

/// The BLAKE3 (hex) of `value`'s JSON, which holds no checksum.
fn digest(value: &Value) -> Result<String, String> {
    let bytes = serde_json::to_vec(value).map_err(|e| format!("cannot encode: {e}"))?;
    Ok(blake3::hash(&bytes).to_hex().to_string())
}

/// `record` as the bytes to store: its JSON with its checksum.
pub fn encode_record<T: SeqRecord + Serialize>(record: &T) -> Result<Vec<u8>, String> {
    let value = serde_json::to_value(record).map_err(|e| format!("cannot encode: {e}"))?;
    seal(value).map_err(|e| format!("a {}: {e}", T::KIND))
}

/// A JSON object as stored bytes, with (in place of any it had) the
/// checksum of the rest: how [`encode_record`] seals a record, and how a
/// fuzzer turns arbitrary JSON into a record that passes the checksum.
pub fn seal(mut value: Value) -> Result<Vec<u8>, String> {
    let Value::Object(map) = &mut value else {
        return Err("not a JSON object".into());
    };
    map.remove(CHECKSUM);
    let sum = digest(&value)?;
    if let Value::Object(map) = &mut value {
        map.insert(CHECKSUM.into(), Value::String(sum));
    }
    serde_json::to_vec(&value).map_err(|e| format!("cannot encode: {e}"))
}

/// Decodes record `seq` from `bytes`, checking its size, version,
/// checksum and sequence number. The error is the problem, for the
/// caller's own `Corrupt` error (which names the URL and the object).
pub fn decode_record<T: SeqRecord>(bytes: &[u8], seq: u64) -> std::result::Result<T, String> {
    if bytes.len() > T::MAX_BYTES {
        return Err(format!("{} bytes, limit {}", bytes.len(), T::MAX_BYTES));
    }
    let mut value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not a {}: {e}", T::KIND))?;
    let sum = match &mut value {
        Value::Object(map) => map.remove(CHECKSUM),
        _ => None,
    };
    let record: T = T::deserialize(&value).map_err(|e| format!("not a {}: {e}", T::KIND))?;
    let version = record.version();
    if version != T::VERSION {
        return Err(format!(
            "version {version}, this build reads {}",
            T::VERSION
        ));
    }
    match sum {
        Some(Value::String(sum)) => {
            let want = digest(&value)?;
            if sum != want {
                return Err(format!(
                    "checksum {sum} does not match its contents (BLAKE3 {want})"
                ));
            }
        }
        Some(other) => return Err(format!("checksum {other} is not a string")),
        None => return Err(format!("version {version} without its checksum")),
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
