//! [`RemoteTier`]: an object store URL read through the local tier, and
//! the upload path.

use std::fs::File;
use std::future::Future;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use tokio::sync::Semaphore;

use crate::blocks::BlockHashes;
use crate::error::BlockMismatch;
use crate::file::{ObjectState, RemoteFile, map_fits};
use crate::format::{self, BlockMap};
use crate::local::{EvictReport, LocalDir};
use crate::location::{build_store, redact_url};
use crate::remote::{Failure, Remote, RetryPolicy, WAIT_SLACK};
use crate::{Error, Result};

/// 8 MiB: the default block of a block-fetched object and part of a
/// multipart upload (S3 parts are at least 5 MiB).
pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;

/// How a [`RemoteTier`] uses its local directory and the network.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The local tier: fetched copies, block maps, locks. Several
    /// processes may share one.
    pub cache_dir: PathBuf,
    /// Bytes the local tier may hold before least-recently-used copies
    /// are evicted. Objects open in some reader are kept even over budget.
    pub budget_bytes: u64,
    /// Large objects are fetched in blocks of this many bytes (those
    /// opened with a block list, in the list's block size), and a
    /// publisher records block lists in blocks of this size.
    pub block_size: u64,
    /// Objects up to this size are fetched whole (one request).
    pub whole_file_max: u64,
    /// Blocks fetched ahead of a read, in the background.
    pub prefetch_blocks: u64,
    /// Requests in flight at once for one call (a whole-object fetch, a
    /// multipart upload) and, separately, for all prefetches of the tier.
    pub parallelism: usize,
    /// Files larger than this are uploaded in parts of this size.
    pub part_size: u64,
    /// Timeouts and retries of requests.
    pub retry: RetryPolicy,
    /// Only one writer ever publishes to this URL: commit records are
    /// written even where the server does not honour conditional puts
    /// (which are then not needed to keep two writers apart). Off by
    /// default: [`RemoteTier::commit`] first checks, once per tier, that
    /// the server refuses a second put-if-absent of one name, and
    /// refuses to publish ([`Error::ConditionalPutIgnored`]) where it
    /// does not.
    pub single_publisher: bool,
}

impl TierConfig {
    /// The defaults (8 MiB blocks, 4 blocks of prefetch, 8 requests in
    /// flight) for a local tier at `cache_dir` of at most `budget_bytes`.
    pub fn new(cache_dir: impl Into<PathBuf>, budget_bytes: u64) -> TierConfig {
        TierConfig {
            cache_dir: cache_dir.into(),
            budget_bytes,
            block_size: DEFAULT_BLOCK_SIZE,
            whole_file_max: DEFAULT_BLOCK_SIZE,
            prefetch_blocks: 4,
            parallelism: 8,
            part_size: DEFAULT_BLOCK_SIZE,
            retry: RetryPolicy::default(),
            single_publisher: false,
        }
    }
}

/// What the caller knows of an object, checked on fetch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expected {
    /// Its size in bytes.
    pub size: Option<u64>,
    /// Its BLAKE3 hash, where the format records one.
    pub blake3: Option<[u8; 32]>,
}

/// An object in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Its name relative to the tier's URL.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its entity tag, where the store gives one.
    pub e_tag: Option<String>,
}

/// Where the conditional-put probe objects go under the URL (each
/// removed after its probe).
pub const PROBE_DIR: &str = "_cachex_probe";

/// The shared state behind a [`RemoteTier`] and its open files.
#[derive(Debug)]
pub(crate) struct Inner {
    /// The URL as shown in errors (no credentials).
    pub(crate) url: Arc<str>,
    /// The store and its request slots, as of the process that made them.
    conn: Mutex<Conn>,
    /// How to build the store again in a forked child.
    rebuild: Option<Rebuild>,
    pub(crate) dir: LocalDir,
    pub(crate) config: TierConfig,
    /// Whether the server was seen to refuse a second put-if-absent.
    conditional_checked: Mutex<bool>,
}

/// The store of one process: a forked child makes its own.
#[derive(Debug)]
struct Conn {
    pid: u32,
    remote: Remote,
    prefetch: Arc<Semaphore>,
}

/// The URL and options a tier opened by URL was built from. Shown
/// without the URL's credentials or the options' values.
struct Rebuild {
    url: String,
    options: Vec<(String, String)>,
}

impl std::fmt::Debug for Rebuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Rebuild")
            .field("option_keys", &keys)
            .finish()
    }
}

/// An object store URL read through a bounded local disk tier.
///
/// Every call blocks the calling thread; the network work runs on a
/// runtime that every tier of the process shares, so callers need no async runtime (and may
/// call from inside one's blocking threads).
#[derive(Debug, Clone)]
pub struct RemoteTier {
    inner: Arc<Inner>,
}

