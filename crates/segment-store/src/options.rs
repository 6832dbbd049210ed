//! [`Options`]: how a store behaves.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use durable_fs::BoxError;

/// Makes a segment file whole on local disk before the store maps it.
///
/// For a cache whose segments are fetched on demand (one in object
/// storage, left sparse in a local tier): the store maps and validates a
/// whole segment, so one with bytes not fetched yet must never reach it.
/// Called with the segment's path and length each time the store is about
/// to map it; returns the file to map (`None`: the path itself), and with
/// [`keeping`](WholeSegment::keeping) what keeps that file whole: it is
/// dropped with the mapping, once the store let go of it and no record
/// read from it is left.
#[derive(Clone)]
pub struct WholeSegment(Arc<MakeWhole>);

/// What keeps a whole copy whole while a mapping of it lives (a pin on a
/// local tier's copy, say): see [`WholeSegment::keeping`].
pub type Keeper = Box<dyn std::any::Any + Send + Sync + std::panic::RefUnwindSafe>;

/// What a [`WholeSegment`] calls: the segment's path and length in, the
/// file to map and what keeps it whole out.
type MakeWhole =
    dyn Fn(&Path, u64) -> Result<Option<(File, Option<Keeper>)>, BoxError> + Send + Sync;

impl WholeSegment {
    /// A hook calling `f`.
    pub fn new(
        f: impl Fn(&Path, u64) -> Result<Option<File>, BoxError> + Send + Sync + 'static,
    ) -> WholeSegment {
        WholeSegment(Arc::new(move |path, len| {
            Ok(f(path, len)?.map(|file| (file, None)))
        }))
    }

    /// A hook calling `f`, whose file stays whole only while the
    /// [`Keeper`] it returns beside it lives: the store keeps that with
    /// the mapping, and drops it once the mapping is gone (unmapped by the
    /// store's bound on mappings, and no record read from it left).
    pub fn keeping(
        f: impl Fn(&Path, u64) -> Result<Option<(File, Keeper)>, BoxError> + Send + Sync + 'static,
    ) -> WholeSegment {
        WholeSegment(Arc::new(move |path, len| {
            Ok(f(path, len)?.map(|(file, keeper)| (file, Some(keeper))))
        }))
    }

    /// Makes the segment at `path` (of `len` bytes) whole; the file to map
    /// and what keeps it whole.
    pub(crate) fn call(
        &self,
        path: &Path,
        len: u64,
    ) -> Result<Option<(File, Option<Keeper>)>, BoxError> {
        (self.0)(path, len)
    }
}

impl std::fmt::Debug for WholeSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WholeSegment(..)")
    }
}

/// How a store behaves. `Options::default()` suits a single process.
#[derive(Debug, Clone)]
pub struct Options {
    /// Pending records that trigger a flush into a new segment (default 4096).
    pub flush_every: usize,
    /// Byte budget of the in-memory LRU of records read from segments
    /// (and, on a rank that does not persist, of the records it puts); 0
    /// disables it (default 64 MiB).
    pub lru_bytes: usize,
    /// Build and write segments on a background thread (default false),
    /// so `put_batch` never waits for them. By default the call that
    /// fills a segment builds and writes it, and the store's flush thread
    /// makes it durable (fsync, rename, index group) while the caller goes
    /// on, one segment at a time. Either way, errors there are returned by
    /// the next call or by [`SegmentStore::flush`](crate::SegmentStore::flush), which returns once
    /// everything is durable.
    pub async_write: bool,
    /// With `async_write`, flushes that may wait for the background
    /// thread before `put_batch` blocks (default 2).
    pub queue_depth: usize,
    /// The rank that persists (default 0).
    pub writer_rank: u32,
    /// This process's rank (default: the `RANK` environment variable, else 0).
    pub current_rank: u32,
    /// Open without the writer lock; puts are refused (default false).
    pub read_only: bool,
    /// Multi-writer mode: this handle persists as writer `id` (0 to
    /// [`format::MAX_WRITER_ID`](crate::format::MAX_WRITER_ID), typically the rank) beside any number
    /// of other writers, each into its own segment ids and index log, with
    /// no lock between them. `None` (the default) is the single-writer
    /// mode, where only `writer_rank` persists. Ignored when `read_only`.
    pub writer_id: Option<u32>,
    /// Segment files this store keeps memory-mapped at once (default
    /// 4096). Segments are mapped when a read needs them; beyond this
    /// many, the least recently used are unmapped (records already read
    /// keep their bytes). Linux allows a process 65,530 maps, and the
    /// stores of one process together keep at most half of that,
    /// whatever each one's bound. Mapping a segment again costs an open,
    /// an `mmap` and a decode of its footer (tens of µs): a cache of more
    /// segments than this, read uniformly at random, pays that on the
    /// share of reads that fall outside the bound, so raise it (or
    /// flush fewer, larger segments) when one store is all a process maps.
    pub max_maps: usize,
    /// Called before a segment is mapped, for segments that may not be
    /// whole on local disk (default `None`: every segment is). With it,
    /// segments are mapped only when a read needs them, never on open.
    pub whole_segment: Option<WholeSegment>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            flush_every: 4096,
            lru_bytes: 64 << 20,
            async_write: false,
            queue_depth: 2,
            writer_rank: 0,
            current_rank: std::env::var("RANK")
                .ok()
                .and_then(|r| r.trim().parse().ok())
                .unwrap_or(0),
            read_only: false,
            writer_id: None,
            max_maps: 4096,
            whole_segment: None,
        }
    }
}
