//! A config whose `root` is a URL: the cache lives in object storage at
//! `<root>/<name>/<key>` and is opened, as any cache, from a local working
//! directory that `remote-cache` keeps in step with it (every published
//! commit applied on open; [`CacheBackend::flush`] publishes what was
//! written since, and so does dropping the backend, or the process's
//! exit through [`remote_cache::publish_all_at_exit`], after
//! the store flushed what it held: see [`remote_cache::Publisher`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use remote_cache::{CacheDir, Location, StoreKind, is_url, redact_url};
use remote_cache::{Publish, Publisher};

use crate::{
    Cache, CacheBackend, CacheConfig, FacadeError, Lookup, Operation, Result, Stats, Value,
};

/// The local config and the commit log of a config whose root is a URL,
/// or `None` for a local root: the cache at `<root>/<name>/<key>` opened
/// by remote-cache's one road, in a working directory of this handle's
/// own over the machine's shared tier.
pub(crate) fn localize(config: &CacheConfig) -> Result<Option<(CacheConfig, CacheDir)>> {
    let Some(root) = config.root.to_str().filter(|r| is_url(r)) else {
        return Ok(None);
    };
    let remote_err = |e: remote_cache::Error| FacadeError::Remote(Box::new(e));
    let options = config.remote.clone().unwrap_or_default();
    let location = Location::parse_with(root, &options).map_err(remote_err)?;
    // The cache's place under the root is the same in every working
    // directory: it is known before one is picked.
    let mut probe = config.clone();
    probe.root = PathBuf::new();
    let rel = relative(&probe.cache_dir()?, &probe.root);
    let opened = location.open_dir_under(&rel, None).map_err(remote_err)?;
    let mut local = config.clone();
    local.create_root = true;
    local.root = opened.root().to_path_buf();
    // The working directory is this handle's own: no writer lock to spare.
    local.read_only = false;
    Ok(Some((local, opened)))
}

fn relative(dir: &Path, root: &Path) -> String {
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// A backend opened from a working directory, publishing on flush and
/// when dropped.
pub(crate) struct RemoteBackend {
    // Dropped before the commit log: the store's files stay while it lives.
    inner: Arc<dyn CacheBackend>,
    // After the store (whose drop flushes it): the last publish. No
    // background publishes: a memmap-array or page-alloc build is
    // consistent only once finished, which its flush or drop is.
    _publisher: Publisher,
    remote: Arc<CacheDir>,
}

impl RemoteBackend {
    pub(crate) fn new(inner: Cache, remote: CacheDir) -> RemoteBackend {
        let inner: Arc<dyn CacheBackend> = Arc::from(inner);
        let remote = Arc::new(remote);
        let shown = remote.remote().map_or_else(
            || remote.path().display().to_string(),
            |r| redact_url(r.tier().url()),
        );
        let (store, dir) = (Arc::downgrade(&inner), Arc::clone(&remote));
        let publisher = Publisher::start(shown, None, move |step| {
            // At the process's exit the store is still open: it flushes
            // first, as its drop would have.
            if let (Publish::Last, Some(store)) = (step, store.upgrade()) {
                store.flush()?;
            }
            dir.publish()?;
            Ok(())
        });
        RemoteBackend {
            inner,
            _publisher: publisher,
            remote,
        }
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
    fn kind(&self) -> StoreKind {
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
