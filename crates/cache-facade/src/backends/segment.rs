//! segment-store behind the facade: keyed records, read and write.

use std::path::{Path, PathBuf};

use segment_store::{Options as SegmentOptions, SegmentStore};
use tensor_core::Value;

use super::Counters;
use crate::Detected;
use crate::convert::check_record;
use crate::prepare::{DirState, Spec, commit, prepare};
use crate::{CacheBackend, CacheConfig, FacadeError, Lookup, Operation, Result, Stats, StoreKind};

/// The segment-store backend: any [`Value`] a record can hold (a tensor,
/// or a dict, tuple or list of tensors and blobs, or a blob) by string id;
/// values read back are views into the mapped segments. A segment-store
/// record is a [`Value`], so reads pass the store's values through
/// untouched (the facade costs a statistics counter, no conversion), and
/// puts hand the caller's values to the store without copying them (the
/// store copies their bytes into the segment when it flushes).
///
/// Options (all optional): `flush_every` (records per segment, 4096),
/// `lru_bytes` (in-memory LRU budget, 64 MiB), `async_write` (bool),
/// `queue_depth` (2), `writer_rank` (0), `multi_writer` (false). The
/// current rank comes from the `RANK` environment variable: on a shared
/// file system every rank opens the same directory, only `writer_rank`
/// persists, the others fill their in-memory LRU (see the segment-store
/// docs). With `multi_writer: true` every rank persists, as segment-store
/// writer `RANK`, into its own segments and index log; a rank sees what
/// the others flushed when it reopens or calls
/// [`SegmentStore::refresh`] on [`SegmentBackend::store`].
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
        "multi_writer",
    ];

    /// Opens (creating if needed) the cache `config` names; read-only,
    /// no writer lock taken and puts refused, where
    /// [`CacheConfig::read_only`] says so.
    pub fn open(config: &CacheConfig) -> Result<SegmentBackend> {
        if config.backend != StoreKind::SegmentStore {
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
            writer_id: config
                .opt("multi_writer", false)?
                .then_some(defaults.current_rank),
            read_only: config.read_only,
            ..defaults
        };
        let prepared = prepare(config, &SPEC)?;
        let store = SegmentStore::open(&prepared.dir, opts)?;
        if !matches!(prepared.state, DirState::Fresh) && store.is_writer() {
            commit(&prepared)?;
        }
        Ok(SegmentBackend {
            store,
            dir: prepared.dir,
            counters: Counters::default(),
        })
    }

    /// The store underneath.
    pub fn store(&self) -> &SegmentStore {
        &self.store
    }
}

const SPEC: Spec = Spec {
    kind: Some(Detected::own(StoreKind::SegmentStore)),
    version: segment_store::format::INDEX_VERSION,
    // An empty store is a cache: it is filled by puts.
    can_build: true,
    complete: crate::prepare::fingerprinted,
    store_locks: |dir| vec![dir.join(segment_store::format::LOCK_FILE)],
};

impl CacheBackend for SegmentBackend {
    fn kind(&self) -> StoreKind {
        StoreKind::SegmentStore
    }

    fn supports(&self, op: Operation) -> bool {
        matches!(op, Operation::GetByKey | Operation::Put)
    }

    fn get_batch(&self, keys: &[&str]) -> Result<Lookup> {
        // A segment-store record is a `Value`: the store's answer is the
        // facade's, with nothing converted.
        let (values, missing) = self.store.get_batch(keys)?;
        let bytes = values.iter().flatten().map(Value::byte_len).sum();
        self.counters
            .lookup(keys.len() - missing.len(), missing.len(), bytes);
        Ok((values, missing))
    }

