//! [`RemoteFile`]: one object open through the local tier.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use durable_fs::FileLock;

use crate::blocks::BlockHashes;
use crate::format::BlockMap;
use crate::local::LocalDir;
use crate::tier::{Expected, Inner};
use crate::{Error, Result};

/// An object of the store open through the local tier: a local file that
/// holds the whole object, or a sparse one whose blocks are fetched on
/// [`ensure`](RemoteFile::ensure). Map [`file`](RemoteFile::file) (not the
/// path) to read zero-copy: the handle keeps the local copy from being
/// evicted while it is open, in this process and in others.
#[derive(Debug, Clone)]
pub struct RemoteFile {
    state: Arc<ObjectState>,
}

/// The state of one open object, shared by its handles and prefetches.
#[derive(Debug)]
pub(crate) struct ObjectState {
    tier: Arc<Inner>,
    pub(crate) name: String,
    pub(crate) key: String,
    pub(crate) path: PathBuf,
    pub(crate) file: File,
    size: u64,
    /// `None` for a whole object; the blocks known present otherwise.
    blocks: Option<Mutex<BlockMap>>,
    /// What each fetched block is checked against, when the publisher
    /// recorded it (its block size is the map's).
    pub(crate) hashes: Option<Arc<BlockHashes>>,
    /// The sparse file's inode: block maps on disk are only trusted (and
    /// only written) while the path still names this file.
    ino: u64,
    /// The second (since the epoch) of the last touch.
    touched: std::sync::atomic::AtomicU64,
    _pin: FileLock,
}

impl RemoteFile {
    /// Opens `name`; with `hashes`, every block fetched from now on is
    /// checked against them before it is kept, and a local copy made
    /// without them is not trusted. With `by_blocks`, a small object not
    /// local yet is left sparse too, not fetched whole.
    pub(crate) fn open(
        tier: &Arc<Inner>,
        name: &str,
        expected: &Expected,
        hashes: Option<Arc<BlockHashes>>,
        by_blocks: bool,
    ) -> Result<RemoteFile> {
        tier.remote()?.path(name)?;
        let expected = &Expected {
            size: expected.size.or(hashes.as_ref().map(|h| h.size())),
            ..*expected
        };
        let key = LocalDir::key(name);
        let pin = tier.dir.pin(&key)?;
        let whole = tier.dir.whole(&key);
        let mut opened = open_existing(&whole)?;
        let mut head = None;
        let usable_map = tier
            .read_map(&key)
            .is_some_and(|m| map_fits(&m, hashes.as_deref()));
        if opened.is_none() && !usable_map {
            // Not local: small objects are fetched whole right away (unless
            // the caller reads it in small parts: by blocks, whatever its
            // size).
            let small = match expected.size {
                _ if by_blocks => false,
                Some(s) => s <= tier.config.whole_file_max,
                None => {
                    let info = tier.head(name)?;
                    let small = info.size <= tier.config.whole_file_max;
                    head = Some(info);
                    small
                }
            };
            if small {
                tier.fetch_whole(name, &key, expected, hashes.as_deref())?;
                opened = open_existing(&whole)?;
            }
        }
        let state = match opened {
            Some(file) => {
                let size = file.metadata().map_err(Error::io("stat", &whole))?.len();
                ObjectState {
                    tier: Arc::clone(tier),
                    name: name.to_string(),
                    key,
                    path: whole,
                    file,
                    size,
                    blocks: None,
                    hashes: None,
                    ino: 0,
                    touched: Default::default(),
                    _pin: pin,
                }
            }
            None => {
                let (file, map) = tier.sparse_file(name, &key, head, hashes.as_deref())?;
                let path = tier.dir.sparse(&key);
                let ino = file.metadata().map_err(Error::io("stat", &path))?.ino();
                ObjectState {
                    tier: Arc::clone(tier),
                    name: name.to_string(),
                    key,
                    path,
                    file,
                    size: map.size,
                    blocks: Some(Mutex::new(map)),
                    hashes,
                    ino,
                    touched: Default::default(),
                    _pin: pin,
                }
            }
        };
        let file = RemoteFile {
            state: Arc::new(state),
        };
        if let Some(size) = expected.size
            && size != file.len()
        {
            return Err(file.corrupt(format!("{} bytes, expected {size}", file.len())));
        }
        file.touch();
        Ok(file)
    }

    /// The object's name in the store.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The object's size in bytes.
    pub fn len(&self) -> u64 {
        self.state.size
    }

    /// Whether the object is empty.
    pub fn is_empty(&self) -> bool {
        self.state.size == 0
    }

