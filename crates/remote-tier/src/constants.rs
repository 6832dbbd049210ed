//! The tier's constants in one place: the names inside its directory,
//! the page it counts in, and the sizes and shares its read-ahead,
//! eviction and bookkeeping use. The byte layouts of its files (offsets,
//! magic numbers, versions) stay with the code that reads and writes
//! each one: `format.rs` (block maps), `state.rs` (`tier.state`),
//! `pins.rs` (pin records), `plans/record.rs` (plan records).

use std::time::Duration;

// The tier directory (see the crate docs for what each holds).

/// The fetched copies: `<key>.whole`, `<key>.sparse`, `<key>.blocks`,
/// `<key>.touch`.
pub(crate) const OBJECTS_DIR: &str = "objects";
/// The fetch locks, `<key>.<n>.fetch`.
pub(crate) const LOCKS_DIR: &str = "locks";
/// Fetches in flight and records being made.
pub(crate) const TMP_DIR: &str = "tmp";
/// The pin records, one a process.
pub(crate) const PINS_DIR: &str = "pins";
/// The plan records, one a registrant.
pub(crate) const PLANS_DIR: &str = "plans";
/// The file every process of the tier maps: the count, the generation,
/// the statistics.
pub(crate) const STATE_FILE: &str = "tier.state";
/// The lock held while block maps change, copies are evicted or the
/// count is changed.
pub(crate) const LOCK_FILE: &str = "tier.lock";

/// Suffix of a whole fetched object (complete and verified).
pub(crate) const WHOLE: &str = ".whole";
/// Suffix of the sparse local file of a block-fetched object.
pub(crate) const SPARSE: &str = ".sparse";
/// Suffix of a block-fetched object's block map.
pub(crate) const BLOCKS: &str = ".blocks";
/// Suffix of a sparse copy's touch clocks: a `u64` per group of
/// [`TOUCH_GROUP`] blocks, the logical time of the group's last lease.
pub(crate) const TOUCH: &str = ".touch";
/// Suffix of a plan record.
pub(crate) const PLAN_SUFFIX: &str = ".plan";

/// Where the conditional-put probe objects go under the URL (each
/// removed after its probe).
pub const PROBE_DIR: &str = "_cachex_probe";

// Sizes.

/// 8 MiB: the default block of a block-fetched object and part of a
/// multipart upload (S3 parts are at least 5 MiB).
pub const DEFAULT_BLOCK_SIZE: u64 = 8 << 20;

/// The page every count is rounded to.
pub(crate) const PAGE: u64 = 4096;

/// Blocks that share one touch clock: the LRU order of a sparse copy's
/// blocks is kept per group of this many (64 KiB at 4 KiB blocks), so its
/// clocks take half a byte a block (1/8192 of a copy of 4 KiB blocks),
/// not 8 bytes (1/512), of the budget they are counted in. Blocks read
/// together share a group anyway; those of one group leave together in
/// block order.
pub(crate) const TOUCH_GROUP: u64 = 16;

/// Object keys longer than this are shortened (file names stop at 255
/// bytes).
pub(crate) const MAX_KEY: usize = 160;

/// The most bytes one request of adjacent blocks fetches (8 MiB, the
/// tier's default block): small blocks (a segment's 4 KiB) read together
/// cost a request per run, not per block.
pub(crate) const RUN_BYTES: u64 = 8 << 20;

// Read-ahead.

/// A read-ahead takes at most 1/this of the tier's budget.
pub(crate) const READ_AHEAD_SHARE: u64 = 4;

/// How many batches ahead a block must be planned for a read-ahead to
/// fetch it while a live plan reads its object.
pub(crate) const PLANNED_READ_AHEAD: u64 = 2;

// Eviction.

/// Without a plan, an eviction pass frees 1/this of the budget beyond
/// what it is asked for (at most [`LRU_SLACK_MAX`]), so that one scan
/// serves many fetches.
pub(crate) const LRU_SLACK_SHARE: u64 = 16;

/// The most an eviction pass frees beyond what it is asked for.
pub(crate) const LRU_SLACK_MAX: u64 = 64 << 20;

/// Under a plan the slack is 1/this of the bytes the plans must fetch
/// each epoch anyway (their epoch's blocks less the budget).
pub(crate) const PLANNED_SLACK: u64 = 64;

/// A prefetch's pass under a plan frees 1/this of a read's slack.
pub(crate) const PREFETCH_SHARE: u64 = 4;

/// The most released lease buckets a process leaves set, per tier: a
/// loop of one lease per sample on one block then costs a mutex, not a
/// `flock` of `tier.lock` per sample. The price: up to this many blocks
/// per process that eviction cannot free.
pub(crate) const STICKY: usize = 4;

/// How old a temporary plan record with no live writer must be before it
/// is removed (its writer takes its lock right after creating it).
pub(crate) const STALE_TEMP: Duration = Duration::from_secs(60);

// Processes.

/// The most local copies a process keeps open at once (about as many as
/// segment-store keeps mapped).
pub(crate) const OPEN_FILES: usize = 64;

/// Distinct HTTP client configurations a process keeps; more are built
/// per store.
pub(crate) const MAX_CLIENTS: usize = 16;

/// What a caller waits beyond the time its request's attempts and
/// backoffs may take, before it gives up on an answer (a runtime gone, a
/// task stuck).
pub(crate) const WAIT_SLACK: Duration = Duration::from_secs(5);
