//! Which backend, where, with which options: the config a cache is opened
//! from, and the directory its key names.

use std::path::{Path, PathBuf};

use fingerprint::{CacheKey, Mode, cache_identity, compute_key, named_cache_dir};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{FacadeError, Result, StoreKind, TierOptions};

/// What to do when the cache on disk was built from other sources or an
/// older store format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnStale {
    /// Refuse with [`FacadeError::Stale`], which says why.
    #[default]
    Error,
    /// Clear the stale cache (under the writer lock) and start again: empty
    /// for segment-store, rebuilt from the [`crate::Source`] for the others
    /// (the reason is logged to stderr).
    Rebuild,
}

/// Source files whose stamps go into the cache's fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourcesConfig {
    /// The directory the paths are relative to.
    pub root: PathBuf,
    /// The files, relative to `root`.
    pub paths: Vec<PathBuf>,
    /// Hash contents (true) or only size and mtime (false).
    #[serde(default)]
    pub content: bool,
}

impl SourcesConfig {
    pub(crate) fn mode(&self) -> Mode {
        if self.content {
            Mode::Content
        } else {
            Mode::Metadata
        }
    }
}

/// A cache's config. Its directory is `root/<name>/<key>`, where the key
/// hashes everything that changes what the cache holds — backend, name and
/// options — so changing an option never reads a stale cache. The root,
/// `create_root` and `on_stale` do not enter the key.
///
/// Build it in code, or parse it from JSON:
/// `{"backend": "segment-store", "root": "cache", "name": "features",
///   "options": {"flush_every": 1024}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// The store.
    pub backend: StoreKind,
    /// The directory all caches live under, or an object store URL
    /// (`s3://bucket/prefix`, ...) read through a local tier (see
    /// [`TierOptions`]).
    pub root: PathBuf,
    /// The cache's name: one path component (no `/`, not `..`).
    pub name: String,
    /// Backend options (see each backend); part of the key.
    #[serde(default)]
    pub options: Map<String, Value>,
    /// Source files that make the cache stale when they change.
    #[serde(default)]
    pub sources: Option<SourcesConfig>,
    /// Create `root` when it does not exist (else that is an error).
    #[serde(default)]
    pub create_root: bool,
    /// What to do with a stale cache.
    #[serde(default)]
    pub on_stale: OnStale,
    /// How a `root` that is a URL is read locally (tier directory, budget,
    /// store options); ignored for a local root. Not part of the key.
    #[serde(default)]
    pub remote: Option<TierOptions>,
    /// Open for reading only: a segment-store cache without its writer
    /// lock, puts refused (what a process forked from the writer opens);
    /// the other stores are read-only without a source anyway, and a URL
    /// root gives each handle a working directory of its own. Not part of
    /// the key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl CacheConfig {
    /// A config with no options.
    pub fn new(backend: StoreKind, root: impl Into<PathBuf>, name: impl Into<String>) -> Self {
        CacheConfig {
            backend,
            root: root.into(),
            name: name.into(),
            options: Map::new(),
            sources: None,
            create_root: false,
            on_stale: OnStale::Error,
            remote: None,
            read_only: false,
        }
    }

    /// Sets a backend option.
    pub fn option(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.options.insert(key.to_owned(), value.into());
        self
    }

    /// Sets the source files of the fingerprint.
    pub fn sources(mut self, sources: SourcesConfig) -> Self {
        self.sources = Some(sources);
        self
    }

    /// Creates the root when missing.
    pub fn create_root(mut self, yes: bool) -> Self {
        self.create_root = yes;
        self
    }

    /// Sets the stale policy.
    pub fn on_stale(mut self, policy: OnStale) -> Self {
        self.on_stale = policy;
        self
    }

    /// Opens the cache for reading only ([`read_only`](Self::read_only)).
    pub fn read_only(mut self, yes: bool) -> Self {
        self.read_only = yes;
        self
    }

    /// Sets how a URL root is read locally.
    pub fn remote(mut self, remote: TierOptions) -> Self {
        self.remote = Some(remote);
        self
    }

    /// Parses a JSON config.
    pub fn from_json(text: &str) -> Result<CacheConfig> {
        serde_json::from_str(text).map_err(|e| FacadeError::Config(e.to_string()))
    }

    /// Reads and parses a JSON config file.
    pub fn from_file(path: &Path) -> Result<CacheConfig> {
        let text = std::fs::read_to_string(path).map_err(FacadeError::io("read", path))?;
        serde_json::from_str(&text)
            .map_err(|e| FacadeError::Config(format!("{}: {e}", path.display())))
    }

    /// What the cache is keyed and fingerprinted by:
    /// [`fingerprint::cache_identity`]`(backend, name, options)` — the same
    /// value memmap-array's `open_or_build` uses.
    pub fn identity(&self) -> Result<Value> {
        Ok(cache_identity(
            self.backend.name(),
            &self.name,
            &self.options,
        )?)
    }

    /// The cache key: backend, name and options, canonically hashed.
    pub fn key(&self) -> Result<CacheKey> {
        Ok(compute_key(&self.identity()?)?)
    }

    /// `root/<name>/<key>`, after checking that the name is one plain path
    /// component (so no config can point outside its root).
    pub fn cache_dir(&self) -> Result<PathBuf> {
        named_cache_dir(&self.root, &self.name, &self.identity()?).map_err(|e| match e {
            fingerprint::FingerprintError::InvalidName(_) => FacadeError::Config(e.to_string()),
            other => other.into(),
        })
    }

    /// Typed option lookup with a default; a present option of the wrong
    /// type is an error naming it.
    pub(crate) fn opt<T: serde::de::DeserializeOwned>(&self, key: &str, default: T) -> Result<T> {
        match self.options.get(key) {
            None => Ok(default),
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
                FacadeError::Config(format!("option {key:?} of {}: {e}", self.backend.name()))
            }),
        }
    }

    /// Fails on options the backend does not know (a typo would otherwise
    /// silently make a new cache key).
    pub(crate) fn check_options(&self, known: &[&str]) -> Result<()> {
        match self.options.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(FacadeError::Config(format!(
                "unknown option {k:?} for {} (known: {})",
                self.backend.name(),
                known.join(", ")
            ))),
        }
    }
}
