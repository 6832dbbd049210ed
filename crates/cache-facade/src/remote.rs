//! A config whose `root` is a URL: the cache lives in object storage at
//! `<root>/<name>/<key>` and is opened, as any cache, from a local working
//! directory that `remote-cache` keeps in step with it (every published
//! commit applied on open; [`CacheBackend::flush`] publishes what was
//! written since).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use remote_cache::{Location, RemoteDir, is_url, open_in_work_dir};
use remote_tier::RemoteTier;
use serde::{Deserialize, Serialize};

use crate::{
    BackendKind, Cache, CacheBackend, CacheConfig, FacadeError, Lookup, Operation, Result, Stats,
    Value,
};

/// How a config with a URL root reads it locally. Not part of the key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// The local tier directory (default: `CACHEX_TIER_DIR`, else
    /// `~/.cache/cachex/tier`), shared by every cache and process.
    #[serde(default)]
    pub tier_dir: Option<PathBuf>,
    /// The local tier's budget in bytes (default: `CACHEX_TIER_BUDGET`,
    /// else 20 GiB).
    #[serde(default)]
    pub tier_budget: Option<u64>,
    /// `object_store` options such as `aws_endpoint`, `aws_region`,
    /// `aws_allow_http`. Credentials belong in the environment
    /// (`AWS_ACCESS_KEY_ID`, ...), not in a config file.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// The local config and the commit log of a config whose root is a URL,
/// or `None` for a local root.
pub(crate) fn localize(config: &CacheConfig) -> Result<Option<(CacheConfig, RemoteDir)>> {
    let Some(root) = config.root.to_str().filter(|r| is_url(r)) else {
        return Ok(None);
    };
    let remote_err = |e: remote_cache::Error| FacadeError::Remote(Box::new(e));
    let Location::Remote(mut spec) = Location::parse(root).map_err(remote_err)? else {
        return Ok(None);
    };
    if let Some(r) = &config.remote {
        if let Some(d) = &r.tier_dir {
            spec.tier.cache_dir = d.clone();
        }
        if let Some(b) = r.tier_budget {
            spec.tier.budget_bytes = b;
        }
        spec.options
            .extend(r.options.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    // The cache's place under the root is the same in every working
    // directory: its URL is known before one is picked.
    let mut probe = config.clone();
    probe.root = PathBuf::new();
    let rel = relative(&probe.cache_dir()?, &probe.root);
    let url = format!("{}/{rel}", root.trim_end_matches('/'));
    let tier = RemoteTier::open_with_options(&url, spec.options.clone(), spec.tier.clone())
        .map_err(|e| remote_err(e.into()))?;
    // A working directory of this process's own (another process on the
    // machine may hold the first), over the one shared tier.
    let mut local = config.clone();
    local.create_root = true;
    let opened = open_in_work_dir(&spec.tier.cache_dir, root, |work| {
        let mut candidate = config.clone();
        candidate.root = work.to_path_buf();
        candidate.create_root = true;
        let dir = candidate
            .cache_dir()
            .map_err(|e| remote_cache::Error::BadLocation {
                root: work.display().to_string(),
                problem: e.to_string(),
            })?;
        RemoteDir::open(tier.clone(), &dir, |_, _| false, |_| false)
    })
    .map_err(remote_err)?;
    let (work, remote) = opened;
    local.root = work;
    Ok(Some((local, remote)))
}

fn relative(dir: &Path, root: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// A backend opened from a working directory, publishing on flush.
pub(crate) struct RemoteBackend {
    // Dropped before the commit log: the store's files stay while it lives.
    inner: Cache,
    remote: RemoteDir,
}

impl RemoteBackend {
    pub(crate) fn new(inner: Cache, remote: RemoteDir) -> RemoteBackend {
        RemoteBackend { inner, remote }
    }

    /// Publishes what the backend wrote (a build, flushed puts).
    pub(crate) fn publish(&self) -> Result<()> {
        self.remote
            .publish()
            .map(|_| ())
            .map_err(|e| FacadeError::Remote(Box::new(e)))
    }
}

impl CacheBackend for RemoteBackend {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn supports(&self, op: Operation) -> bool {
        self.inner.supports(op)
    }
    fn get_batch(&self, keys: &[&str]) -> Result<Lookup> {
        self.inner.get_batch(keys)
    }
    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        self.inner.get_indices(indices)
    }
    fn put_batch(&self, items: Vec<(String, Value)>) -> Result<()> {
        self.inner.put_batch(items)
    }
    fn prefetch(&self, indices: &[i64]) {
        self.inner.prefetch(indices)
    }
    /// Flushes the store, then publishes what it wrote since.
    fn flush(&self) -> Result<()> {
        self.inner.flush()?;
        self.publish()
    }
    fn len(&self) -> Result<u64> {
        self.inner.len()
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
    fn path(&self) -> &Path {
        self.inner.path()
    }
}
