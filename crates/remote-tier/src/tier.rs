//! [`RemoteTier`]: an object store URL read through the local tier, and
//! the upload path.

use std::fs::File;
use std::future::Future;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, PutMode, PutOptions, PutPayload};
use tokio::sync::Semaphore;

use crate::blocks::BlockHashes;
use crate::error::BlockMismatch;
use crate::file::{ObjectState, RemoteFile, map_fits};
use crate::format::{self, BlockMap};
use crate::local::{EvictReport, LocalDir};
use crate::location::{build_store, redact};
use crate::remote::{Failure, Remote, RetryPolicy};
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

/// The shared state behind a [`RemoteTier`] and its open files.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) remote: Remote,
    pub(crate) dir: LocalDir,
    pub(crate) config: TierConfig,
    /// The process's request runtime (see [`crate::shared`]).
    runtime: Arc<tokio::runtime::Runtime>,
    pub(crate) prefetch: Arc<Semaphore>,
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
        let (store, prefix) = build_store(url, options)?;
        let shown = url::Url::parse(url).map(|u| redact(&u)).unwrap_or_default();
        RemoteTier::with_store(store, prefix, &shown, config)
    }

    /// A tier over a store built by the caller (a wrapper, a test double of
    /// the network): objects live under `prefix`, errors show `url`.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        url: &str,
        config: TierConfig,
    ) -> Result<RemoteTier> {
        let runtime = crate::shared::runtime()?;
        let dir = LocalDir::open(&config.cache_dir)?;
        let prefetch = Arc::new(Semaphore::new(config.parallelism.max(1)));
        let mut config = config;
        config.block_size = config.block_size.max(1);
        config.part_size = config.part_size.max(5 << 20);
        Ok(RemoteTier {
            inner: Arc::new(Inner {
                remote: Remote {
                    store,
                    prefix,
                    url: url.into(),
                    retry: config.retry,
                },
                dir,
                config,
                runtime,
                prefetch,
            }),
        })
    }

    /// The URL (without credentials).
    pub fn url(&self) -> &str {
        &self.inner.remote.url
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
        let remote = self.inner.remote.clone();
        let path = if prefix.is_empty() {
            remote.prefix.clone()
        } else {
            remote.path(prefix)?
        };
        let r = remote.clone();
        let listed = self.inner.block_on(async move {
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
        let remote = self.inner.remote.clone();
        let path = remote.path(prefix)?;
        let offset = remote.path(after)?;
        let r = remote.clone();
        let listed = self.inner.block_on(async move {
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
        RemoteFile::open(&self.inner, name, &Expected::default(), None)
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
        RemoteFile::open(&self.inner, name, &Expected::default(), Some(hashes))
    }

    /// Fetches all of `name` into the local tier (blocks in parallel) and
    /// checks it against `expected`: a copy that does not match is removed
    /// and reported as [`Error::Corrupt`].
    pub fn fetch(&self, name: &str, expected: &Expected) -> Result<RemoteFile> {
        let file = RemoteFile::open(&self.inner, name, expected, None)?;
        file.ensure(0..file.len())?;
        file.verify(expected)?;
        Ok(file)
    }

    /// Reads the object `name` straight from the store, bypassing the local
    /// tier: for small records that are read fresh (commit records).
    pub fn read_remote(&self, name: &str) -> Result<Bytes> {
        let remote = self.inner.remote.clone();
        let path = remote.path(name)?;
        let r = remote.clone();
        let got = self.inner.block_on(async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                async move {
                    store
                        .get_opts(&path, GetOptions::default())
                        .await?
                        .bytes()
                        .await
                }
            })
            .await
        })?;
        got.map(|(b, _)| b)
            .map_err(|(f, n)| remote.error(name, "get", f, n))
    }

    /// Uploads `bytes` as the immutable object `name` (retried: putting the
    /// same bytes again is harmless).
    pub fn put_bytes(&self, name: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let bytes: Bytes = bytes.into();
        let remote = self.inner.remote.clone();
        let path = remote.path(name)?;
        let r = remote.clone();
        let put = self.inner.block_on(async move {
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
        let remote = self.inner.remote.clone();
        let target = remote.path(name)?;
        let attempts = remote.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.multipart_once(&file, path, &target, size) {
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
        file: &File,
        path: &Path,
        target: &ObjectPath,
        size: u64,
    ) -> std::result::Result<(), MultipartError> {
        let store = Arc::clone(&self.inner.remote.store);
        let timeout = self.inner.remote.retry.request_timeout;
        let part = self.inner.config.part_size;
        let in_flight = self.inner.config.parallelism.max(1);
        let target = target.clone();
        let file = file
            .try_clone()
            .map_err(|e| MultipartError::Local(Error::io("open", path)(e)))?;
        let path = path.to_path_buf();
        self.inner
            .block_on(async move {
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
    /// A failed attempt is retried; when a retry finds the name taken, the
    /// record there is compared with `bytes`, so an earlier attempt that
    /// landed but whose answer was lost counts as this writer's. Records
    /// should therefore name their writer (a unique token) so that two
    /// writers never send identical bytes.
    pub fn commit(&self, name: &str, bytes: impl Into<Bytes>) -> Result<()> {
        let bytes: Bytes = bytes.into();
        let remote = self.inner.remote.clone();
        let path = remote.path(name)?;
        let r = remote.clone();
        let ours = bytes.clone();
        let put = self.inner.block_on(async move {
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
        match put {
            Ok(_) => Ok(()),
            Err((Failure::Store(object_store::Error::AlreadyExists { .. }), n)) if n > 1 => {
                if self.read_remote(name)? == ours {
                    Ok(())
                } else {
                    Err(Error::CommitTaken {
                        url: remote.url.to_string(),
                        name: name.to_string(),
                    })
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
    /// Runs `fut` on the tier's runtime and waits for it on this thread.
    pub(crate) fn block_on<T, F>(&self, fut: F) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv()
            .map_err(|_| Error::Runtime("a request task stopped before answering".into()))
    }

    /// Runs `job` on the runtime's blocking threads, detached.
    pub(crate) fn spawn_blocking(&self, job: impl FnOnce() + Send + 'static) {
        self.runtime.spawn_blocking(job);
    }

    pub(crate) fn head(&self, name: &str) -> Result<ObjectInfo> {
        let remote = self.remote.clone();
        let path = remote.path(name)?;
        let r = remote.clone();
        let got = self.block_on(async move {
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

    /// Gets `range` of `name` (all of it for `None`), requiring the etag
    /// `if_match` when given; checks the length that came back.
    pub(crate) fn get(
        &self,
        name: &str,
        range: Option<std::ops::Range<u64>>,
        if_match: Option<String>,
    ) -> Result<(Bytes, u64)> {
        let remote = self.remote.clone();
        let path = remote.path(name)?;
        let r = remote.clone();
        let want = range.clone();
        let got = self.block_on(async move {
            r.retrying(true, || {
                let store = Arc::clone(&r.store);
                let path = path.clone();
                let opts = GetOptions {
                    range: want.clone().map(GetRange::Bounded),
                    if_match: if_match.clone(),
                    ..GetOptions::default()
                };
                async move {
                    let got = store.get_opts(&path, opts).await?;
                    let size = got.meta.size;
                    Ok((got.bytes().await?, size))
                }
            })
            .await
        })?;
        let ((bytes, size), _) = got.map_err(|(f, n)| remote.error(name, "get", f, n))?;
        let expect = match &range {
            Some(r) => r.end - r.start,
            None => size,
        };
        if bytes.len() as u64 != expect {
            return Err(Error::Corrupt {
                url: remote.url.to_string(),
                name: name.to_string(),
                problem: format!("asked for {expect} bytes, the store sent {}", bytes.len()),
            });
        }
        Ok((bytes, size))
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
        // A block that does not match is fetched once more, as by blocks.
        let mut retried = false;
        let bytes = loop {
            let (bytes, _) = self.get(name, None, None)?;
            check(&self.remote.url, name, &bytes, expected)?;
            let bad = hashes.and_then(|h| {
                (0..h.blocks()).find_map(|i| {
                    let r = h.range(i);
                    let block = bytes.get(r.start as usize..r.end as usize);
                    let (good, got) = h.check_block(i, block.unwrap_or_default());
                    (!good).then_some((h, i, got))
                })
            });
            match bad {
                None => break bytes,
                Some(_) if !retried => retried = true,
                Some((h, i, got)) => {
                    return Err(block_mismatch(&self.remote.url, name, &dest, h, i, got));
                }
            }
        };
        let tmp = durable_fs::unique_temp_path(&self.dir.tmp, key);
        durable_fs::write_synced(&tmp, &bytes)?;
        if let Err(e) = durable_fs::rename_and_sync(&tmp, &dest) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        self.after_fetch()
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
                url: self.remote.url.to_string(),
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
        let mut bytes = self.get(&obj.name, Some(range.clone()), etag.clone())?.0;
        if let Some(h) = &obj.hashes {
            // Checked before a byte is written: a bad block never reaches
            // the local file. One more fetch absorbs a corruption in
            // transit; a second mismatch is the store's bytes.
            let (good, _) = h.check_block(i, &bytes);
            if !good {
                bytes = self.get(&obj.name, Some(range.clone()), etag)?.0;
                let (good, got) = h.check_block(i, &bytes);
                if !good {
                    return Err(block_mismatch(
                        &self.remote.url,
                        &obj.name,
                        &obj.path,
                        h,
                        i,
                        got,
                    ));
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

/// Checks fetched bytes against what the caller knows of them.
fn check(url: &str, name: &str, bytes: &[u8], expected: &Expected) -> Result<()> {
    let corrupt = |problem: String| Error::Corrupt {
        url: url.to_string(),
        name: name.to_string(),
        problem,
    };
    if let Some(size) = expected.size
        && bytes.len() as u64 != size
    {
        return Err(corrupt(format!("{} bytes, expected {size}", bytes.len())));
    }
    if let Some(hash) = expected.blake3
        && blake3::hash(bytes).as_bytes() != &hash
    {
        return Err(corrupt("BLAKE3 mismatch".into()));
    }
    Ok(())
}
