//! shard-store behind the facade: the items of a deterministic iterator by
//! index, in loadit's layout.

use std::path::{Path, PathBuf};

use shard_store::{Options as ShardOptions, PickleValue, ShardLength, ShardStore};
use tensor_core::Value;

use super::Counters;
use crate::Detected;
use crate::convert::{pickle_from_value, value_from_pickle};
use crate::prepare::{DirState, Spec, commit, prepare};
use crate::source::SourceKind;
use crate::{CacheBackend, CacheConfig, FacadeError, Operation, Result, Source, Stats, StoreKind};

/// The shard-store backend: item `i` of a [`Source::items`] iterator by
/// index, pulled from the source once and cached in pickled shards that
/// Python's loadit reads too. A tensor is pickled as the dict
/// `{"data": bytes, "dtype": str, "shape": tuple}`; an item Python wrote
/// converts too (`str` and `bytes` are blobs, `int`, `float` and `bool`
/// 0-d tensors; `None` and sets are an error naming the item). A pickled dict keeps its members
/// in name order. Items are decoded from pickle, so values are copies, not
/// views.
///
/// Options: `max_shard_length` (items per shard), `max_cache_size`
/// (decoded shards kept in memory), `max_workers`, `memory_limit` (disk
/// budget in bytes); any other option is the dataset's config (it keys
/// the cache).
pub struct ShardBackend {
    store: ShardStore<PickleValue>,
    dir: PathBuf,
    counters: Counters,
}

fn spec(can_build: bool) -> Spec {
    Spec {
        kind: Some(Detected::own(StoreKind::ShardStore)),
        version: shard_store::format::FORMAT_VERSION as u32,
        can_build,
        complete: crate::prepare::fingerprinted,
        store_locks: crate::prepare::no_locks,
    }
}

impl ShardBackend {
    /// Opens the cache `config` names without a source: only the items on
    /// disk can be read.
    pub fn open(config: &CacheConfig) -> Result<ShardBackend> {
        check_kind(config)?;
        let options = options(config)?;
        let prepared = prepare(config, &spec(false))?;
        let store = ShardStore::open(&prepared.dir, options)?;
        Ok(ShardBackend {
            store,
            dir: prepared.dir.clone(),
            counters: Counters::default(),
        })
    }

    /// Opens the cache `config` names over `source` (a [`Source::items`]),
    /// which fills it on demand; a stale cache is cleared first (if
    /// `on_stale` allows).
    pub fn open_with_source(config: &CacheConfig, source: Source) -> Result<ShardBackend> {
        check_kind(config)?;
        let SourceKind::Items(factory) = source.kind else {
            return Err(FacadeError::Unsupported {
                dir: config.cache_dir()?,
                backend: config.backend.name(),
                op: "build from a keyed source",
                why: "shard-store regenerates items by replaying an iterator: give a Source::items",
            });
        };
        let options = options(config)?;
        let prepared = prepare(config, &spec(true))?;
        if matches!(prepared.state, DirState::Incomplete) {
            // Shards without a fingerprint (a crash right after the root
            // was created): nothing says which source wrote them.
            crate::prepare::clear(&prepared.dir, &spec(true))?;
        }
        let store = ShardStore::open_with_source(&prepared.dir, options, move || {
            factory().map(|v| PickleValue(pickle_from_value(&v)))
        })?;
        if !matches!(prepared.state, DirState::Fresh) {
            commit(&prepared)?;
        }
        Ok(ShardBackend {
            store,
            dir: prepared.dir.clone(),
            counters: Counters::default(),
        })
    }

    /// The store underneath.
    pub fn store(&self) -> &ShardStore<PickleValue> {
        &self.store
    }
}

fn check_kind(config: &CacheConfig) -> Result<()> {
    if config.backend != StoreKind::ShardStore {
        return Err(FacadeError::Config(format!(
            "ShardBackend opened with a {} config",
            config.backend.name()
        )));
    }
    Ok(())
}

