//! `tier.state`: the node's counted bytes, eviction generation and fetch
//! statistics, in one small file every process of the tier maps, so that
//! a fetch learns whether it fits the budget with one atomic load instead
//! of a scan of `objects/`.
//!
//! The file is 4 KiB, made once at full size and never truncated or
//! replaced (a bad header is rewritten in place, under `tier.lock`). Every
//! field is a little-endian `u64` at an 8-byte-aligned offset, read and
//! written as an atomic:
//!
//! ```text
//! 0   magic "CXTIERST"          8   version (1)
//! 16  boot id (16 bytes)        32  allocated: counted bytes of objects/ and tmp/
//! 40  generation: bumped whenever a copy or a block is removed
//! 48  dirty: pid of a holder of tier.lock mid-change (0: clean)
//! 56  clock: the logical clock of block uses (the `.touch` files)
//! 64  fetched_bytes   72 get_requests   80 head_requests
//! 88  evicted_bytes   96 punched_blocks 104 rebuilds   112 over_budget
//! 120 misses
//! 128 budget: the tier_budget of the last process to open the tier
//! 136 budget_pid: that process's id (0: no budget recorded yet)
//! 144..2048 reserved (zero)
//! 2048 hits, in 16 stripes of one u64 every 128 bytes (2048, 2176, …,
//!      3968): the count is their sum
//! ```
//!
//! The words from 120 on were reserved (zero) before misses, the budget
//! and hits were recorded: a file from then reads 0 there (no read
//! counted, no budget recorded), so the version stays 1.
//!
//! **Hits and misses** count read calls, not blocks or bytes: each
//! [`ensure`](crate::RemoteFile::ensure), `ensure_exact`, `lease`,
//! `lease_exact` or `read_at` of some bytes is a hit when every block it
//! asks for is local, a miss when it fetches one (or waits on another
//! process's fetch of one). The first read of a whole copy that its open
//! fetched is a miss too. Prefetches and warms are not reads; reads of a
//! mapping are not seen. Each call adds 1, relaxed, to one word. Hits
//! are striped, as every local read counts one: a thread adds to its own
//! stripe (chosen from its process id and its order of birth), on a
//! cache line of its own, so threads and processes reading at once do
//! not all write one line.
//!
//! `allocated` changes only under `tier.lock`, between `dirty = pid` and
//! `dirty = 0`. It is the sum of what each copy counts (see
//! [`LocalDir::counted`](crate::local::LocalDir::counted)) and of the
//! reservations in flight, which each process also keeps in its pin
//! record ([`crate::pins::Word::Reserved`]). A holder that finds `dirty`
//! set knows the last holder died mid-change (flock goes with its
//! process) and rebuilds the count: what each copy counts, plus the
//! reservations in flight of the living processes. So does one that finds
//! another boot's id (the unsynced blocks of that boot are dropped from
//! the maps), or a new or damaged file; nothing else asks for a rebuild.
//! A dead process's reservations in flight are taken off the count when
//! its pin record is removed.
//!
//! **Units.** A block `s..e` counts the 4 KiB pages it touches,
//! `(ceil(e/4096) − floor(s/4096))·4096`; a whole copy its `st_blocks·512`;
//! a sparse copy's block map, touch clocks and extent metadata a fixed
//! allowance ([`meta_bytes`]), from its creation to its removal. The
//! count exceeds the disk by at most the allowances of the sparse copies
//! present (what their metadata files do not yet use), and falls short
//! of it only by extent-tree pages past the first of a copy and by bytes
//! no map marks (a fetch that died between its write and its mark, which
//! the block's next fetch overwrites).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use memmap2::MmapMut;

use crate::constants::{PAGE, STATE_FILE, TOUCH_GROUP};
use crate::{Error, Result};