    /// The local file (whole, or sparse with the fetched blocks in place).
    /// Map or read it after [`ensure`](RemoteFile::ensure) of the bytes
    /// wanted; bytes of blocks not fetched read as zeros.
    pub fn file(&self) -> &File {
        &self.state.file
    }

    /// Where the local file lives now. Prefer [`file`](RemoteFile::file):
    /// the path may be evicted and refetched once this handle is closed.
    pub fn path(&self) -> &Path {
        &self.state.path
    }

    /// Whether every byte is local.
    pub fn is_complete(&self) -> bool {
        match &self.state.blocks {
            None => true,
            Some(map) => {
                let map = lock(map);
                map.present() == map.blocks()
            }
        }
    }

    /// How many of the object's blocks are local, of how many (a whole
    /// object counts as one block).
    pub fn blocks_present(&self) -> (u64, u64) {
        match &self.state.blocks {
            None => (1, 1),
            Some(map) => {
                let map = lock(map);
                (map.present(), map.blocks())
            }
        }
    }

    /// Makes the bytes `range` local: fetches the missing blocks that
    /// cover it (in parallel, coalesced with any other fetch of the same
    /// block on this machine), then starts fetching the next blocks in the
    /// background.
    pub fn ensure(&self, range: Range<u64>) -> Result<()> {
        if let Some(last) = self.fetch_missing(std::slice::from_ref(&range))? {
            self.prefetch(last + 1);
            self.touch();
        }
        Ok(())
    }

    /// Makes the bytes of every range of `ranges` local, their missing
    /// blocks fetched at once, and nothing more: no read-ahead, for
    /// reads that jump (a row here, a row there) rather than stream.
    pub fn ensure_exact(&self, ranges: &[Range<u64>]) -> Result<()> {
        if self.fetch_missing(ranges)?.is_some() {
            self.touch();
        }
        Ok(())
    }

    /// Fetches the missing blocks that cover `ranges`; the last block they
    /// cover (`None`: a whole object, or no bytes asked).
    fn fetch_missing(&self, ranges: &[Range<u64>]) -> Result<Option<u64>> {
        let s = &self.state;
        if let Some(r) = ranges.iter().find(|r| r.start > r.end || r.end > s.size) {
            return Err(Error::OutOfRange {
                url: s.tier.url.to_string(),
                name: s.name.clone(),
                start: r.start,
                end: r.end,
                size: s.size,
            });
        }
        let Some(blocks) = &s.blocks else {
            return Ok(None);
        };
        let bs = lock(blocks).block_size;
        let mut wanted: Vec<u64> = ranges
            .iter()
            .filter(|r| !r.is_empty())
            .flat_map(|r| r.start / bs..=(r.end - 1) / bs)
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let Some(&last) = wanted.last() else {
            return Ok(None);
        };
        let mut missing: Vec<u64> = wanted.into_iter().filter(|&i| !s.has(i)).collect();
        if !missing.is_empty() {
            s.refresh();
            missing.retain(|&i| !s.has(i));
        }
        self.fetch_blocks(&missing)?;
        Ok(Some(last))
    }

