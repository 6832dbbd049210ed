//! [`RemoteTier`]: an object store URL read through the local tier, and
//! the upload path.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use tokio::sync::Semaphore;

use crate::blocks::BlockHashes;
use crate::config::TierConfig;
use crate::constants::WAIT_SLACK;
use crate::engine::{Conn, Expected, Inner, ObjectInfo, Rebuild};
use crate::file::RemoteFile;
use crate::local::{EvictReport, LocalDir};
use crate::pins::Claim;
use crate::remote::{Failure, Remote};
use crate::state::TierStats;
use crate::store_url::{build_store, redact_url};
use crate::{Error, Result};

/// An object store URL read through a bounded local disk tier.
///
/// Every call blocks the calling thread; the network work runs on a
/// runtime that every tier of the process shares, so callers need no async runtime (and may
/// call from inside one's blocking threads).
#[derive(Debug, Clone)]
pub struct RemoteTier {
    pub(crate) inner: Arc<Inner>,
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
        let dir = LocalDir::open(&config.tier_dir, config.retry.call_timeout())?;
        // After the open's check: a damaged header it repaired would lose it.
        dir.state.record_budget(config.tier_budget);
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
    pub fn tier_dir(&self) -> &Path {
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
                last_modified: m.last_modified.into(),
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
                last_modified: m.last_modified.into(),
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
        RemoteFile::open(&self.inner, name, &Expected::default(), None, false, false)
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
        RemoteFile::open(
            &self.inner,
            name,
            &Expected::default(),
            Some(hashes),
            false,
            false,
        )
    }

    /// [`open_verified`](Self::open_verified) for an object read in small
    /// parts (a row here, a row there): left sparse whatever its size, so
    /// that a small object is not fetched whole on open either.
    pub fn open_by_blocks(&self, name: &str, hashes: Arc<BlockHashes>) -> Result<RemoteFile> {
        RemoteFile::open(
            &self.inner,
            name,
            &Expected::default(),
            Some(hashes),
            true,
            false,
        )
    }

    /// Opens the object `name` for reads that lease the bytes they use
    /// ([`RemoteFile::lease`]): sparse and fetched by blocks whatever its
    /// size, and while it is open eviction may free (hole-punch) any of
    /// its blocks that no lease holds, so a copy larger than the budget
    /// stays within it. Map only what a lease covers, for as long as it
    /// lives: freed bytes read as zeros. With `hashes`, as
    /// [`open_verified`](Self::open_verified).
    pub fn open_leased(&self, name: &str, hashes: Option<Arc<BlockHashes>>) -> Result<RemoteFile> {
        RemoteFile::open(&self.inner, name, &Expected::default(), hashes, true, true)
    }

    /// Fetches all of `name` into the local tier (blocks in parallel) and
    /// checks it against `expected`: a copy that does not match is removed
    /// and reported as [`Error::Corrupt`].
    pub fn fetch(&self, name: &str, expected: &Expected) -> Result<RemoteFile> {
        let file = RemoteFile::open(&self.inner, name, expected, None, false, false)?;
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

    /// Deletes the object `name` (one already gone is no error): for a
    /// garbage collector that knows nothing references it.
    pub fn delete(&self, name: &str) -> Result<()> {
        let remote = self.inner.remote()?;
        let path = remote.path(name)?;
        let r = remote.clone();
        let deleted = self.inner.block_on(name, "delete", async move {
            r.retrying(true, || r.store.delete(&path)).await
        })?;
        match deleted {
            Ok(_) | Err((Failure::Store(object_store::Error::NotFound { .. }), _)) => Ok(()),
            Err((f, n)) => Err(remote.error(name, "delete", f, n)),
        }
    }

    /// Uploads the local file `path` as the immutable object `name`: one
    /// request up to [`TierConfig::part_size`], a multipart upload above
    /// (parts in parallel; a failed upload is aborted and started again).
    /// The local file is only read: the tier never holds the only copy.
    /// Returns the bytes uploaded.
    pub fn put_file(&self, name: &str, path: &Path) -> Result<u64> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let size = file.metadata().map_err(Error::io("stat", path))?.len();
        self.put_range(name, &file, path, (0, size), None)
    }

    /// Uploads bytes `offset..offset + size` of the open file `file` (at
    /// `path`) as the content-addressed object `name`, whose bytes must
    /// hash to `expected` (a BLAKE3). The bytes are hashed as they are read for the
    /// upload and stored only when they hash to it: one request is
    /// checked before it is sent, a multipart upload before it is
    /// completed (else it is aborted). Other bytes (the file changed after
    /// it was hashed) are [`Error::SourceChanged`] naming the file, and
    /// nothing is stored under `name`: an object is never replaced by
    /// bytes other than its name says. Returns the bytes uploaded.
    pub fn put_file_checked(
        &self,
        name: &str,
        file: &File,
        path: &Path,
        range: (u64, u64),
        expected: &[u8; 32],
    ) -> Result<u64> {
        self.put_range(name, file, path, range, Some(*expected))
    }

