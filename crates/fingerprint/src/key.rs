//! Cache keys: the name of a config's cache directory.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{FingerprintError, Result, canonical};

/// Version of the canonical encoding and key derivation. Bumping it changes
/// every key, so old caches are missed rather than misread.
pub const KEY_FORMAT_VERSION: u32 = 1;

/// BLAKE3 `derive_key` context of config keys and hashes.
const KEY_CONTEXT: &str = "cachex fingerprint 2026-11 config key v1";

/// A config's cache key: 16 lowercase hex characters (64 bits of BLAKE3).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CacheKey(String);

impl CacheKey {
    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for CacheKey {
    type Err = FingerprintError;
    fn from_str(s: &str) -> Result<CacheKey> {
        let ok = s.len() == 16 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(CacheKey(s.to_owned()))
        } else {
            Err(FingerprintError::InvalidKey(s.to_owned()))
        }
    }
}

impl TryFrom<String> for CacheKey {
    type Error = FingerprintError;
    fn try_from(s: String) -> Result<CacheKey> {
        s.parse()
    }
}

impl From<CacheKey> for String {
    fn from(k: CacheKey) -> String {
        k.0
    }
}

/// The full BLAKE3 hash (64 hex characters) of a config's canonical encoding.
pub fn config_hash<T: Serialize + ?Sized>(config: &T) -> Result<String> {
    let encoded = canonical::encode(config)?;
    let mut hasher = blake3::Hasher::new_derive_key(KEY_CONTEXT);
    hasher.update(&encoded);
    Ok(hasher.finalize().to_hex().to_string())
}

/// The cache key of a config: the first 16 hex characters of [`config_hash`].
pub fn compute_key<T: Serialize + ?Sized>(config: &T) -> Result<CacheKey> {
    let mut hash = config_hash(config)?;
    hash.truncate(16);
    Ok(CacheKey(hash))
}

/// The directory of `key`'s cache under `root`: `root/<key>`.
pub fn cache_key_dir(root: &Path, key: &CacheKey) -> PathBuf {
    root.join(key.as_str())
}

/// What a named cache is keyed by: `{"backend", "name", "options"}`. The
/// facade (`cache-facade`) and the stores' own `open_or_build` both key
/// and fingerprint a cache by this value, so a cache built one way is
/// found the other.
pub fn cache_identity<T: Serialize + ?Sized>(
    backend: &str,
    name: &str,
    options: &T,
) -> Result<serde_json::Value> {
    let options =
        serde_json::to_value(options).map_err(|e| FingerprintError::Encode(e.to_string()))?;
    Ok(serde_json::json!({"backend": backend, "name": name, "options": options}))
}

/// The directory of a named cache: `root/<name>/<key of identity>`, where
/// `identity` is [`cache_identity`]'s value for the same name. The name must
/// be one plain path component (not empty, `.`, `..`, and without `/`,
/// `\` or NUL), so no name points outside its root.
pub fn named_cache_dir(root: &Path, name: &str, identity: &serde_json::Value) -> Result<PathBuf> {
    let plain =
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
    if !plain {
        return Err(FingerprintError::InvalidName(name.to_owned()));
    }
    Ok(root.join(name).join(compute_key(identity)?.as_str()))
}