    /// Reads `buf.len()` bytes at `offset`, fetching them first.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        self.ensure(offset..end)?;
        self.state
            .file
            .read_exact_at(buf, offset)
            .map_err(Error::io("read", &self.state.path))
    }

    /// Fetches `blocks`, up to the tier's parallelism at once.
    fn fetch_blocks(&self, blocks: &[u64]) -> Result<()> {
        let s = &self.state;
        match blocks {
            [] => Ok(()),
            [one] => s.tier.fetch_block(s, *one),
            many => {
                let next = std::sync::atomic::AtomicUsize::new(0);
                let workers = s.tier.config.parallelism.clamp(1, many.len());
                let results: Vec<Result<()>> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..workers)
                        .map(|_| {
                            scope.spawn(|| {
                                loop {
                                    let at =
                                        next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                    let Some(&i) = many.get(at) else {
                                        return Ok(());
                                    };
                                    s.tier.fetch_block(s, i)?;
                                }
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            h.join().unwrap_or_else(|_| {
                                Err(Error::Runtime("a block fetch panicked".into()))
                            })
                        })
                        .collect()
                });
                results.into_iter().collect()
            }
        }
    }

    /// Starts background fetches of the blocks after `from`, as far as the
    /// prefetch window and the tier's free request slots allow.
    fn prefetch(&self, from: u64) {
        let s = &self.state;
        let Some(blocks) = &s.blocks else { return };
        let total = lock(blocks).blocks();
        let until = from
            .saturating_add(s.tier.config.prefetch_blocks)
            .min(total);
        for i in from..until {
            if s.has(i) {
                continue;
            }
            let Ok(permit) = s.tier.prefetch_slots().try_acquire_owned() else {
                return;
            };
            let state = Arc::clone(&self.state);
            // A failed prefetch is only a miss: the read that needs the
            // block fetches it again and reports the error.
            s.tier.spawn_blocking(move || {
                let _ = state.tier.fetch_block(&state, i);
                drop(permit);
            });
        }
    }

    /// Checks the complete local copy against `expected`; a copy that does
    /// not match is removed from the local tier.
    pub(crate) fn verify(&self, expected: &Expected) -> Result<()> {
        let Some(want) = expected.blake3 else {
            return Ok(());
        };
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut offset = 0u64;
        while offset < self.state.size {
            let n = (self.state.size - offset).min(buf.len() as u64) as usize;
            self.state
                .file
                .read_exact_at(&mut buf[..n], offset)
                .map_err(Error::io("read", &self.state.path))?;
            hasher.update(&buf[..n]);
            offset += n as u64;
        }
        if hasher.finalize().as_bytes() == &want {
            return Ok(());
        }
        let s = &self.state;
        {
            let _tier = s.tier.dir.lock_tier()?;
            if s.blocks.is_some() {
                durable_fs::remove_and_sync(&s.tier.dir.map(&s.key))?;
            }
            durable_fs::remove_and_sync(&s.path)?;
        }
        Err(self.corrupt("BLAKE3 mismatch; the local copy was removed".into()))
    }

    fn corrupt(&self, problem: String) -> Error {
        Error::Corrupt {
            url: self.state.tier.url.to_string(),
            name: self.state.name.clone(),
            problem,
        }
    }

    /// Marks the object used now, for least-recently-used eviction: at
    /// most once a second per object, since a read path calls it for every
    /// range it ensures and eviction order needs no finer clock.
    fn touch(&self) {
        let now = SystemTime::now();
        let secs = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self
            .state
            .touched
            .swap(secs, std::sync::atomic::Ordering::Relaxed)
            != secs
        {
            let _ = self.state.file.set_modified(now);
        }
    }
}

impl ObjectState {
    /// Whether block `i` is known present (always, for a whole object).
    pub(crate) fn has(&self, i: u64) -> bool {
        self.blocks.as_ref().is_none_or(|m| lock(m).has(i))
    }

    /// The byte range of block `i` and the etag its request requires:
    /// the object's, unless blocks are checked against their hashes, which
    /// already tell any other bytes from the published ones (and so keep
    /// reading an object that was replaced by the same bytes again).
    pub(crate) fn block(&self, i: u64) -> (Range<u64>, String) {
        match &self.blocks {
            Some(m) => {
                let m = lock(m);
                let etag = match self.hashes {
                    Some(_) => String::new(),
                    None => m.etag.clone(),
                };
                (m.block_range(i), etag)
            }
            None => (0..0, String::new()),
        }
    }

    /// Whether the sparse path still names this handle's file.
    fn current(&self) -> bool {
        std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino)
    }

    /// Learns the blocks other processes fetched since.
    pub(crate) fn refresh(&self) {
        let Some(m) = &self.blocks else { return };
        if !self.current() {
            return;
        }
        if let Some(disk) = self.tier.read_map(&self.key) {
            let mut mine = lock(m);
            if disk.same_copy(&mine) {
                mine.merge(&disk);
            }
        }
    }

    /// Records block `i` present, in memory and (while the path still
    /// names this file) in the block map on disk. Call with the tier lock
    /// held and the block's bytes fsynced.
    pub(crate) fn mark(&self, i: u64) -> Result<()> {
        let Some(m) = &self.blocks else { return Ok(()) };
        let encoded = {
            let mut mine = lock(m);
            mine.set(i);
            if let Some(disk) = self.tier.read_map(&self.key)
                && disk.same_copy(&mine)
            {
                mine.merge(&disk);
            }
            mine.encode()
        };
        if self.current() {
            durable_fs::write_atomic(&self.tier.dir.map(&self.key), &encoded)?;
        }
        Ok(())
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

/// Opens `path` read-only if it exists.
fn open_existing(path: &Path) -> Result<Option<File>> {
    match File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("open", path)(e)),
    }
}

/// Locks a block map; a panic elsewhere cannot leave one half-updated
/// (updates are single bit sets), so a poisoned lock is taken as is.
fn lock(m: &Mutex<BlockMap>) -> MutexGuard<'_, BlockMap> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
