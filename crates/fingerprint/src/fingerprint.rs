//! Fingerprints, `fingerprint.json`, and why a cache is stale.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::key::{KEY_FORMAT_VERSION, config_hash};
use crate::{Result, SourceStamp};

/// Version of the `fingerprint.json` layout.
pub const FINGERPRINT_FORMAT_VERSION: u32 = 1;

/// The file a cache directory keeps its fingerprint in.
pub const FINGERPRINT_FILE: &str = "fingerprint.json";

/// Everything a cache was built from: the config, the source files and the
/// version of the store's format. Serialized as `fingerprint.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Layout version of this record ([`FINGERPRINT_FORMAT_VERSION`]).
    pub format_version: u32,
    /// Version of the canonical encoding ([`KEY_FORMAT_VERSION`]).
    pub key_version: u32,
    /// The store's cache version; a store bumps it to miss old caches.
    pub cache_version: u32,
    /// BLAKE3 of the config's canonical encoding (64 hex characters).
    pub config_hash: String,
    /// The config as JSON, kept so a change can be named field by field
    /// (`null` when the config has no JSON form).
    pub config: Value,
    /// The source files, sorted by relative path.
    pub sources: Vec<SourceStamp>,
}

/// The fingerprint of `config` built from `sources` by a store whose format
/// is at `cache_version`.
pub fn compute_fingerprint<T: Serialize + ?Sized>(
    config: &T,
    sources: Vec<SourceStamp>,
    cache_version: u32,
) -> Result<Fingerprint> {
    let mut sources = sources;
    sources.sort_by(|a, b| a.rel_path.cmp(&b.rel_path));
    Ok(Fingerprint {
        format_version: FINGERPRINT_FORMAT_VERSION,
        key_version: KEY_FORMAT_VERSION,
        cache_version,
        config_hash: config_hash(config)?,
        config: serde_json::to_value(config).unwrap_or(Value::Null),
        sources,
    })
}

/// The largest `fingerprint.json` read: far above any real one (a config plus
/// one line per source file), small enough that a corrupt or hostile file
/// cannot exhaust memory.
pub const FINGERPRINT_FILE_CAP: u64 = 64 << 20;