    fn put_batch(&self, items: Vec<(String, Value)>) -> Result<()> {
        let mut bytes = 0;
        for (key, value) in &items {
            bytes += value.byte_len();
            check_record(value).map_err(|why| FacadeError::BadValue {
                dir: self.dir.clone(),
                why: format!("{key:?}: {why}"),
            })?;
        }
        self.store.put_batch(&items)?;
        self.counters.written(bytes);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.store.flush()?;
        self.counters.flushed();
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.store.len() as u64)
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// segment-store directories (with our index log, or several writers'
/// logs) and torchcachex directories (the same segments, no index log of
/// ours) at a path, for [`crate::KINDS`].
pub(crate) struct SegmentKind {
    torchcachex: bool,
}

/// Directories with our index log.
pub(crate) static SEGMENT_STORE: SegmentKind = SegmentKind { torchcachex: false };
/// Directories of segments without it.
pub(crate) static TORCHCACHEX: SegmentKind = SegmentKind { torchcachex: true };

/// Opens the store at `path` with no LRU (`read_only`: no writer lock).
pub fn open_at(path: &Path, read_only: bool) -> Result<SegmentStore> {
    let opts = SegmentOptions {
        read_only,
        lru_bytes: 0,
        ..SegmentOptions::default()
    };
    Ok(SegmentStore::open(path, opts)?)
}

impl crate::KindSpec for SegmentKind {
    fn kind(&self) -> Detected {
        if self.torchcachex {
            Detected::peer(crate::PeerFormat::Torchcachex)
        } else {
            Detected::own(StoreKind::SegmentStore)
        }
    }

    fn detect(&self, probe: &crate::Probe<'_>) -> bool {
        if !probe.is_dir {
            return false;
        }
        let ours = probe.path.join(segment_store::format::INDEX_FILE).is_file()
            || probe.path.join(segment_store::format::WRITERS_DIR).is_dir();
        if self.torchcachex {
            !ours
                && probe
                    .path
                    .join(segment_store::format::SEGMENTS_DIR)
                    .is_dir()
        } else {
            ours
        }
    }

    /// A torchcachex directory has no index log of ours, which is not a
    /// problem.
    fn verify(&self, path: &Path) -> Vec<cache_check::Problem> {
        let mut problems = segment_store::verify(path);
        if self.torchcachex {
            let index = path.join(segment_store::format::INDEX_FILE);
            problems.retain(|p| !(p.kind == cache_check::ProblemKind::Missing && p.path == index));
        }
        problems
    }

    fn inspect(&self, path: &Path) -> Result<cache_check::Summary> {
        let mut summary = open_at(path, true)?.inspect().summary();
        summary.kind = self.kind().name().into();
        Ok(summary)
    }

    fn get(&self, path: &Path, key: &str) -> Result<serde_json::Value> {
        let store = open_at(path, true)?;
        let (mut values, _) = store.get_batch(&[key])?;
        let record = values
            .pop()
            .flatten()
            .ok_or_else(|| FacadeError::NoSuchRecord {
                path: path.to_path_buf(),
                what: format!("no record with key {key:?}"),
            })?;
        Ok(crate::json::record_json(&record))
    }

    fn stats(&self, path: &Path) -> Result<cache_check::Summary> {
        use crate::kinds::ratio;
        let store = open_at(path, true)?;
        let s = store.stats();
        let report = store.inspect();
        let rows: usize = report.segments.iter().filter_map(|s| s.rows).sum();
        let live: usize = report.segments.iter().map(|s| s.live_rows).sum();
        let unreadable = report.segments.iter().filter(|s| s.rows.is_none()).count();
        Ok(cache_check::Summary::new(self.kind().name(), path)
            .fact("entries", s.entries)
            .fact("segments", s.segments)
            .fact("unreadable_segments", unreadable)
            .fact("rows", rows)
            .fact("dead_rows", rows.saturating_sub(live))
            .fact("disk_bytes", report.disk_bytes)
            .fact(
                "bytes_per_entry",
                ratio(report.disk_bytes, s.entries as u64),
            )
            .fact("index_bytes", s.index_bytes)
            .fact(
                "index_bytes_per_entry",
                serde_json::json!(s.index_bytes_per_entry),
            ))
    }
}
