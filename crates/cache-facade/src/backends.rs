//! [`CacheBackend`] implementations over the cachex stores, and the shared
//! opening logic (root, kind check, fingerprint, stale policy).
//!
//! | backend | fits | cannot |
//! |---|---|---|
//! | [`SegmentBackend`] (segment-store) | any keyed tensor record, written incrementally by many batches: feature caches, model outputs | fixed-shape numpy-style access; a key is never removed (last write wins) |
//! | [`MemmapBackend`] (memmap-array) | fixed-shape rows keyed by source id, built once (with `memmap_array::RowWriter` or `open_or_build`) then read at memory speed: dataset caches | puts: the keyed view is read-only; values are copied out of the map into records |
//! | shard-store, page-alloc | index-addressed data (an iterator's items, a loader's samples): use those crates directly | keyed access: they have no keys |

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fingerprint::{FINGERPRINT_FILE, Fingerprint, Stale, compute_fingerprint, stamp_sources};
use segment_store::{Options as SegmentOptions, Record, SegmentStore};
use tensor_core::Tensor;

use crate::detect::{CacheKind, detect};
use crate::{BackendKind, CacheBackend, CacheConfig, FacadeError, Lookup, OnStale, Result, Stats};

/// Counters shared by the backends.
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
}

impl Counters {
    fn lookup(&self, hits: usize, misses: usize, bytes: usize) {
        self.hits.fetch_add(hits as u64, Ordering::Relaxed);
        self.misses.fetch_add(misses as u64, Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Stats {
        Stats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

/// Version of what the facade stores beside a backend (its fingerprint).
pub const FACADE_CACHE_VERSION: u32 = 1;

/// Makes `config`'s cache directory ready for `expected`: the root exists
/// (or is created), the directory holds no cache of another kind, and its
/// fingerprint is current (a stale one is refused or rebuilt, per
/// `config.on_stale`). Returns the directory and the current fingerprint.
pub(crate) fn prepare_dir(
    config: &CacheConfig,
    expected: CacheKind,
    cache_version: u32,
) -> Result<(PathBuf, Fingerprint)> {
    if !config.root.is_dir() {
        if !config.create_root {
            return Err(FacadeError::MissingRoot(config.root.clone()));
        }
        std::fs::create_dir_all(&config.root).map_err(|e| FacadeError::io(&config.root, e))?;
    }
    let dir = config.cache_dir()?;
    let stamps = match &config.sources {
        None => Vec::new(),
        Some(s) => stamp_sources(&s.root, &s.paths, s.mode())?,
    };
    let keyed = serde_json::json!({
        "backend": config.backend,
        "name": config.name,
        "options": config.options,
    });
    let current = compute_fingerprint(&keyed, stamps, cache_version)?;
    if dir.is_dir() {
        if let Some(found) = detect(&dir).filter(|&found| found != expected) {
            return Err(FacadeError::KindMismatch {
                dir,
                found: found.name().to_owned(),
                expected: expected.name().to_owned(),
            });
        }
        let has_content = std::fs::read_dir(&dir)
            .map_err(|e| FacadeError::io(&dir, e))?
            .next()
            .is_some();
        if has_content {
            let verdict = Fingerprint::read(&dir.join(FINGERPRINT_FILE))
                .and_then(|stored| fingerprint::validate(&stored, &current));
            if let Err(stale) = verdict {
                rebuild_or_refuse(config, &dir, stale)?;
            }
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| FacadeError::io(&dir, e))?;
    Ok((dir, current))
}

fn rebuild_or_refuse(config: &CacheConfig, dir: &Path, stale: Stale) -> Result<()> {
    match config.on_stale {
        OnStale::Error => Err(FacadeError::Stale {
            dir: dir.to_path_buf(),
            stale,
        }),
        OnStale::Rebuild => {
            eprintln!("cachex: rebuilding {}: {stale}", dir.display());
            std::fs::remove_dir_all(dir).map_err(|e| FacadeError::io(dir, e))
        }
    }
}

/// The segment-store backend: values are [`Record`]s.
///
/// Options (all optional): `flush_every` (records per segment, 4096),
/// `lru_bytes` (in-memory LRU budget, 64 MiB), `async_write` (bool),
/// `queue_depth` (2), `writer_rank` (0). The current rank comes from the
/// `RANK` environment variable: on a shared file system every rank opens
/// the same directory, only `writer_rank` persists, the others fill their
/// in-memory LRU (see the segment-store docs).
pub struct SegmentBackend {
    store: SegmentStore,
    dir: PathBuf,
    counters: Counters,
}

impl SegmentBackend {
    /// Option names this backend accepts.
    pub const OPTIONS: &'static [&'static str] = &[
        "flush_every",
        "lru_bytes",
        "async_write",
        "queue_depth",
        "writer_rank",
    ];

    /// Opens (creating if needed) the cache `config` names.
    pub fn open(config: &CacheConfig) -> Result<SegmentBackend> {
        if config.backend != BackendKind::SegmentStore {
            return Err(FacadeError::Config(format!(
                "SegmentBackend opened with a {} config",
                config.backend.name()
            )));
        }
        config.check_options(Self::OPTIONS)?;
        let defaults = SegmentOptions::default();
        let opts = SegmentOptions {
            flush_every: config.opt("flush_every", defaults.flush_every)?,
            lru_bytes: config.opt("lru_bytes", defaults.lru_bytes)?,
            async_write: config.opt("async_write", defaults.async_write)?,
            queue_depth: config.opt("queue_depth", defaults.queue_depth)?,
            writer_rank: config.opt("writer_rank", defaults.writer_rank)?,
            ..defaults
        };
        let (dir, fingerprint) =
            prepare_dir(config, CacheKind::SegmentStore, FACADE_CACHE_VERSION)?;
        let store = SegmentStore::open(&dir, opts)?;
        let fp_path = dir.join(FINGERPRINT_FILE);
        if store.is_writer() && !fp_path.exists() {
            fingerprint.write(&fp_path)?;
        }
        Ok(SegmentBackend {
            store,
            dir,
            counters: Counters::default(),
        })
    }

    /// The store underneath.
    pub fn store(&self) -> &SegmentStore {
        &self.store
    }
}

/// A single-tensor record.
pub fn record_from_tensor(t: Tensor) -> Record {
    Record::from(t)
}

impl CacheBackend for SegmentBackend {
    type Value = Record;

    fn get_batch(&self, keys: &[&str]) -> Result<Lookup<Record>> {
        let (values, missing) = self.store.get_batch(keys)?;
        let bytes: usize = values.iter().flatten().map(Record::byte_len).sum();
        self.counters
            .lookup(keys.len() - missing.len(), missing.len(), bytes);
        Ok((values, missing))
    }

    fn put_batch(&self, items: Vec<(String, Record)>) -> Result<()> {
        let bytes: usize = items.iter().map(|(_, r)| r.byte_len()).sum();
        self.store.put_batch(&items)?;
        self.counters
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.store.flush()?;
        self.counters.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn len(&self) -> usize {
        self.store.len()
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// A read-only keyed view of a finished memmap-array cache: the key is a
/// row's source id, the value a dict record of the row's arrays (absent
/// arrays left out). Build the cache at `config.cache_dir()` with
/// `memmap_array::RowWriter` first; puts are refused.
pub struct MemmapBackend {
    cache: memmap_array::ArrayCache,
    dir: PathBuf,
    counters: Counters,
}

impl MemmapBackend {
    /// Opens the finished cache at `config.cache_dir()`.
    pub fn open(config: &CacheConfig) -> Result<MemmapBackend> {
        if config.backend != BackendKind::MemmapArray {
            return Err(FacadeError::Config(format!(
                "MemmapBackend opened with a {} config",
                config.backend.name()
            )));
        }
        config.check_options(&[])?;
        let dir = config.cache_dir()?;
        match detect(&dir) {
            Some(CacheKind::MemmapArray) => {}
            Some(other) => {
                return Err(FacadeError::KindMismatch {
                    dir,
                    found: other.name().to_owned(),
                    expected: CacheKind::MemmapArray.name().to_owned(),
                });
            }
            None => {
                return Err(FacadeError::Config(format!(
                    "{}: no memmap-array cache here; build it with memmap_array::RowWriter first",
                    dir.display()
                )));
            }
        }
        let cache = memmap_array::ArrayCache::open(&dir)?;
        Ok(MemmapBackend {
            cache,
            dir,
            counters: Counters::default(),
        })
    }

    /// The cache underneath (zero-copy views: `row(i)`, `array(i, name)`).
    pub fn cache(&self) -> &memmap_array::ArrayCache {
        &self.cache
    }

    fn record(&self, row: u64) -> Result<Record> {
        let r = self.cache.row(row)?;
        let parts = self
            .cache
            .schema()
            .arrays()
            .iter()
            .zip(r.arrays())
            .filter_map(|(spec, view)| {
                view.as_ref().map(|v| {
                    (
                        spec.name().to_owned(),
                        segment_store::Part::from(segment_store::TensorBuf::copy_from(v)),
                    )
                })
            });
        Ok(Record::dict(parts))
    }
}

impl CacheBackend for MemmapBackend {
    type Value = Record;

    fn get_batch(&self, keys: &[&str]) -> Result<Lookup<Record>> {
        let mut values = Vec::with_capacity(keys.len());
        let mut missing = Vec::new();
        let mut bytes = 0;
        for (i, key) in keys.iter().enumerate() {
            match self.cache.find(key) {
                Some(row) => {
                    let rec = self.record(row)?;
                    bytes += rec.byte_len();
                    values.push(Some(rec));
                }
                None => {
                    missing.push(i);
                    values.push(None);
                }
            }
        }
        self.counters
            .lookup(keys.len() - missing.len(), missing.len(), bytes);
        Ok((values, missing))
    }

    fn put_batch(&self, _items: Vec<(String, Record)>) -> Result<()> {
        Err(FacadeError::ReadOnly {
            dir: self.dir.clone(),
            why: "memmap-array caches are built with memmap_array::RowWriter",
        })
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> usize {
        self.cache.len() as usize
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// Opens the backend `config` names, behind the trait.
pub fn open(config: &CacheConfig) -> Result<Box<dyn CacheBackend<Value = Record>>> {
    Ok(match config.backend {
        BackendKind::SegmentStore => Box::new(SegmentBackend::open(config)?),
        BackendKind::MemmapArray => Box::new(MemmapBackend::open(config)?),
    })
}
