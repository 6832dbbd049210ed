//! The fetch engine behind a [`RemoteTier`](crate::RemoteTier) and its
//! open files: the store of this process (rebuilt in a forked child),
//! bounded requests, whole-object fetches streamed to the local tier,
//! sparse files and their block maps.

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::StreamExt;
use object_store::{
    GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
};
use tokio::sync::Semaphore;

use crate::blocks::BlockHashes;
use crate::config::TierConfig;
use crate::constants::PROBE_DIR;
use crate::error::block_mismatch;
use crate::evict::{self, Slack};
use crate::format::{self, BlockMap};
use crate::local::{EvictReport, LocalDir, Reservation};
use crate::remote::{Failure, Remote};
use crate::state::Stat;
use crate::store_url::build_store;
use crate::victims::Admit;
use crate::{Error, Result};

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
    /// When the store last wrote it (its clock, not this machine's).
    pub last_modified: std::time::SystemTime,
}

/// The shared state behind a [`RemoteTier`] and its open files.
#[derive(Debug)]
pub(crate) struct Inner {
    /// The URL as shown in errors (no credentials).
    pub(crate) url: Arc<str>,
    /// The store and its request slots, as of the process that made them.
    pub(crate) conn: Mutex<Conn>,
    /// How to build the store again in a forked child.
    pub(crate) rebuild: Option<Rebuild>,
    pub(crate) dir: LocalDir,
    pub(crate) config: TierConfig,
    /// Whether the server was seen to refuse a second put-if-absent.
    pub(crate) conditional_checked: Mutex<bool>,
}

/// The store of one process: a forked child makes its own.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) pid: u32,
    pub(crate) remote: Remote,
    pub(crate) prefetch: Arc<Semaphore>,
}

/// The URL and options a tier opened by URL was built from. Shown
/// without the URL's credentials or the options' values.
pub(crate) struct Rebuild {
    pub(crate) url: String,
    pub(crate) options: Vec<(String, String)>,
}