impl Fingerprint {
    /// Reads `path`. A missing file is [`Stale::Missing`]; an unreadable or
    /// corrupt one is [`Stale::Unreadable`]: either way the cache is stale.
    pub fn read(path: &Path) -> Result<Fingerprint, Stale> {
        let bytes = durable_fs::read_capped(path, FINGERPRINT_FILE_CAP).map_err(|e| match e {
            durable_fs::Error::Io { source, .. }
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                Stale::Missing {
                    path: path.to_path_buf(),
                }
            }
            durable_fs::Error::Io { op, source, .. } => Stale::Unreadable {
                path: path.to_path_buf(),
                reason: format!("{op}: {source}"),
            },
            durable_fs::Error::TooLarge { cap, .. } => Stale::Unreadable {
                path: path.to_path_buf(),
                reason: format!("larger than the {cap}-byte limit for this file"),
            },
            other => Stale::Unreadable {
                path: path.to_path_buf(),
                reason: other.to_string(),
            },
        })?;
        serde_json::from_slice(&bytes).map_err(|e| Stale::Unreadable {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Writes `path` atomically (temp file, fsync, rename, directory fsync).
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut json = serde_json::to_vec_pretty(self)
            .map_err(|e| crate::FingerprintError::Encode(e.to_string()))?;
        json.push(b'\n');
        durable_fs::write_atomic(path, &json).map_err(crate::FingerprintError::durable)
    }

    /// Why a cache built with `self` is stale for `current`, if it is.
    pub fn stale_reason(&self, current: &Fingerprint) -> Option<Stale> {
        validate(self, current).err()
    }
}

/// Checks a stored fingerprint against the current one: `Ok` when the cache
/// may be used, else every reason it may not.
pub fn validate(stored: &Fingerprint, current: &Fingerprint) -> Result<(), Stale> {
    let mut reasons = Vec::new();
    for (what, old, new) in [
        (
            "fingerprint format",
            stored.format_version,
            current.format_version,
        ),
        ("key format", stored.key_version, current.key_version),
        ("cache", stored.cache_version, current.cache_version),
    ] {
        if old != new {
            reasons.push(StaleReason::VersionChanged { what, old, new });
        }
    }
    if stored.config_hash != current.config_hash {
        let mut fields = Vec::new();
        diff_json(&stored.config, &current.config, String::new(), &mut fields);
        reasons.push(StaleReason::ConfigChanged {
            old_hash: stored.config_hash.clone(),
            new_hash: current.config_hash.clone(),
            fields,
        });
    }
    diff_sources(&stored.sources, &current.sources, &mut reasons);
    if reasons.is_empty() {
        Ok(())
    } else {
        Err(Stale::Changed(reasons))
    }
}

/// Reads `dir/fingerprint.json` and validates it against `current`.
pub fn check_dir(dir: &Path, current: &Fingerprint) -> Result<(), Stale> {
    let stored = Fingerprint::read(&dir.join(FINGERPRINT_FILE))?;
    validate(&stored, current)
}

fn diff_sources(old: &[SourceStamp], new: &[SourceStamp], reasons: &mut Vec<StaleReason>) {
    let find = |list: &[SourceStamp], path: &str| {
        list.binary_search_by(|s| s.rel_path.as_str().cmp(path))
            .ok()
            .map(|i| list[i].clone())
    };
    for o in old {
        match find(new, &o.rel_path) {
            None => reasons.push(StaleReason::FileRemoved {
                path: o.rel_path.clone(),
            }),
            Some(n) => {
                let changes = file_changes(o, &n);
                if !changes.is_empty() {
                    reasons.push(StaleReason::FileChanged {
                        path: o.rel_path.clone(),
                        changes,
                    });
                }
            }
        }
    }
    for n in new {
        if find(old, &n.rel_path).is_none() {
            reasons.push(StaleReason::FileAdded {
                path: n.rel_path.clone(),
            });
        }
    }
}

fn file_changes(old: &SourceStamp, new: &SourceStamp) -> Vec<FileChange> {
    let mut changes = Vec::new();
    if old.size != new.size {
        changes.push(FileChange::Size {
            old: old.size,
            new: new.size,
        });
    }
    match (&old.content, &new.content) {
        // Both hashed the content: the content decides, a moved mtime does not.
        (Some(a), Some(b)) => {
            if a != b {
                changes.push(FileChange::Content);
            }
        }
        _ => {
            if old.mtime_ns != new.mtime_ns {
                changes.push(FileChange::Mtime {
                    old: old.mtime_ns,
                    new: new.mtime_ns,
                });
            }
        }
    }
    changes
}

/// Collects the paths (`a.b[2].c`) where two JSON values differ.
fn diff_json(old: &Value, new: &Value, path: String, out: &mut Vec<String>) {
    let here = |p: &str| {
        if p.is_empty() {
            "(whole config)".to_owned()
        } else {
            p.to_owned()
        }
    };
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let sub = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (a.get(k), b.get(k)) {
                    (Some(x), Some(y)) => diff_json(x, y, sub, out),
                    _ => out.push(sub),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_json(x, y, format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        _ => out.push(here(&path)),
    }
}

/// Why a cache may not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stale {
    /// There is no `fingerprint.json`.
    Missing {
        /// The file looked for.
        path: PathBuf,
    },
    /// `fingerprint.json` could not be read or parsed.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The fingerprint differs from the current one, for these reasons.
    Changed(Vec<StaleReason>),
}

/// One difference between a stored and a current fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleReason {
    /// A format or cache version differs.
    VersionChanged {
        /// Which version: "cache", "key format" or "fingerprint format".
        what: &'static str,
        /// The stored version.
        old: u32,
        /// The current version.
        new: u32,
    },
    /// The config hashes differently.
    ConfigChanged {
        /// The stored config hash.
        old_hash: String,
        /// The current config hash.
        new_hash: String,
        /// Paths of the fields that differ (`model.depth`, `layers[2]`).
        fields: Vec<String>,
    },
    /// A source file changed.
    FileChanged {
        /// Its relative path.
        path: String,
        /// What changed.
        changes: Vec<FileChange>,
    },
    /// A source file is new.
    FileAdded {
        /// Its relative path.
        path: String,
    },
    /// A source file is gone.
    FileRemoved {
        /// Its relative path.
        path: String,
    },
}

/// What about a source file changed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileChange {
    /// Its size.
    Size {
        /// Stored size in bytes.
        old: u64,
        /// Current size in bytes.
        new: u64,
    },
    /// Its modification time (metadata mode).
    Mtime {
        /// Stored mtime, ns since the epoch.
        old: i64,
        /// Current mtime, ns since the epoch.
        new: i64,
    },
    /// Its content hash (content mode).
    Content,
}

impl fmt::Display for FileChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileChange::Size { old, new } => write!(f, "size {old} -> {new} bytes"),
            FileChange::Mtime { old, new } => write!(f, "mtime {old} -> {new} ns"),
            FileChange::Content => f.write_str("content differs"),
        }
    }
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaleReason::VersionChanged { what, old, new } => {
                write!(f, "{what} version changed from {old} to {new}")
            }
            StaleReason::ConfigChanged {
                old_hash,
                new_hash,
                fields,
            } => {
                write!(
                    f,
                    "config changed ({} -> {}",
                    &old_hash[..old_hash.len().min(16)],
                    &new_hash[..new_hash.len().min(16)]
                )?;
                if !fields.is_empty() {
                    write!(f, "; fields: {}", fields.join(", "))?;
                }
                f.write_str(")")
            }
            StaleReason::FileChanged { path, changes } => {
                let what: Vec<String> = changes.iter().map(ToString::to_string).collect();
                write!(f, "source {path} changed ({})", what.join(", "))
            }
            StaleReason::FileAdded { path } => write!(f, "source {path} was added"),
            StaleReason::FileRemoved { path } => write!(f, "source {path} was removed"),
        }
    }
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stale::Missing { path } => {
                write!(f, "cache is stale: {} is missing", path.display())
            }
            Stale::Unreadable { path, reason } => {
                write!(
                    f,
                    "cache is stale: {} is unreadable: {reason}",
                    path.display()
                )
            }
            Stale::Changed(reasons) => {
                let parts: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                write!(f, "cache is stale: {}", parts.join("; "))
            }
        }
    }
}

impl std::error::Error for Stale {}