/// The file's size.
const SIZE: usize = 4096;
const MAGIC: u64 = u64::from_le_bytes(*b"CXTIERST");
const VERSION: u64 = 1;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_BOOT: usize = 16;
const OFF_ALLOCATED: usize = 32;
const OFF_GENERATION: usize = 40;
const OFF_DIRTY: usize = 48;
const OFF_CLOCK: usize = 56;
const OFF_FETCHED: usize = 64;
const OFF_GETS: usize = 72;
const OFF_HEADS: usize = 80;
const OFF_EVICTED: usize = 88;
const OFF_PUNCHED: usize = 96;
const OFF_REBUILDS: usize = 104;
const OFF_OVER: usize = 112;
const OFF_MISSES: usize = 120;
const OFF_BUDGET: usize = 128;
const OFF_BUDGET_PID: usize = 136;
const OFF_HIT_STRIPES: usize = 2048;
const HIT_STRIPES: usize = 16;
/// Two cache lines of 64 bytes (some CPUs fetch lines in pairs).
const STRIPE_STRIDE: usize = 128;

/// The offset of the calling thread's stripe of the hit count.
fn hit_stripe() -> usize {
    static BORN: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = (std::process::id() as usize)
            .wrapping_add(BORN.fetch_add(1, Ordering::Relaxed))
            % HIT_STRIPES;
    }
    OFF_HIT_STRIPES + STRIPE.with(|s| *s) * STRIPE_STRIDE
}

/// The counters of a tier, as [`TierStats::read`] or
/// [`RemoteTier::stats`](crate::RemoteTier::stats) found them: shared by
/// every process of the node that uses the tier directory, since the
/// file was made (or its last rebuild, for `allocated`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Bytes the tier counts as allocated (objects, their metadata and
    /// fetches in flight), never less than the disk holds.
    pub allocated: u64,
    /// Bumped every time a copy or a block is removed.
    pub generation: u64,
    /// Bytes fetched from the store (ranged and whole GETs).
    pub fetched_bytes: u64,
    /// GET requests made (ranged and whole; the retries inside one
    /// request are not counted apart).
    pub get_requests: u64,
    /// HEAD requests made.
    pub head_requests: u64,
    /// Bytes freed by eviction (whole copies and punched blocks).
    pub evicted_bytes: u64,
    /// Blocks freed inside copies (hole-punched).
    pub punched_blocks: u64,
    /// Times the count was rebuilt by a scan of `objects/`.
    pub rebuilds: u64,
    /// Reads that found no room (everything leased or pinned) and went
    /// over the budget.
    pub over_budget: u64,
    /// Read calls served from the local copy, every block they asked for
    /// already there (calls, not blocks: see the layout of `tier.state`
    /// in `state.rs`).
    pub hits: u64,
    /// Read calls that fetched a block (or waited on another process's
    /// fetch of it), the first read of a whole copy its open fetched
    /// included.
    pub misses: u64,
}

impl TierStats {
    /// Reads the counters of the tier at `tier_dir` (its `tier.state`)
    /// without taking any lock: each field is as some moment left it.
    /// [`Error::NotATier`] when the directory has no `tier.state`,
    /// [`Error::DamagedState`] when it is not one this build reads.
    pub fn read(tier_dir: &Path) -> Result<TierStats> {
        read_state(tier_dir).map(|(stats, _)| stats)
    }

    /// The share of read calls that were hits, `None` before any read.
    pub fn hit_ratio(&self) -> Option<f64> {
        let reads = self.hits.saturating_add(self.misses);
        (reads > 0).then(|| self.hits as f64 / reads as f64)
    }
}

/// The budget the last process to open a tier gave it
/// ([`TierConfig::tier_budget`](crate::TierConfig::tier_budget)),
/// recorded in `tier.state`. Processes may open one tier with different
/// budgets; each fetch keeps to its own process's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierBudget {
    /// The budget, in bytes.
    pub bytes: u64,
    /// The process that recorded it.
    pub pid: u32,
}

