//! `remote-tier`: caches that live in object storage (S3, GCS, Azure, any
//! S3-compatible server, HTTP, a local directory or memory), read through
//! a bounded local disk tier that several processes on one machine share.
//!
//! Store files are immutable once written (segments, shards, finalized
//! `.bin` arrays, page files), which makes a read-through tier simple and
//! safe:
//!
//! - **Whole small files, blocks of large ones.** An object up to
//!   [`TierConfig::whole_file_max`] is fetched whole on first open. A
//!   larger one gets a sparse local file of its full size; each
//!   [`RemoteFile::ensure`] fetches the fixed-size blocks (8 MiB by
//!   default) that cover the bytes asked for, so readers keep mapping a
//!   local file and stay zero-copy. The next blocks are prefetched in the
//!   background with bounded parallelism.
//! - **Verified.** Every response's length is checked; a whole fetch is
//!   checked against the size and BLAKE3 the caller knows ([`Expected`])
//!   before it is renamed into place. A large object whose publisher
//!   recorded the BLAKE3 of each block ([`BlockHashes`], a [`BlockList`])
//!   is opened with [`RemoteTier::open_verified`]: its sparse file uses
//!   the recorded block size and every block is checked before a byte of
//!   it is written (a mismatch is fetched once more, then is
//!   [`Error::BlockMismatch`]), so a reader is never served a bad block.
//!   Without such a list, ranged reads carry the object's etag
//!   (`If-Match`), so an object that changed is an error, never a mix,
//!   and [`RemoteTier::fetch`] checks the whole BLAKE3 once all of it is
//!   local. Blocks already local are never hashed again on read.
//! - **Crash-safe and shared.** Fetches land under a temporary name or in
//!   a block that the block map marks only after the bytes are written:
//!   durable once fsynced, and until then *unsynced*, recorded with this
//!   boot's id (the block map format, `src/format.rs`). Every process of the same
//!   boot reads unsynced blocks from the page cache; after a reboot or
//!   power cut they are fetched again, never served as left. So a fetch
//!   never waits for the disk, and the last handle of an object in a
//!   process makes its blocks durable when dropped
//!   ([`RemoteFile::sync`]). The map itself is replaced atomically. One `flock` per block makes a
//!   block fetched once serve every thread and process; the others wait
//!   and find it done.
//! - **Bounded, in O(1) per fetch.** Every fetch first reserves its bytes
//!   in `tier.state`, a small file every process of the tier maps (the
//!   node's counted bytes, an eviction generation, fetch statistics:
//!   [`RemoteTier::stats`], [`TierStats::read`]). Only when the count
//!   would pass [`TierConfig::tier_budget`] does one eviction pass run,
//!   down to the budget less a slack, so a scan serves many fetches.
//!   Idle copies go first, least recently used first; then blocks inside
//!   copies open by [`RemoteTier::open_leased`] that no [`Lease`] holds
//!   (hole-punched: the sparse file keeps its size), unplanned ones by
//!   their last use, then planned ones, farthest next use first. So even
//!   one open object larger than the budget stays within it. The tier
//!   only ever holds fetched copies, so eviction never removes the only
//!   copy of anything, and never a block a read is using: a reader
//!   leases the blocks it reads ([`RemoteFile::lease`]), and a block's
//!   bit leaves its map before its bytes are freed. Objects open by the
//!   other `open*` calls (mapped whole by their readers) are kept whole.
//! - **One budget per node.** Every store and process that opens the tier
//!   directory spends the same budget. A store that would keep its files
//!   whole (mapped) asks the tier first ([`RemoteTier::claim_whole`]):
//!   the claims of every living process fit the budget together, so two
//!   caches that each fit it alone are never both mapped whole. The count
//!   gives back exactly what each copy took (a sparse copy's metadata
//!   allowance included) and keeps the reservations of fetches in flight
//!   across a rebuild (each process also records its own in its pin
//!   record), so it tracks the disk however many copies come and go.
//! - **Uploads.** [`RemoteTier::put_file`] uploads immutable files
//!   (multipart above [`TierConfig::part_size`]); [`RemoteTier::commit`]
//!   writes a commit record with a conditional put, so two writers can
//!   never both claim one name.
//! - **Requests** run on one runtime that every tier of the process
//!   shares (callers stay synchronous), each under a timeout, and those
//!   safe to repeat are retried with backoff ([`RetryPolicy`]). Stores
//!   built by [`build_store`] share one HTTP client per configuration, so
//!   opening a second tier in a process costs no new client (whose TLS
//!   roots take milliseconds to load) and reuses open connections; a
//!   forked child builds its own of both. Credentials and endpoints
//!   come from the environment variables and options of `object_store`;
//!   errors show URLs without credentials or query.
//!
//! # On disk (the local tier)
//! ```text
//! <tier_dir>/
//!   tier.lock               flock held while block maps change or copies are evicted
//!   objects/<key>.whole     a small object fetched whole and verified
//!   objects/<key>.sparse    a large object: its full size, fetched blocks in place
//!   objects/<key>.blocks    which blocks of <key>.sparse are there (see below)
//!   tier.state              4 KiB, mapped by every process: counted bytes, eviction
//!                           generation, dirty mark, block-use clock, statistics (`src/state.rs`)
//!   objects/<key>.touch     a sparse copy's block-use clocks, for the LRU: a u64 per group
//!                           of 16 blocks
//!   pins/<host>-<pid>-<nanos>-<n>  one process's pin record, flocked while it lives: three
//!                           bitmaps of 2^22 buckets (512 KiB each): keys it has open, keys
//!                           it needs whole, and `<key>#<block>` it leases; then a page of
//!                           words: its reservations in flight and its whole claims (made,
//!                           locked and sized under tmp/, then renamed here); a dead
//!                           process's is removed
//!   plans/                  the readers' plan records (`src/plans.rs`)
//!   locks/<key>.<n>.fetch   flock of the one fetcher of block n (`all`: the whole object);
//!                           removed by the fetcher when its fetch is done
//!   tmp/<key>.<host>.<pid>.<n>.tmp  fetches in flight; this host's dead processes' are
//!                           removed on open
//! ```
//! A process holds one descriptor per tier for its pins, and at most
//! 64 local copies open at once (the least recently used is closed and
//! opened again by its path when next read), so neither grows with the
//! number of objects open. Open removes the fetch locks dead processes
//! left.
//!
//! `<key>` is the object name with `%` and `/` escaped (`a/b` →
//! `a%2Fb`). A block map is `CXBLKMAP`, version, block size, object size,
//! etag, (version 2) the digest of the block list its blocks were checked
//! against, one bit per block, and a BLAKE3 of all of it; one that does
//! not check is discarded and the object's blocks fetched again. A copy
//! made under one block list (or none) serves only readers of that list
//! (or none): any other gets a fresh sparse file, so a block map never
//! claims a check its blocks did not pass.
//!
//! # Example
//! ```
//! use std::os::unix::fs::FileExt;
//!
//! use remote_tier::{Expected, RemoteTier, TierConfig};
//!
//! let local = tempfile::tempdir()?;
//! let mut config = TierConfig::new(local.path(), 64 << 20);
//! config.block_size = 1 << 20;
//! config.whole_file_max = 1 << 20;
//! let tier = RemoteTier::open("memory:///caches/demo", config)?;
//!
//! // Immutable files first, the commit record last.
//! let segment: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
//! tier.put_bytes("segments/000001.arrow", segment.clone())?;
//! tier.commit("commits/000001.json", r#"{"segment":1,"writer":"a"}"#)?;
//! assert!(tier.commit("commits/000001.json", r#"{"segment":1,"writer":"b"}"#).is_err());
//!
//! // A large object is fetched by blocks, on demand.
//! let file = tier.open_object("segments/000001.arrow")?;
//! let mut buf = [0u8; 4];
//! file.read_at(2_500_000, &mut buf)?;
//! assert_eq!(buf, segment[2_500_000..2_500_004]);
//!
//! // Checked block by block against the hashes its publisher recorded.
//! let mut by_block = remote_tier::BlockHasher::new(1 << 20);
//! by_block.update(&segment);
//! let hashes = std::sync::Arc::new(by_block.finalize()?);
//! let checked = tier.open_verified("segments/000001.arrow", hashes)?;
//! checked.read_at(2_500_000, &mut buf)?;
//! assert_eq!(buf, segment[2_500_000..2_500_004]);
//!
//! // Or read under leases: blocks no lease holds may be freed while it is
//! // open, so the copy stays within the budget whatever its size.
//! let leased = tier.open_leased("segments/000001.arrow", None)?;
//! let lease = leased.lease(&[2_500_000..2_500_004, 10..20])?;
//! leased.file()?.read_exact_at(&mut buf, 2_500_000)?;
//! drop(lease);
//! assert_eq!(buf, segment[2_500_000..2_500_004]);
//! assert!(tier.stats()?.allocated <= 64 << 20);
//!
//! // Or all of it, verified.
//! let hash = *blake3::hash(&segment).as_bytes();
//! let expected = Expected { size: Some(segment.len() as u64), blake3: Some(hash) };
//! let whole = tier.fetch("segments/000001.arrow", &expected)?;
//! assert!(whole.is_complete());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod blocks;
mod config;
mod constants;
mod engine;
mod error;
mod evict;
mod file;
mod format;
#[doc(hidden)]
pub mod fuzz_entry;
mod local;
mod object_state;
mod open_files;
mod pins;
mod plans;
mod remote;
mod shared;
mod state;
mod store_url;
#[cfg(test)]
mod tests;
mod tier;
mod victims;
mod warm;

pub use blocks::{
    BLOCK_LIST_VERSION, BlockHasher, BlockHashes, BlockList, MAX_BLOCK_SIZE, MAX_BLOCKS,
    MIN_BLOCK_SIZE,
};
pub use config::TierConfig;
pub use constants::{DEFAULT_BLOCK_SIZE, PROBE_DIR};
pub use engine::{Expected, ObjectInfo};
pub use error::{BlockMismatch, Error, Result};
pub use file::{ObjectReads, RemoteFile, set_plans};
pub use local::EvictReport;
pub use pins::{Claim, Lease};
pub use plans::{BlockUse, PlanHandle};
pub use remote::RetryPolicy;
pub use state::TierStats;
pub use store_url::{build_store, redact_url};
pub use tier::RemoteTier;
pub use warm::{Warming, WarmingSet};
