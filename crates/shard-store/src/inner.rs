//! What every handle of one store shares: the root's paths, the source
//! and its cursors, the decoded-shard cache and the queue of the preload
//! workers. The shard cache (`shards.rs`), the shard files (`reader.rs`),
//! the generation (`writer.rs`) and the quarantine (`recover.rs`) each add
//! their methods to [`Inner`].

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, mpsc};

use parking_lot::Mutex;

use crate::format::{Compression, ShardName};
use crate::options::Options;

pub(crate) type StartAt<T> = Box<dyn Fn(u64) -> Box<dyn Iterator<Item = T> + Send> + Send + Sync>;

/// The source of items: a factory of iterators, either restartable only
/// from item 0 or seekable to any item.
pub(crate) struct Source<T> {
    pub(crate) start_at: StartAt<T>,
    /// Whether `start_at` honours its argument (else it always starts at 0).
    pub(crate) seekable: bool,
}

impl<T> Source<T> {
    /// A fresh iterator whose first item is item `start` (a plain source
    /// is only ever asked for `start == 0`).
    pub(crate) fn iter_from(&self, start: u64) -> Box<dyn Iterator<Item = T> + Send> {
        (self.start_at)(start)
    }
}

/// A replayable position in the source.
pub(crate) struct Cursor<T> {
    pub(crate) iter: Box<dyn Iterator<Item = T> + Send>,
    pub(crate) pos: u64,
    pub(crate) done: bool,
}

pub(crate) struct Paths {
    pub(crate) shards: PathBuf,
    pub(crate) locks: PathBuf,
    pub(crate) scratch: PathBuf,
    pub(crate) metadata: PathBuf,
    pub(crate) writer_lock: PathBuf,
}

/// Hashes shard starts cheaply: the memory cache lookup is on every `get`.
#[derive(Default, Clone, Copy)]
pub(crate) struct StartHasher(u64);

impl std::hash::Hasher for StartHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // SplitMix64's finalizer: starts are multiples of the shard length
        // (many trailing zeros), and the table indexes by the low bits.
        let mut z = v;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        self.0 = z ^ (z >> 31);
    }
}

pub(crate) type StartMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<StartHasher>>;

pub(crate) struct State<T> {
    /// Decoded shards by start, with their last-use tick.
    pub(crate) cache: StartMap<(Arc<Vec<T>>, u64)>,
    /// The final length once known.
    pub(crate) length: Option<u64>,
    /// Last use of each shard file by this process (disk LRU).
    pub(crate) disk_access: HashMap<u64, u64>,
    /// Sizes of the shard files seen by eviction (a shard file is
    /// immutable once under its name), so it stats only new ones.
    pub(crate) disk_size: HashMap<ShardName, u64>,
    /// Shards queued for or being preloaded.
    pub(crate) pending: HashSet<u64>,
}

pub(crate) struct Inner<T> {
    pub(crate) root: PathBuf,
    pub(crate) paths: Paths,
    pub(crate) shard_len: u64,
    pub(crate) compression: Compression,
    pub(crate) opts: Options,
    pub(crate) source: Option<Source<T>>,
    pub(crate) state: Mutex<State<T>>,
    pub(crate) cursors: Vec<Mutex<Option<Cursor<T>>>>,
    pub(crate) tick: AtomicU64,
    /// Shards the workers load ahead of a foreground access (0: none);
    /// starts as [`Options::preload_policy`], changed by `set_preload`.
    pub(crate) preload: AtomicUsize,
    /// Foreground shard lookups that missed the memory cache.
    pub(crate) memory_misses: AtomicU64,
    /// Shard lookups (foreground or background) that found no shard file
    /// and went to the source.
    pub(crate) disk_misses: AtomicU64,
    pub(crate) jobs: Option<Mutex<mpsc::Sender<Job>>>,
    pub(crate) stop: Arc<std::sync::atomic::AtomicBool>,
}

pub(crate) enum Job {
    Shard(u64),
    All,
    Stop,
}