impl std::fmt::Debug for Rebuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Rebuild")
            .field("option_keys", &keys)
            .finish()
    }
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
    pub(crate) fn check_conditional_puts(&self) -> Result<()> {
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

    /// Reserves `need` bytes for a fetch: evicts first when the count
    /// plus `need` would pass the budget. A read that finds no room
    /// (everything leased or pinned whole) reserves anyway and is counted
    /// in `over_budget`; a prefetch gets `None` and should skip its block.
    pub(crate) fn make_room(&self, need: u64, admit: Admit) -> Result<Option<Reservation<'_>>> {
        let state = &self.dir.state;
        let budget = self.config.tier_budget;
        let _tier = self.dir.lock_tier()?;
        self.dir.check()?;
        if state.allocated().saturating_add(need) > budget {
            let excess = state
                .allocated()
                .saturating_sub(budget.saturating_sub(need));
            evict::pass(&self.dir, excess, Slack::of(budget), admit)?;
            if state.allocated().saturating_add(need) > budget {
                match admit {
                    Admit::Read => state.count(Stat::OverBudget, 1),
                    Admit::Prefetch { .. } => return Ok(None),
                }
            }
        }
        let _changing = state.changing();
        Ok(Some(Reservation::new(&self.dir, need)?))
    }

    /// [`make_room`](Self::make_room) for a read, which always gets its
    /// reservation.
    pub(crate) fn reserve(&self, need: u64) -> Result<Reservation<'_>> {
        match self.make_room(need, Admit::Read)? {
            Some(reserved) => Ok(reserved),
            None => Reservation::new(&self.dir, 0),
        }
    }

    /// Evicts until the count is within the budget (no slack), dead
    /// processes' reservations taken off the count first.
    pub(crate) fn evict_to_budget(&self) -> Result<EvictReport> {
        let _tier = self.dir.lock_tier()?;
        self.dir.check_all()?;
        let excess = self
            .dir
            .state
            .allocated()
            .saturating_sub(self.config.tier_budget);
        evict::pass(&self.dir, excess, Slack::NONE, Admit::Read)
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
        self.dir.state.count(Stat::HeadRequests, 1);
        let (meta, _) = got.map_err(|(f, n)| remote.error(name, "head", f, n))?;
        Ok(ObjectInfo {
            name: name.to_string(),
            size: meta.size,
            e_tag: meta.e_tag,
            last_modified: meta.last_modified.into(),
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
        self.dir.state.count(Stat::GetRequests, 1);
        let (got, _) = got.map_err(|(f, n)| remote.error(name, "get", f, n))?;
        let sent = match &got {
            Ok(bytes) => bytes.len() as u64,
            Err(seen) => *seen,
        };
        self.dir.state.count(Stat::FetchedBytes, sent.min(expect));
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
        self.dir.state.count(Stat::GetRequests, 1);
        match got.map_err(|(f, n)| remote.error(name, "get", f, n))?.0 {
            Streaming::Done(s) => {
                self.dir.state.count(Stat::FetchedBytes, s.size);
                Ok(s)
            }
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
        // expects, or the tier's whole-file size. That much is reserved.
        let cap = expected.size.unwrap_or(self.config.whole_file_max);
        let reserved = self.reserve(crate::state::units(0..cap))?;
        let tmp = durable_fs::unique_temp_path(&self.dir.tmp, key);
        let fetched = self.fetch_whole_to(name, &tmp, &dest, cap, expected, hashes);
        if let Err(e) = fetched {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let used = std::fs::metadata(&tmp)
            .map_err(Error::io("stat", &tmp))?
            .blocks()
            * 512;
        {
            // Renamed into `objects/` and settled in one hold of the lock:
            // a rebuild counts the copy or the reservation, never both.
            let _tier = self.dir.lock_tier()?;
            let _changing = self.dir.state.changing();
            if let Err(e) = durable_fs::rename(&tmp, &dest) {
                let _ = std::fs::remove_file(&tmp);
                return Err(e.into());
            }
            reserved.settle(used);
        }
        Ok(durable_fs::sync_parent_dir(&dest)?)
    }

    /// [`fetch_whole`](Inner::fetch_whole)'s fetch into `tmp` (fsynced),
    /// checked; the caller renames it to `dest`. A block that does not
    /// match is fetched once more, as by blocks.
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
        Ok(())
    }

    /// The block map of `key` on disk, if there is a valid one, without
    /// the unsynced blocks of another boot (their bytes may be gone).
    pub(crate) fn read_map(&self, key: &str) -> Option<BlockMap> {
        self.dir.read_map(key)
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
        // The map goes last: a map always describes the sparse file beside
        // it. An old map goes durably first, so that its blocks never come
        // back beside the new file. The new file and its empty map need no
        // fsync: lost, or torn, they are made again; and the first map that
        // marks a block durable is written with a directory fsync (after
        // the file's), which makes both names durable with it. The count
        // loses the old copy (what a scan finds of it) and gains the new
        // one's metadata.
        let _changing = self.dir.state.changing();
        let old = self.dir.sparse_counted(key);
        self.dir.state.sub(old);
        self.dir
            .state
            .add(crate::state::meta_bytes(map.blocks(), map.etag.len()));
        let _ = durable_fs::remove_and_sync(&self.dir.map(key))?;
        let _ = durable_fs::remove_and_sync(&self.dir.touch(key))?;
        let tmp = durable_fs::unique_temp_path(&self.dir.tmp, key);
        let file = durable_fs::create_temp(&tmp)?;
        file.set_len(info.size)
            .map_err(Error::io("size sparse file", &tmp))?;
        drop(file);
        durable_fs::rename(&tmp, &sparse)?;
        durable_fs::replace_unsynced(&self.dir.map(key), &map.encode())?;
        match open(map)? {
            Some(found) => Ok(found),
            None => Err(Error::io("open", &sparse)(
                std::io::ErrorKind::NotFound.into(),
            )),
        }
    }
}

/// Whether a handle checking blocks against `hashes` (or against nothing)
/// may use the local copy `map` describes: a copy made under one block
/// list serves only handles of that list, and a copy made without one
/// only handles without one, so that no unchecked block ever lands in a
/// copy whose map says its blocks were checked.
pub(crate) fn map_fits(map: &BlockMap, hashes: Option<&BlockHashes>) -> bool {
    match hashes {
        None => map.checked.is_none(),
        Some(h) => {
            map.checked == Some(h.digest())
                && map.block_size == h.block_size()
                && map.size == h.size()
        }
    }
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