/// The counters and the recorded budget of the tier at `tier_dir`, read
/// from its `tier.state` without a lock or a map.
pub(crate) fn read_state(tier_dir: &Path) -> Result<(TierStats, Option<TierBudget>)> {
    let path = tier_dir.join(STATE_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Err(Error::NotATier {
                path: tier_dir.to_path_buf(),
            });
        }
        Err(e) => return Err(Error::io("open tier state", &path)(e)),
    };
    let damaged = |problem: String| Error::DamagedState {
        path: path.clone(),
        problem,
    };
    let len = file
        .metadata()
        .map_err(Error::io("stat tier state", &path))?
        .len();
    if len < SIZE as u64 {
        return Err(damaged(format!(
            "{len} bytes, where a tier state has {SIZE}"
        )));
    }
    let mut bytes = [0u8; SIZE];
    file.read_exact_at(&mut bytes, 0)
        .map_err(Error::io("read tier state", &path))?;
    let word = |off: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[off..off + 8]);
        u64::from_le_bytes(w)
    };
    if word(OFF_MAGIC) != MAGIC {
        return Err(damaged("bad magic (not CXTIERST)".into()));
    }
    let version = word(OFF_VERSION);
    if version != VERSION {
        return Err(damaged(format!(
            "version {version}, this build reads {VERSION}"
        )));
    }
    Ok((stats_of(word), budget_of(word)))
}

/// The counters, each field as `word` reads it at its offset.
fn stats_of(word: impl Fn(usize) -> u64) -> TierStats {
    TierStats {
        allocated: word(OFF_ALLOCATED),
        generation: word(OFF_GENERATION),
        fetched_bytes: word(OFF_FETCHED),
        get_requests: word(OFF_GETS),
        head_requests: word(OFF_HEADS),
        evicted_bytes: word(OFF_EVICTED),
        punched_blocks: word(OFF_PUNCHED),
        rebuilds: word(OFF_REBUILDS),
        over_budget: word(OFF_OVER),
        hits: (0..HIT_STRIPES)
            .map(|i| word(OFF_HIT_STRIPES + i * STRIPE_STRIDE))
            .fold(0, u64::wrapping_add),
        misses: word(OFF_MISSES),
    }
}

/// The recorded budget, `None` when no process recorded one (a file
/// from before the field: its pid word reads 0).
fn budget_of(word: impl Fn(usize) -> u64) -> Option<TierBudget> {
    let pid = u32::try_from(word(OFF_BUDGET_PID))
        .ok()
        .filter(|&p| p != 0)?;
    Some(TierBudget {
        bytes: word(OFF_BUDGET),
        pid,
    })
}

/// A statistic of [`TierStats`] bumped without a lock.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stat {
    FetchedBytes,
    GetRequests,
    HeadRequests,
    EvictedBytes,
    PunchedBlocks,
    OverBudget,
    Hits,
    Misses,
}

/// The mapped `tier.state` of one tier directory.
pub(crate) struct TierState {
    map: MmapMut,
    path: PathBuf,
    /// The header was made or repaired by this process and the count is
    /// not yet rebuilt.
    fresh: AtomicU64,
}

impl std::fmt::Debug for TierState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierState")
            .field("path", &self.path)
            .finish()
    }
}

/// The pages a byte range `s..e` of a file touches, in bytes.
pub(crate) fn units(range: std::ops::Range<u64>) -> u64 {
    if range.is_empty() {
        return 0;
    }
    (range.end.div_ceil(PAGE) - range.start / PAGE) * PAGE
}

/// The count of a sparse copy's metadata: its block map (at its largest,
/// every block also unsynced), its touch clocks (8 bytes a group of
/// [`TOUCH_GROUP`] blocks) and a page of
/// extent tree.
pub(crate) fn meta_bytes(blocks: u64, etag_len: usize) -> u64 {
    let map = 512 + etag_len as u64 + 2 * blocks.div_ceil(8);
    let clocks = blocks.div_ceil(TOUCH_GROUP).saturating_mul(8);
    units(0..map) + units(0..clocks) + PAGE
}