fn options(config: &CacheConfig) -> Result<ShardOptions> {
    let d = ShardOptions::default();
    let mut o = ShardOptions {
        max_cache_size: config.opt("max_cache_size", d.max_cache_size)?,
        max_workers: config.opt("max_workers", d.max_workers)?,
        memory_limit: config.opt("memory_limit", d.memory_limit)?,
        ..d
    };
    if let Some(n) = config.opt::<Option<u64>>("max_shard_length", None)? {
        o.max_shard_length = ShardLength::Items(n);
    }
    Ok(o)
}

impl CacheBackend for ShardBackend {
    fn kind(&self) -> StoreKind {
        StoreKind::ShardStore
    }

    fn supports(&self, op: Operation) -> bool {
        op == Operation::GetByIndex
    }

    fn get_indices(&self, indices: &[i64]) -> Result<Vec<Value>> {
        let items = self.store.get_many(indices)?;
        let mut values = Vec::with_capacity(items.len());
        let mut bytes = 0;
        for (item, &index) in items.iter().zip(indices) {
            let value = value_from_pickle(&item.0).map_err(|why| FacadeError::BadValue {
                dir: self.dir.clone(),
                why: format!("item {index}: {why}"),
            })?;
            bytes += value.byte_len();
            values.push(value);
        }
        self.counters.lookup(indices.len(), 0, bytes);
        Ok(values)
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        Ok(self.store.len()?)
    }

    fn stats(&self) -> Stats {
        self.counters.snapshot()
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

/// shard-store (and loadit) roots at a path (the same layout), for
/// [`crate::KINDS`].
pub(crate) struct ShardKind;

pub(crate) static SHARD_STORE: ShardKind = ShardKind;

impl crate::KindSpec for ShardKind {
    fn kind(&self) -> crate::Detected {
        crate::Detected::own(StoreKind::ShardStore)
    }

    fn detect(&self, probe: &crate::Probe<'_>) -> bool {
        probe.is_dir
            && probe
                .path
                .join(shard_store::format::METADATA_FILE)
                .is_file()
            && probe.path.join(shard_store::format::SHARDS_DIR).is_dir()
    }

    fn verify(&self, path: &Path) -> Vec<cache_check::Problem> {
        shard_store::verify(path)
    }

    fn inspect(&self, path: &Path) -> Result<cache_check::Summary> {
        Ok(shard_store::inspect(path)?.summary())
    }

    /// By index (negative from the end), without a source: only cached
    /// items read.
    fn get(&self, path: &Path, key: &str) -> Result<serde_json::Value> {
        let index: i64 = key.parse().map_err(|_| FacadeError::BadKey {
            path: path.to_path_buf(),
            key: key.to_owned(),
        })?;
        let store: shard_store::ShardStore<shard_store::PickleValue> =
            shard_store::ShardStore::open(path, shard_store::Options::default())?;
        match store.get(index) {
            Ok(item) => Ok(crate::json::pickle_to_json(&item.0)),
            Err(shard_store::Error::IndexOutOfRange { .. }) => Err(FacadeError::NoSuchRecord {
                path: path.to_path_buf(),
                what: format!("index {index} out of range"),
            }),
            Err(e) => Err(e.into()),
        }
    }

    fn stats(&self, path: &Path) -> Result<cache_check::Summary> {
        use crate::kinds::ratio;
        let s = shard_store::inspect(path)?;
        let mut out = cache_check::Summary::new(self.kind().name(), path)
            .fact("items_cached", s.items_cached)
            .fact("length", s.length)
            .fact("shards", s.shards)
            .fact("items_per_shard", ratio(s.items_cached, s.shards as u64))
            .fact("bytes_on_disk", s.bytes_on_disk)
            .fact("bytes_per_item", ratio(s.bytes_on_disk, s.items_cached));
        if let Some(length) = s.length {
            out.push_fact("cached_fraction", ratio(s.items_cached, length));
            out.push_fact("items_missing", length.saturating_sub(s.items_cached));
        }
        Ok(out)
    }
}