impl RemoteTier {
    /// Opens `url` (`s3://bucket/prefix`, `gs://…`, `az://…`, `file:///…`,
    /// `memory:///`, `https://…`) with credentials and endpoints from the
    /// environment (see [`build_store`]).
    pub fn open(url: &str, config: TierConfig) -> Result<RemoteTier> {
        RemoteTier::open_with_options(url, Vec::<(String, String)>::new(), config)
    }

    /// [`RemoteTier::open`] with store options (`object_store` keys, e.g.
    /// `aws_endpoint`, `aws_allow_http`) over the environment's.
    pub fn open_with_options<I, K, V>(
        url: &str,
        options: I,
        config: TierConfig,
    ) -> Result<RemoteTier>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let options: Vec<(String, String)> = options
            .into_iter()
            .map(|(k, v)| (k.as_ref().to_string(), v.into()))
            .collect();
        let (store, prefix) = build_store(url, options.clone())?;
        let shown = redact_url(url);
        let mut tier = RemoteTier::with_store(store, prefix, &shown, config)?;
        if let Some(inner) = Arc::get_mut(&mut tier.inner) {
            inner.rebuild = Some(Rebuild {
                url: url.to_string(),
                options,
            });
        }
        Ok(tier)
    }

    /// A tier over a store built by the caller (a wrapper, a test double of
    /// the network): objects live under `prefix`, errors show `url`. A
    /// forked child keeps using this store as it is (a tier opened by URL
    /// builds its own there), so a store whose connections belong to the
    /// parent's runtime answers a child only within the tier's timeouts.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        url: &str,
        config: TierConfig,
    ) -> Result<RemoteTier> {
        crate::shared::runtime()?;
        let dir = LocalDir::open(&config.cache_dir, config.retry.call_timeout())?;
        let prefetch = Arc::new(Semaphore::new(config.parallelism.max(1)));
        let mut config = config;
        config.block_size = config.block_size.max(1);
        config.part_size = config.part_size.max(5 << 20);
        let url: Arc<str> = url.into();
        Ok(RemoteTier {
            inner: Arc::new(Inner {
                url: Arc::clone(&url),
                conn: Mutex::new(Conn {
                    pid: std::process::id(),
                    remote: Remote {
                        store,
                        prefix,
                        url,
                        retry: config.retry,
                    },
                    prefetch,
                }),
                rebuild: None,
                dir,
                config,
                conditional_checked: Mutex::new(false),
            }),
        })
    }

    /// The URL (without credentials).
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// How the tier was configured.
    pub fn config(&self) -> &TierConfig {
        &self.inner.config
    }

    /// The local tier directory.
    pub fn cache_dir(&self) -> &Path {
        &self.inner.dir.root
    }

    /// The object `name`'s size and etag, from the store.
    pub fn head(&self, name: &str) -> Result<ObjectInfo> {
        self.inner.head(name)
    }

    /// Every object whose name starts with the path `prefix` (`""` for
    /// all), from the store, sorted by name.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>> {
        let remote = self.inner.remote()?;
        let path = if prefix.is_empty() {
            remote.prefix.clone()
        } else {
            remote.path(prefix)?
        };
        let r = remote.clone();
        let listed = self.inner.block_on(prefix, "list", async move {
            r.retrying(true, || r.store.list(Some(&path)).try_collect::<Vec<_>>())
                .await
        })?;
        let (metas, _) = listed.map_err(|(f, n)| remote.error(prefix, "list", f, n))?;
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|m| ObjectInfo {
                name: remote.name_of(&m.location),
                size: m.size,
                e_tag: m.e_tag,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Objects under the path `prefix` whose names sort after `after`
    /// (a name under the same prefix), sorted by name: what was added
    /// since a reader last looked, without listing what it saw already
    /// (stores that cannot start a listing at an offset filter theirs).
    pub fn list_after(&self, prefix: &str, after: &str) -> Result<Vec<ObjectInfo>> {
        let remote = self.inner.remote()?;
        let path = remote.path(prefix)?;
        let offset = remote.path(after)?;
        let r = remote.clone();
        let listed = self.inner.block_on(prefix, "list", async move {
            r.retrying(true, || {
                r.store
                    .list_with_offset(Some(&path), &offset)
                    .try_collect::<Vec<_>>()
            })
            .await
        })?;
        let (metas, _) = listed.map_err(|(f, n)| remote.error(prefix, "list", f, n))?;
        let mut out: Vec<ObjectInfo> = metas
            .into_iter()
            .map(|m| ObjectInfo {
                name: remote.name_of(&m.location),
                size: m.size,
                e_tag: m.e_tag,
            })
            .filter(|o| o.name.as_str() > after)
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Opens the object `name` through the local tier: a small object is
    /// fetched whole now; a large one gets a sparse local file whose
    /// blocks [`RemoteFile::ensure`] fetches on demand.
    pub fn open_object(&self, name: &str) -> Result<RemoteFile> {
        RemoteFile::open(&self.inner, name, &Expected::default(), None, false)
    }

    /// [`open_object`](Self::open_object) for an object whose publisher
    /// recorded the BLAKE3 of each block: every block fetched is checked
    /// against its hash before it is kept (a mismatch is fetched once
    /// more, then reported as [`Error::BlockMismatch`] and never kept),
    /// and the sparse local file uses the list's block size, so reads stay
    /// zero-copy over one file. A local copy made without this list (or
    /// with another) is not trusted: the object gets a fresh sparse file.
    /// Warm reads of blocks already local hash nothing.
    pub fn open_verified(&self, name: &str, hashes: Arc<BlockHashes>) -> Result<RemoteFile> {
        RemoteFile::open(&self.inner, name, &Expected::default(), Some(hashes), false)
    }

    /// [`open_verified`](Self::open_verified) for an object read in small
    /// parts (a row here, a row there): left sparse whatever its size, so
    /// that a small object is not fetched whole on open either.
    pub fn open_by_blocks(&self, name: &str, hashes: Arc<BlockHashes>) -> Result<RemoteFile> {
        RemoteFile::open(&self.inner, name, &Expected::default(), Some(hashes), true)
    }

    /// Fetches all of `name` into the local tier (blocks in parallel) and
    /// checks it against `expected`: a copy that does not match is removed
    /// and reported as [`Error::Corrupt`].
    pub fn fetch(&self, name: &str, expected: &Expected) -> Result<RemoteFile> {
        let file = RemoteFile::open(&self.inner, name, expected, None, false)?;
        file.ensure(0..file.len())?;
        file.verify(expected)?;
        Ok(file)
    }

    /// Reads the object `name` straight from the store, bypassing the local
    /// tier, whatever its size: prefer
    /// [`read_remote_capped`](RemoteTier::read_remote_capped) for records
    /// whose format bounds their size.
    pub fn read_remote(&self, name: &str) -> Result<Bytes> {
        self.read_remote_capped(name, u64::MAX)
    }

    /// Reads the object `name` straight from the store, bypassing the local
    /// tier: for small records that are read fresh (commit records). An
    /// object larger than `cap` bytes is [`Error::TooLarge`], found from
    /// the answer's headers or, at the latest, once `cap + 1` bytes of its
    /// body arrived: never more than that is held in memory.
    pub fn read_remote_capped(&self, name: &str, cap: u64) -> Result<Bytes> {
        let remote = self.inner.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let got = self.inner.block_on(name, "get", async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                async move {
                    let got = store.get_opts(&path, GetOptions::default()).await?;
                    let size = got.meta.size;
                    if size > cap {
                        return Ok(Err(size));
                    }
                    crate::remote::collect_capped(got.into_stream(), cap).await
                }
            })
            .await
        })?;
        match got.map_err(|(f, n)| remote.error(name, "get", f, n))?.0 {
            Ok(bytes) => Ok(bytes),
            Err(seen) => Err(Error::TooLarge {
                url: remote.url.to_string(),
                name: name.to_string(),
                seen,
                cap,
            }),
        }
    }

    /// Uploads `bytes` as the immutable object `name` (retried: putting the
    /// same bytes again is harmless).
    pub fn put_bytes(&self, name: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let bytes: Bytes = bytes.into();
        let remote = self.inner.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let put = self.inner.block_on(name, "put", async move {
            r.retrying(true, || {
                let payload = PutPayload::from(bytes.clone());
                r.store.put_opts(&path, payload, PutOptions::default())
            })
            .await
        })?;
        put.map(|_| ())
            .map_err(|(f, n)| remote.error(name, "put", f, n))
    }

    /// Uploads the local file `path` as the immutable object `name`: one
    /// request up to [`TierConfig::part_size`], a multipart upload above
    /// (parts in parallel; a failed upload is aborted and started again).
    /// The local file is only read: the tier never holds the only copy.
    /// Returns the bytes uploaded.
    pub fn put_file(&self, name: &str, path: &Path) -> Result<u64> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let size = file.metadata().map_err(Error::io("stat", path))?.len();
        if size <= self.inner.config.part_size {
            let mut bytes = Vec::with_capacity(size as usize);
            (&file)
                .take(size)
                .read_to_end(&mut bytes)
                .map_err(Error::io("read", path))?;
            if bytes.len() as u64 != size {
                return Err(Error::io("read", path)(
                    std::io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            self.put_bytes(name, bytes)?;
            return Ok(size);
        }
        let remote = self.inner.remote()?;
        let target = remote.path(name)?;
        let attempts = remote.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.multipart_once(&remote, &file, path, &target, size) {
                Ok(()) => return Ok(size),
                Err(MultipartError::Local(e)) => return Err(e),
                Err(MultipartError::Remote(f)) => {
                    let permanent =
                        matches!(&f, Failure::Store(e) if !crate::remote::is_transient(e));
                    if permanent || attempt >= attempts {
                        return Err(remote.error(name, "multipart upload", f, attempt));
                    }
                }
            }
        }
    }

    /// One multipart upload of `file`.
    fn multipart_once(
        &self,
        remote: &Remote,
        file: &File,
        path: &Path,
        target: &ObjectPath,
        size: u64,
    ) -> std::result::Result<(), MultipartError> {
        let store = Arc::clone(&remote.store);
        let timeout = remote.retry.request_timeout;
        let part = self.inner.config.part_size;
        let in_flight = self.inner.config.parallelism.max(1);
        let target = target.clone();
        let file = file
            .try_clone()
            .map_err(|e| MultipartError::Local(Error::io("open", path)(e)))?;
        let path = path.to_path_buf();
        let name = remote.name_of(&target);
        // Every part is bounded by the request timeout, and so is the
        // whole upload: its parts in waves of `in_flight`, start and end.
        let waves = size.div_ceil(part).div_ceil(in_flight as u64);
        let bound = timeout
            .saturating_mul(u32::try_from(waves.saturating_add(2)).unwrap_or(u32::MAX))
            .saturating_add(WAIT_SLACK);
        self.inner
            .block_on_within(&name, "multipart upload", bound, async move {
                let mut upload = match tokio::time::timeout(
                    timeout,
                    store.put_multipart_opts(&target, Default::default()),
                )
                .await
                {
                    Ok(Ok(u)) => u,
                    Ok(Err(e)) => return Err(MultipartError::Remote(Failure::Store(e))),
                    Err(_) => return Err(MultipartError::Remote(Failure::Timeout)),
                };
                let mut parts = FuturesUnordered::new();
                let mut offset = 0u64;
                let mut failed = None;
                while offset < size && failed.is_none() {
                    let len = part.min(size - offset);
                    let mut chunk = vec![0u8; len as usize];
                    if let Err(e) = file.read_exact_at(&mut chunk, offset) {
                        failed = Some(MultipartError::Local(Error::io("read", &path)(e)));
                        break;
                    }
                    offset += len;
                    let put = upload.put_part(PutPayload::from(chunk));
                    parts.push(tokio::time::timeout(timeout, put));
                    while parts.len() >= in_flight || (offset >= size && !parts.is_empty()) {
                        match parts.next().await {
                            Some(Ok(Ok(()))) | None => {}
                            Some(Ok(Err(e))) => {
                                failed = Some(MultipartError::Remote(Failure::Store(e)));
                                break;
                            }
                            Some(Err(_)) => {
                                failed = Some(MultipartError::Remote(Failure::Timeout));
                                break;
                            }
                        }
                    }
                }
                if let Some(f) = failed {
                    drop(parts);
                    let _ = upload.abort().await;
                    return Err(f);
                }
                match tokio::time::timeout(timeout, upload.complete()).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(MultipartError::Remote(Failure::Store(e))),
                    Err(_) => Err(MultipartError::Remote(Failure::Timeout)),
                }
            })
            .map_err(MultipartError::Local)?
    }

    /// Writes the commit record `name` only if no object of that name
    /// exists (a conditional put, `PutMode::Create`): of two writers
    /// claiming one name exactly one succeeds, the other gets
    /// [`Error::CommitTaken`]. Upload the files it points to first.
    ///
    /// Before its first commit a tier checks that the server honours
    /// conditional puts (it puts one probe object under [`PROBE_DIR`]
    /// twice, and the second put must be refused); where it does not,
    /// publishing is refused with [`Error::ConditionalPutIgnored`] unless
    /// [`TierConfig::single_publisher`] says no other writer publishes.
    /// The record is read back once written: a name that holds other
    /// bytes was taken by another writer ([`Error::CommitTaken`]).
    ///
    /// A failed attempt is retried; when a retry finds the name taken, the
    /// record there is compared with `bytes`, so an earlier attempt that
    /// landed but whose answer was lost counts as this writer's. Records
    /// should therefore name their writer (a unique token) so that two
    /// writers never send identical bytes.
    pub fn commit(&self, name: &str, bytes: impl Into<Bytes>) -> Result<()> {
        self.inner.check_conditional_puts()?;
        let bytes: Bytes = bytes.into();
        let remote = self.inner.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let ours = bytes.clone();
        let put = self.inner.block_on(name, "commit", async move {
            r.retrying(true, || {
                let payload = PutPayload::from(bytes.clone());
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                };
                r.store.put_opts(&path, payload, opts)
            })
            .await
        })?;
        let taken = || Error::CommitTaken {
            url: remote.url.to_string(),
            name: name.to_string(),
        };
        let cap = ours.len() as u64;
        let is_ours = || match self.read_remote_capped(name, cap) {
            Ok(there) => Ok(there == ours),
            Err(Error::TooLarge { .. }) => Ok(false),
            Err(e) => Err(e),
        };
        match put {
            Ok(_) if is_ours()? => Ok(()),
            Ok(_) => Err(taken()),
            // Taken, maybe by this very put: the client repeats a request
            // whose answer was lost inside one attempt of ours, so even a
            // first attempt may find its own bytes there.
            Err((Failure::Store(object_store::Error::AlreadyExists { .. }), _)) => {
                if is_ours()? {
                    Ok(())
                } else {
                    Err(taken())
                }
            }
            Err((f, n)) => Err(remote.error(name, "commit", f, n)),
        }
    }

    /// Bytes the local tier holds on disk now (all processes sharing it).
    pub fn local_usage(&self) -> Result<u64> {
        self.inner.dir.usage()
    }

    /// Evicts least-recently-used copies until the local tier is within its
    /// budget (done after every fetch too).
    pub fn evict(&self) -> Result<EvictReport> {
        self.inner.dir.evict(self.inner.config.budget_bytes)
    }
}