impl TierState {
    /// Maps (creating) `<root>/tier.state`.
    pub(crate) fn open(root: &Path) -> Result<TierState> {
        let path = root.join(STATE_FILE);
        let mut header = vec![0u8; SIZE];
        header[OFF_MAGIC..OFF_MAGIC + 8].copy_from_slice(&MAGIC.to_le_bytes());
        header[OFF_VERSION..OFF_VERSION + 8].copy_from_slice(&VERSION.to_le_bytes());
        // Dirty from birth: the first holder of tier.lock counts what is there.
        header[OFF_DIRTY..OFF_DIRTY + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        if !path.exists() {
            // Of processes racing to make it, one wins; the others map its.
            durable_fs::write_new_atomic(&path, &header)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(Error::io("open tier state", &path))?;
        let len = file
            .metadata()
            .map_err(Error::io("stat tier state", &path))?
            .len();
        if len < SIZE as u64 {
            // Only ever grown: a mapping another process holds stays valid.
            file.set_len(SIZE as u64)
                .map_err(Error::io("size tier state", &path))?;
        }
        // SAFETY: the file is at least SIZE bytes and is never truncated
        // (only grown, above, or rewritten in place): the mapping stays
        // backed for its life. Other processes write it concurrently, so
        // the bytes are only ever accessed as `AtomicU64`s at aligned
        // offsets (`word`), never through a `&[u8]` or `&mut [u8]`.
        let map = unsafe { memmap2::MmapOptions::new().len(SIZE).map_mut(&file) }
            .map_err(Error::io("map tier state", &path))?;
        let state = TierState {
            map,
            path,
            fresh: AtomicU64::new(0),
        };
        if state.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || state.word(OFF_VERSION).load(Ordering::Acquire) != VERSION
        {
            state.fresh.store(1, Ordering::Relaxed);
        }
        Ok(state)
    }

    /// The field at byte `off`.
    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(
            off.is_multiple_of(8) && off + 8 <= SIZE,
            "tier state offset {off}"
        );
        // SAFETY: the mapping is SIZE bytes, page-aligned and lives as long
        // as `self`; `off` is one of this module's constant offsets, all
        // in bounds and 8-byte aligned (checked in debug builds), so the pointer is valid and aligned for an AtomicU64.
        // The mapping is shared with other processes, which is why every
        // access goes through an atomic.
        unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) }
    }

    /// The counted bytes.
    pub(crate) fn allocated(&self) -> u64 {
        self.word(OFF_ALLOCATED).load(Ordering::Acquire)
    }

    /// Adds `n` counted bytes (under `tier.lock`).
    pub(crate) fn add(&self, n: u64) {
        if n > 0 {
            self.word(OFF_ALLOCATED).fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Removes `n` counted bytes, stopping at zero.
    pub(crate) fn sub(&self, n: u64) {
        if n > 0 {
            let _ =
                self.word(OFF_ALLOCATED)
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                        Some(a.saturating_sub(n))
                    });
        }
    }

    /// The eviction generation: changes whenever a copy or block goes.
    pub(crate) fn generation(&self) -> u64 {
        self.word(OFF_GENERATION).load(Ordering::Acquire)
    }

    /// Bumps the generation (under `tier.lock`, once the block maps of the
    /// bytes freed are written).
    pub(crate) fn bump_generation(&self) {
        self.word(OFF_GENERATION).fetch_add(1, Ordering::AcqRel);
    }

    /// The next tick of the block-use clock.
    pub(crate) fn tick(&self) -> u64 {
        self.word(OFF_CLOCK).fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Adds `n` to a statistic.
    pub(crate) fn count(&self, stat: Stat, n: u64) {
        let off = match stat {
            Stat::FetchedBytes => OFF_FETCHED,
            Stat::GetRequests => OFF_GETS,
            Stat::HeadRequests => OFF_HEADS,
            Stat::EvictedBytes => OFF_EVICTED,
            Stat::PunchedBlocks => OFF_PUNCHED,
            Stat::OverBudget => OFF_OVER,
            Stat::Hits => hit_stripe(),
            Stat::Misses => OFF_MISSES,
        };
        self.word(off).fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now.
    pub(crate) fn stats(&self) -> TierStats {
        stats_of(|off| self.word(off).load(Ordering::Acquire))
    }

    /// Records `bytes` as the tier's budget, set by this process (the
    /// last opener's wins).
    pub(crate) fn record_budget(&self, bytes: u64) {
        self.word(OFF_BUDGET).store(bytes, Ordering::Release);
        self.word(OFF_BUDGET_PID)
            .store(u64::from(std::process::id()), Ordering::Release);
    }

    /// Marks the count mid-change by this process until the returned
    /// guard drops (call with `tier.lock` held): a holder that finds the
    /// mark knows this process died mid-change.
    pub(crate) fn changing(&self) -> Changing<'_> {
        self.word(OFF_DIRTY)
            .store(u64::from(std::process::id()), Ordering::Release);
        Changing(self)
    }

    /// Whether the count must be rebuilt before it is trusted (call with
    /// `tier.lock` held): a holder died mid-change, another boot counted
    /// it, or the header is new or damaged.
    pub(crate) fn stale(&self) -> bool {
        self.fresh.load(Ordering::Relaxed) != 0
            || self.word(OFF_DIRTY).load(Ordering::Acquire) != 0
            || self.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || self.word(OFF_VERSION).load(Ordering::Acquire) != VERSION
            || self.boot() != durable_fs::boot_id().unwrap_or([0; 16])
    }

    fn boot(&self) -> [u8; 16] {
        let mut boot = [0u8; 16];
        boot[..8].copy_from_slice(&self.word(OFF_BOOT).load(Ordering::Acquire).to_le_bytes());
        boot[8..].copy_from_slice(
            &self
                .word(OFF_BOOT + 8)
                .load(Ordering::Acquire)
                .to_le_bytes(),
        );
        boot
    }

    /// Sets the count to `allocated` (a scan's), of this boot, and counts
    /// the rebuild; repairs a damaged header (call with `tier.lock` held).
    pub(crate) fn rebuilt(&self, allocated: u64) {
        let boot = durable_fs::boot_id().unwrap_or([0; 16]);
        let half = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&boot[i..i + 8]);
            u64::from_le_bytes(w)
        };
        if self.word(OFF_MAGIC).load(Ordering::Acquire) != MAGIC
            || self.word(OFF_VERSION).load(Ordering::Acquire) != VERSION
        {
            for off in (OFF_BOOT..SIZE).step_by(8) {
                self.word(off).store(0, Ordering::Relaxed);
            }
            self.word(OFF_VERSION).store(VERSION, Ordering::Release);
            self.word(OFF_MAGIC).store(MAGIC, Ordering::Release);
        }
        self.word(OFF_BOOT).store(half(0), Ordering::Release);
        self.word(OFF_BOOT + 8).store(half(8), Ordering::Release);
        self.word(OFF_ALLOCATED).store(allocated, Ordering::Release);
        self.word(OFF_REBUILDS).fetch_add(1, Ordering::AcqRel);
        self.word(OFF_DIRTY).store(0, Ordering::Release);
        self.fresh.store(0, Ordering::Relaxed);
    }
}