    /// Uploads bytes `offset..offset + size` of `file` (at `path`) as
    /// `name`: one request up to [`TierConfig::part_size`], a multipart
    /// upload above; with `expected`, only if they hash to it (else
    /// [`Error::SourceChanged`], nothing stored).
    fn put_range(
        &self,
        name: &str,
        file: &File,
        path: &Path,
        (offset, size): (u64, u64),
        expected: Option<[u8; 32]>,
    ) -> Result<u64> {
        let remote = self.inner.remote()?;
        let changed = || Error::SourceChanged {
            path: path.to_path_buf(),
            url: remote.url.to_string(),
            name: name.to_string(),
        };
        if size <= self.inner.config.part_size {
            let mut bytes = vec![0u8; size as usize];
            file.read_exact_at(&mut bytes, offset).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof && expected.is_some() {
                    changed()
                } else {
                    Error::io("read", path)(e)
                }
            })?;
            if expected.is_some_and(|h| blake3::hash(&bytes).as_bytes() != &h) {
                return Err(changed());
            }
            self.put_bytes(name, bytes)?;
            return Ok(size);
        }
        let target = remote.path(name)?;
        let attempts = remote.retry.attempts.max(1);
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.multipart_once(&remote, file, path, &target, (offset, size), expected) {
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

    /// One multipart upload of bytes `start..start + size` of `file`;
    /// with `expected`, completed only if the bytes read hash to it (a
    /// BLAKE3).
    fn multipart_once(
        &self,
        remote: &Remote,
        file: &File,
        path: &Path,
        target: &ObjectPath,
        (start, size): (u64, u64),
        expected: Option<[u8; 32]>,
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
        let (url, object) = (remote.url.to_string(), name.clone());
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
                // What is sent is what is hashed: each part as it is read.
                let mut hasher = expected.map(|_| blake3::Hasher::new());
                let changed = || Error::SourceChanged {
                    path: path.clone(),
                    url: url.clone(),
                    name: object.clone(),
                };
                while offset < size && failed.is_none() {
                    let len = part.min(size - offset);
                    let mut chunk = vec![0u8; len as usize];
                    if let Err(e) = file.read_exact_at(&mut chunk, start + offset) {
                        let e = match e.kind() {
                            std::io::ErrorKind::UnexpectedEof if hasher.is_some() => changed(),
                            _ => Error::io("read", &path)(e),
                        };
                        failed = Some(MultipartError::Local(e));
                        break;
                    }
                    if let Some(h) = hasher.as_mut() {
                        h.update(&chunk);
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
                if failed.is_none()
                    && let (Some(h), Some(want)) = (&hasher, &expected)
                    && h.finalize().as_bytes() != want
                {
                    failed = Some(MultipartError::Local(changed()));
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
    /// conditional puts (it puts one probe object under [`PROBE_DIR`](crate::PROBE_DIR)
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

    /// Evicts until the tier's count is within its budget: idle copies
    /// least recently used first, then unleased blocks of copies open by
    /// [`open_leased`](Self::open_leased) (planned ones last, farthest
    /// next use first). Every fetch makes room this way before it starts.
    pub fn evict(&self) -> Result<EvictReport> {
        self.inner.evict_to_budget()
    }

    /// The tier's counters (shared by every process of the node using
    /// its directory), from its `tier.state`.
    pub fn stats(&self) -> Result<TierStats> {
        Ok(self.inner.dir.state.stats())
    }

    /// Asks the tier for room to keep `bytes` of copies whole (mapped,
    /// never evicted) for as long as the returned [`Claim`] lives: granted
    /// while the claims of every living process sharing the tier, this
    /// one's included, fit its budget together; `None` otherwise. A store
    /// that would map its files whole asks here rather than compare its
    /// own size with the budget, so several stores and processes on one
    /// tier never map more than the budget between them. A dead process's
    /// claims end with it.
    pub fn claim_whole(&self, bytes: u64) -> Result<Option<Claim>> {
        let dir = &self.inner.dir;
        let _tier = dir.lock_tier()?;
        let claimed = dir.held()?.sum(crate::pins::Word::Claimed);
        if claimed.saturating_add(bytes) > self.inner.config.tier_budget {
            return Ok(None);
        }
        Ok(Some(Claim::take(&dir.root, bytes)?))
    }
}

/// Why one multipart upload failed.
enum MultipartError {
    Local(Error),
    Remote(Failure),
}