/// Why one multipart upload failed.
enum MultipartError {
    Local(Error),
    Remote(Failure),
}

impl Inner {
    /// The store, as this process may use it: a forked child builds its
    /// own (the parent's connections and runtime are not there) and
    /// leaves the parent's alone (leaked, never closed: closing could
    /// write to a socket the parent still reads).
    pub(crate) fn remote(&self) -> Result<Remote> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let pid = std::process::id();
        if conn.pid != pid {
            if let Some(b) = &self.rebuild {
                let (store, _) = build_store(&b.url, b.options.clone())?;
                std::mem::forget(std::mem::replace(&mut conn.remote.store, store));
            }
            // Permits the parent's prefetches held are never given back here.
            conn.prefetch = Arc::new(Semaphore::new(self.config.parallelism.max(1)));
            conn.pid = pid;
        }
        Ok(conn.remote.clone())
    }

    /// The slots of background prefetches (this process's).
    pub(crate) fn prefetch_slots(&self) -> Arc<Semaphore> {
        if self.remote().is_err() {
            return Arc::new(Semaphore::new(0));
        }
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(&conn.prefetch)
    }

    /// Runs `fut` (the request `op` of `name`) on the process's runtime and
    /// waits for it on this thread, at most as long as the retry policy
    /// allows the request ([`RetryPolicy::call_timeout`]).
    pub(crate) fn block_on<T, F>(&self, name: &str, op: &'static str, fut: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        self.block_on_within(name, op, self.config.retry.call_timeout(), fut)
    }

    /// [`block_on`](Inner::block_on), waiting at most `bound`: past it the
    /// request is [`Error::NoAnswer`] (and is left to finish or time out
    /// on its own).
    pub(crate) fn block_on_within<T, F>(
        &self,
        name: &str,
        op: &'static str,
        bound: Duration,
        fut: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        // The runtime of this process: a forked child gets its own.
        let runtime = crate::shared::runtime()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv_timeout(bound) {
            Ok(v) => Ok(v),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::NoAnswer {
                url: self.url.to_string(),
                name: name.to_string(),
                op,
                waited: bound,
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Runtime(format!(
                "{}: {name}: {op}: the request task stopped before answering",
                self.url
            ))),
        }
    }

    /// Runs `job` on the runtime's blocking threads, detached.
    pub(crate) fn spawn_blocking(&self, job: impl FnOnce() + Send + 'static) {
        if let Ok(runtime) = crate::shared::runtime() {
            runtime.spawn_blocking(job);
        }
    }

    /// Checks, once per tier, that the server refuses a second
    /// put-if-absent of one name (see [`RemoteTier::commit`]).
    fn check_conditional_puts(&self) -> Result<()> {
        if self.config.single_publisher {
            return Ok(());
        }
        let mut checked = self
            .conditional_checked
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if *checked {
            return Ok(());
        }
        let name = format!("{PROBE_DIR}/{}", durable_fs::host_pid_token());
        let remote = self.remote()?;
        let path = remote.path(&name)?;
        let r = remote.clone();
        let outcome = self.block_on(&name, "conditional put probe", async move {
            let create = |body: &'static [u8]| {
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                };
                r.store.put_opts(&path, PutPayload::from_static(body), opts)
            };
            // Neither put is repeated: a retry would find the first one.
            r.retrying(false, || create(b"first")).await?;
            let second = r.retrying(false, || create(b"second")).await;
            // Best effort: a probe object left behind is only clutter.
            let _ = tokio::time::timeout(r.retry.request_timeout, r.store.delete(&path)).await;
            Ok(second)
        })?;
        let op = "conditional put probe";
        match outcome {
            Err((f, n)) => Err(remote.error(&name, op, f, n)),
            Ok(Err((Failure::Store(object_store::Error::AlreadyExists { .. }), _))) => {
                *checked = true;
                Ok(())
            }
            Ok(Ok(_)) => Err(Error::ConditionalPutIgnored {
                url: self.url.to_string(),
                probe: name,
            }),
            Ok(Err((f, n))) => Err(remote.error(&name, op, f, n)),
        }
    }

    pub(crate) fn head(&self, name: &str) -> Result<ObjectInfo> {
        let remote = self.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let got = self.block_on(name, "head", async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                async move {
                    let opts = GetOptions {
                        head: true,
                        ..GetOptions::default()
                    };
                    Ok(store.get_opts(&path, opts).await?.meta)
                }
            })
            .await
        })?;
        let (meta, _) = got.map_err(|(f, n)| remote.error(name, "head", f, n))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: meta.size,
            e_tag: meta.e_tag,
        })
    }

    /// Gets `range` of `name`, requiring the etag `if_match` when given;
    /// reads no more of the body than the range's length (a longer answer
    /// is [`Error::Corrupt`] as soon as it shows) and checks the length.
    pub(crate) fn get(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        if_match: Option<String>,
    ) -> Result<Bytes> {
        let remote = self.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let want = range.clone();
        let expect = range.end - range.start;
        let got = self.block_on(name, "get", async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                let opts = GetOptions {
                    range: Some(GetRange::Bounded(want.clone())),
                    if_match: if_match.clone(),
                    ..GetOptions::default()
                };
                async move {
                    let got = store.get_opts(&path, opts).await?;
                    crate::remote::collect_capped(got.into_stream(), expect).await
                }
            })
            .await
        })?;
        let (got, _) = got.map_err(|(f, n)| remote.error(name, "get", f, n))?;
        let sent = match &got {
            Ok(bytes) => bytes.len() as u64,
            Err(seen) => *seen,
        };
        match got {
            Ok(bytes) if sent == expect => Ok(bytes),
            _ => Err(Error::Corrupt {
                url: remote.url.to_string(),
                name: name.to_string(),
                problem: format!(
                    "asked for {expect} bytes, the store sent {}{sent}",
                    if sent > expect { "at least " } else { "" }
                ),
            }),
        }
    }

    /// Streams all of `name` into a new file at `tmp`, fsynced: at most
    /// `cap` bytes (an object that turns out larger is
    /// [`Error::TooLarge`] as soon as the excess arrives, and nothing more
    /// of it is read), hashed whole and, given a block size, by blocks.
    fn get_to_file(
        &self,
        name: &str,
        tmp: &Path,
        cap: u64,
        block_size: Option<u64>,
    ) -> Result<Streamed> {
        let remote = self.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let dest = tmp.to_path_buf();
        let got = self.block_on(name, "get", async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                let dest = dest.clone();
                async move {
                    let got = store.get_opts(&path, GetOptions::default()).await?;
                    let got_size = got.meta.size;
                    if got_size > cap {
                        return Ok(Streaming::TooLarge(got_size));
                    }
                    let mut body = got.into_stream();
                    // Each attempt starts the file afresh.
                    let out = match File::create(&dest) {
                        Ok(f) => f,
                        Err(e) => return Ok(Streaming::Io("create", e)),
                    };
                    let mut whole = blake3::Hasher::new();
                    let mut blocks = block_size.map(crate::blocks::BlockHasher::new);
                    let mut size = 0u64;
                    while let Some(chunk) = body.next().await {
                        let chunk = chunk?;
                        size += chunk.len() as u64;
                        if size > cap {
                            return Ok(Streaming::TooLarge(size));
                        }
                        if let Err(e) = out.write_all_at(&chunk, size - chunk.len() as u64) {
                            return Ok(Streaming::Io("write", e));
                        }
                        whole.update(&chunk);
                        if let Some(b) = &mut blocks {
                            b.update(&chunk);
                        }
                    }
                    if size != got_size {
                        return Ok(Streaming::Short(got_size, size));
                    }
                    if let Err(e) = out.sync_all() {
                        return Ok(Streaming::Io("fsync", e));
                    }
                    Ok(Streaming::Done(Streamed {
                        size,
                        blake3: *whole.finalize().as_bytes(),
                        blocks: blocks.map(|b| b.finalize()),
                    }))
                }
            })
            .await
        })?;
        match got.map_err(|(f, n)| remote.error(name, "get", f, n))?.0 {
            Streaming::Done(s) => Ok(s),
            Streaming::TooLarge(seen) => Err(Error::TooLarge {
                url: remote.url.to_string(),
                name: name.to_string(),
                seen,
                cap,
            }),
            Streaming::Io(op, e) => Err(Error::io(op, tmp)(e)),
            Streaming::Short(want, sent) => Err(Error::Corrupt {
                url: remote.url.to_string(),
                name: name.to_string(),
                problem: format!("asked for {want} bytes, the store sent {sent}"),
            }),
        }
    }

    /// Evicts when the local tier is over budget (after every fetch).
    pub(crate) fn after_fetch(&self) -> Result<()> {
        if self.dir.usage()? > self.config.budget_bytes {
            self.dir.evict(self.config.budget_bytes)?;
        }
        Ok(())
    }

    /// Fetches the small object `name` whole into `<key>.whole` (one
    /// fetcher machine-wide), verified against `expected` (and each block
    /// against `hashes`) before it is renamed into place.
    pub(crate) fn fetch_whole(
        &self,
        name: &str,
        key: &str,
        expected: &Expected,
        hashes: Option<&BlockHashes>,
    ) -> Result<()> {
        let dest = self.dir.whole(key);
        let _fetching = self.dir.fetch_lock(key, None)?;
        if dest.exists() {
            return Ok(());
        }
        // An object fetched whole is small: at most what the caller
        // expects, or the tier's whole-file size.
        let cap = expected.size.unwrap_or(self.config.whole_file_max);
        let tmp = durable_fs::unique_temp_path(&self.dir.tmp, key);
        let fetched = self.fetch_whole_to(name, &tmp, &dest, cap, expected, hashes);
        if let Err(e) = fetched {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        self.after_fetch()
    }

    /// [`fetch_whole`](Inner::fetch_whole)'s fetch into `tmp`, checked,
    /// then renamed to `dest`. A block that does not match is fetched once
    /// more, as by blocks.
    fn fetch_whole_to(
        &self,
        name: &str,
        tmp: &Path,
        dest: &Path,
        cap: u64,
        expected: &Expected,
        hashes: Option<&BlockHashes>,
    ) -> Result<()> {
        let mut retried = false;
        loop {
            let got = match self.get_to_file(name, tmp, cap, hashes.map(|h| h.block_size())) {
                // Larger than the caller knows it to be: not the object meant.
                Err(Error::TooLarge { seen, .. }) if expected.size.is_some() => {
                    return Err(Error::Corrupt {
                        url: self.url.to_string(),
                        name: name.to_string(),
                        problem: format!("{seen} bytes or more, expected {cap}"),
                    });
                }
                got => got?,
            };
            check(&self.url, name, got.size, &got.blake3, expected)?;
            let bad = hashes.and_then(|h| {
                let mine = got.blocks.as_ref().and_then(|b| b.as_ref().ok());
                (0..h.blocks()).find_map(|i| {
                    let have = mine.and_then(|m| m.hash(i)).copied().unwrap_or_default();
                    (h.hash(i) != Some(&have)).then_some((h, i, have))
                })
            });
            match bad {
                None => break,
                Some(_) if !retried => retried = true,
                Some((h, i, got)) => {
                    return Err(block_mismatch(&self.url, name, dest, h, i, got));
                }
            }
        }
        Ok(durable_fs::rename_and_sync(tmp, dest)?)
    }

    /// The block map of `key` on disk, if there is a valid one.
    pub(crate) fn read_map(&self, key: &str) -> Option<BlockMap> {
        let bytes = durable_fs::read_capped(&self.dir.map(key), format::MAX_MAP_BYTES).ok()?;
        BlockMap::decode(&bytes).ok()
    }

    /// The sparse file and block map of a large object, created (under the
    /// tier lock) unless another process did so first. An existing copy is
    /// used only if it was made under the same block list (`hashes`, or
    /// none); otherwise a fresh one replaces it, and handles still open on
    /// the old one keep their own file without touching the new map.
    pub(crate) fn sparse_file(
        &self,
        name: &str,
        key: &str,
        head: Option<ObjectInfo>,
        hashes: Option<&BlockHashes>,
    ) -> Result<(File, BlockMap)> {
        let sparse = self.dir.sparse(key);
        let open = |map: BlockMap| -> Result<Option<(File, BlockMap)>> {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&sparse)
            {
                Ok(f) => {
                    let len = f.metadata().map_err(Error::io("stat", &sparse))?.len();
                    Ok((len == map.size).then_some((f, map)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(Error::io("open", &sparse)(e)),
            }
        };
        let usable = |map: Option<BlockMap>| map.filter(|m| map_fits(m, hashes));
        if let Some(map) = usable(self.read_map(key))
            && let Some(found) = open(map)?
        {
            return Ok(found);
        }
        let info = match head {
            Some(info) => info,
            None => self.head(name)?,
        };
        if let Some(h) = hashes
            && h.size() != info.size
        {
            return Err(Error::Corrupt {
                url: self.url.to_string(),
                name: name.to_string(),
                problem: format!(
                    "{} bytes in the store, the block list covers {}",
                    info.size,
                    h.size()
                ),
            });
        }
        let _tier = self.dir.lock_tier()?;
        if let Some(map) = usable(self.read_map(key))
            && let Some(found) = open(map)?
        {
            return Ok(found);
        }
        let etag = info.e_tag.unwrap_or_default();
        let etag = if etag.len() > format::MAX_ETAG {
            String::new()
        } else {
            etag
        };
        let map = match hashes {
            Some(h) => BlockMap::new(h.block_size(), info.size, etag, Some(h.digest())),
            None => BlockMap::new(self.config.block_size, info.size, etag, None),
        };
        // The map goes last: a map always describes the sparse file beside it.
        let _ = durable_fs::remove_and_sync(&self.dir.map(key))?;
        let tmp = durable_fs::unique_temp_path(&self.dir.tmp, key);
        let file = durable_fs::create_temp(&tmp)?;
        file.set_len(info.size)
            .map_err(Error::io("size sparse file", &tmp))?;
        durable_fs::commit_temp(file, &tmp, &sparse)?;
        durable_fs::write_atomic(&self.dir.map(key), &map.encode())?;
        durable_fs::sync_parent_dir(&sparse)?;
        match open(map)? {
            Some(found) => Ok(found),
            None => Err(Error::io("open", &sparse)(
                std::io::ErrorKind::NotFound.into(),
            )),
        }
    }

    /// Fetches block `i` of `obj` unless it is present: one fetcher per
    /// block machine-wide; bytes fsynced before the block map says so.
    pub(crate) fn fetch_block(&self, obj: &ObjectState, i: u64) -> Result<()> {
        if obj.has(i) {
            return Ok(());
        }
        let _fetching = self.dir.fetch_lock(&obj.key, Some(i))?;
        obj.refresh();
        if obj.has(i) {
            return Ok(());
        }
        let (range, etag) = obj.block(i);
        let etag = (!etag.is_empty()).then_some(etag);
        let mut bytes = self.get(&obj.name, range.clone(), etag.clone())?;
        if let Some(h) = &obj.hashes {
            // Checked before a byte is written: a bad block never reaches
            // the local file. One more fetch absorbs a corruption in
            // transit; a second mismatch is the store's bytes.
            let (good, _) = h.check_block(i, &bytes);
            if !good {
                bytes = self.get(&obj.name, range.clone(), etag)?;
                let (good, got) = h.check_block(i, &bytes);
                if !good {
                    return Err(block_mismatch(&self.url, &obj.name, &obj.path, h, i, got));
                }
            }
        }
        obj.file
            .write_all_at(&bytes, range.start)
            .map_err(Error::io("write block", &obj.path))?;
        obj.file
            .sync_data()
            .map_err(Error::io("fsync", &obj.path))?;
        {
            let _tier = self.dir.lock_tier()?;
            obj.mark(i)?;
        }
        self.after_fetch()
    }
}

/// The error for block `i` of `name` whose bytes hash to `got`.
fn block_mismatch(
    url: &str,
    name: &str,
    path: &Path,
    hashes: &BlockHashes,
    i: u64,
    got: [u8; 32],
) -> Error {
    let hex = |h: [u8; 32]| blake3::Hash::from_bytes(h).to_hex().to_string();
    let range = hashes.range(i);
    Error::BlockMismatch(Box::new(BlockMismatch {
        url: url.to_string(),
        name: name.to_string(),
        path: path.to_path_buf(),
        block: i,
        start: range.start,
        end: range.end,
        expected: hashes.hash(i).map(|h| hex(*h)).unwrap_or_default(),
        got: hex(got),
    }))
}

/// Checks fetched bytes (their size and BLAKE3) against what the caller
/// knows of them.
fn check(url: &str, name: &str, size: u64, hash: &[u8; 32], expected: &Expected) -> Result<()> {
    let corrupt = |problem: String| Error::Corrupt {
        url: url.to_string(),
        name: name.to_string(),
        problem,
    };
    if let Some(want) = expected.size
        && size != want
    {
        return Err(corrupt(format!("{size} bytes, expected {want}")));
    }
    if let Some(want) = expected.blake3
        && hash != &want
    {
        return Err(corrupt("BLAKE3 mismatch".into()));
    }
    Ok(())
}

/// What one streamed fetch of a whole object found.
struct Streamed {
    size: u64,
    blake3: [u8; 32],
    /// Its blocks' hashes, when asked for (the error: they make no list).
    blocks: Option<std::result::Result<BlockHashes, String>>,
}

/// How one attempt of [`Inner::get_to_file`] ended, short of a store error.
enum Streaming {
    Done(Streamed),
    TooLarge(u64),
    /// The object's size, and the bytes its body had.
    Short(u64, u64),
    Io(&'static str, std::io::Error),
}