/// The dirty mark of a change to the count in progress; cleared on drop.
pub(crate) struct Changing<'a>(&'a TierState);

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        self.0.word(OFF_DIRTY).store(0, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_count_the_pages_a_range_touches() {
        assert_eq!(units(0..0), 0);
        assert_eq!(units(0..1), 4096);
        assert_eq!(units(4095..4097), 8192);
        assert_eq!(units(65536..131072), 65536);
        assert_eq!(units(100..4096), 4096);
    }

    #[test]
    fn the_state_file_is_shared_and_read_without_a_map() {
        let dir = tempfile::tempdir().unwrap();
        let a = TierState::open(dir.path()).unwrap();
        assert!(a.stale(), "a new file is counted first");
        a.rebuilt(10);
        let b = TierState::open(dir.path()).unwrap();
        assert!(!b.stale());
        b.add(5);
        b.count(Stat::GetRequests, 2);
        {
            let _mid = a.changing();
            assert!(b.stale(), "a holder mid-change looks dead to the others");
        }
        assert!(!b.stale());
        a.bump_generation();
        let stats = TierStats::read(dir.path()).unwrap();
        assert_eq!(
            (
                stats.allocated,
                stats.get_requests,
                stats.generation,
                stats.rebuilds
            ),
            (15, 2, 1, 1)
        );
    }

    #[test]
    fn reads_and_the_budget_live_in_words_old_files_left_zero() {
        let dir = tempfile::tempdir().unwrap();
        let s = TierState::open(dir.path()).unwrap();
        s.rebuilt(0);
        // A file of version 1 from before these fields: zero from 120 on.
        let (stats, budget) = read_state(dir.path()).unwrap();
        assert_eq!((stats.hits, stats.misses, budget), (0, 0, None));
        assert_eq!(stats.hit_ratio(), None);
        s.count(Stat::Hits, 3);
        s.count(Stat::Misses, 1);
        s.record_budget(5 << 20);
        let (stats, budget) = read_state(dir.path()).unwrap();
        assert_eq!((stats.hits, stats.misses), (3, 1));
        assert_eq!(stats.hit_ratio(), Some(0.75));
        assert_eq!(
            budget,
            Some(TierBudget {
                bytes: 5 << 20,
                pid: std::process::id()
            })
        );
        let bytes = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
        assert_eq!(&bytes[OFF_VERSION..OFF_VERSION + 8], &1u64.to_le_bytes());
        assert!(
            bytes[OFF_BUDGET_PID + 8..OFF_HIT_STRIPES]
                .iter()
                .all(|&b| b == 0),
            "still reserved"
        );
    }

    #[test]
    fn hits_of_many_threads_land_on_stripes_and_sum() {
        let dir = tempfile::tempdir().unwrap();
        let s = TierState::open(dir.path()).unwrap();
        s.rebuilt(0);
        std::thread::scope(|scope| {
            for _ in 0..HIT_STRIPES {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        s.count(Stat::Hits, 1);
                    }
                });
            }
        });
        let hits = HIT_STRIPES as u64 * 1000;
        assert_eq!(TierStats::read(dir.path()).unwrap().hits, hits);
        let bytes = std::fs::read(dir.path().join(STATE_FILE)).unwrap();
        let stripes: Vec<u64> = (0..HIT_STRIPES)
            .map(|i| {
                let at = OFF_HIT_STRIPES + i * STRIPE_STRIDE;
                u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
            })
            .collect();
        assert_eq!(stripes.iter().sum::<u64>(), hits);
        // A thread keeps its stripe: each holds whole threads' counts.
        assert!(
            stripes.iter().all(|n| n.is_multiple_of(1000)),
            "{stripes:?}"
        );
        let mine = hit_stripe();
        assert!((OFF_HIT_STRIPES..SIZE).contains(&mine) && mine.is_multiple_of(STRIPE_STRIDE));
        assert_eq!(hit_stripe(), mine);
    }

    #[test]
    fn a_damaged_header_is_rebuilt_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(STATE_FILE), b"junk").unwrap();
        let s = TierState::open(dir.path()).unwrap();
        assert!(s.stale());
        s.rebuilt(7);
        assert!(!s.stale());
        assert_eq!(TierStats::read(dir.path()).unwrap().allocated, 7);
    }
}
