//! [`TierConfig`]: how a tier uses its local directory and the network.

use std::path::PathBuf;

use crate::constants::DEFAULT_BLOCK_SIZE;
use crate::remote::RetryPolicy;

/// How a [`RemoteTier`](crate::RemoteTier) uses its local directory and the network.
#[derive(Debug, Clone)]
pub struct TierConfig {
    /// The local tier: fetched copies, block maps, locks. Several
    /// processes may share one.
    pub tier_dir: PathBuf,
    /// Bytes the local tier may hold: every fetch reserves its bytes
    /// first and evicts what it must. Objects open whole in some reader
    /// are kept even over budget; those open by
    /// [`open_leased`](crate::RemoteTier::open_leased) keep only their
    /// leased blocks.
    pub tier_budget: u64,
    /// Large objects are fetched in blocks of this many bytes (those
    /// opened with a block list, in the list's block size), and a
    /// publisher records block lists in blocks of this size.
    pub block_size: u64,
    /// Objects up to this size are fetched whole (one request).
    pub whole_file_max: u64,
    /// Blocks fetched ahead of a read, in the background (0: none). The
    /// window opens at this size when a read continues the last one (or
    /// an object's first read starts at its beginning) and doubles while
    /// reads stay sequential, up to
    /// [`max_prefetch_blocks`](Self::max_prefetch_blocks); a read that
    /// jumps reads nothing ahead.
    pub prefetch_blocks: u64,
    /// The largest read-ahead window, in blocks.
    pub max_prefetch_blocks: u64,
    /// Requests in flight at once for one call (a whole-object fetch, a
    /// multipart upload) and, separately, for all prefetches of the tier.
    pub parallelism: usize,
    /// Files larger than this are uploaded in parts of this size.
    pub part_size: u64,
    /// Timeouts and retries of requests.
    pub retry: RetryPolicy,
    /// Only one writer ever publishes to this URL: commit records are
    /// written even where the server does not honour conditional puts
    /// (which are then not needed to keep two writers apart). Off by
    /// default: [`RemoteTier::commit`](crate::RemoteTier::commit) first checks, once per tier, that
    /// the server refuses a second put-if-absent of one name, and
    /// refuses to publish ([`Error::ConditionalPutIgnored`](crate::Error::ConditionalPutIgnored)) where it
    /// does not.
    pub single_publisher: bool,
}

impl TierConfig {
    /// The defaults (8 MiB blocks, a read-ahead of 4 blocks growing to
    /// 64, 8 requests in flight) for a local tier at `tier_dir` of at most `tier_budget` bytes.
    pub fn new(tier_dir: impl Into<PathBuf>, tier_budget: u64) -> TierConfig {
        TierConfig {
            tier_dir: tier_dir.into(),
            tier_budget,
            block_size: DEFAULT_BLOCK_SIZE,
            whole_file_max: DEFAULT_BLOCK_SIZE,
            prefetch_blocks: 4,
            max_prefetch_blocks: 64,
            parallelism: 8,
            part_size: DEFAULT_BLOCK_SIZE,
            retry: RetryPolicy::default(),
            single_publisher: false,
        }
    }
}
