//! `remote-cache`: every cachex store opened on an object-store URL
//! (`s3://bucket/prefix`, `gs://…`, `az://…`, `file:///…`) as well as on a
//! local directory — one [`Location`] type, parsed from the cache root a
//! user writes ([`Location::parse`]).
//!
//! The stores are unchanged: each keeps reading and writing a local
//! directory. For a remote location that directory is a *working
//! directory* that a [`RemoteDir`] keeps in step with a commit log in
//! object storage (see [`Commit`] for the records and [`RemoteDir`]
//! for the rules):
//!
//! - **Open** applies every published commit: files are fetched through
//!   the shared, bounded local tier of `remote-tier`, verified against
//!   their BLAKE3 and written into the working directory — or, for the
//!   large files a store maps and reads in parts (memmap-array's `.bin`
//!   arrays, page-alloc's page file) and for segments (read row by row
//!   in 4 KiB blocks, whatever their size), left as sparse files in the
//!   tier, linked into the working directory and fetched by block ranges
//!   as rows, samples and keys are read ([`RemoteMemmapArray`],
//!   [`RemotePages`], [`RemoteSegments::get_batch`]), each block checked
//!   against the BLAKE3 its commit recorded for it before it is kept.
//! - **Publish** ([`RemoteSegments::publish`], [`RemoteShards::publish`])
//!   uploads what the store wrote since — new segments and the bytes
//!   appended to index logs, new shards, replaced metadata — then writes
//!   the commit record last with a conditional put: a writer killed
//!   mid-publish leaves the remote cache at its last commit, and two
//!   writers can never both claim one file (one gets [`Error::Conflict`]).
//!   A writer need not call it: a [`Publisher`] publishes what its store
//!   persisted every few seconds, and what is left when the handle is
//!   dropped or the process exits ([`Publisher`]); a killed writer
//!   loses at most that interval.
//! - **Refresh** ([`RemoteSegments::refresh`], or on a period with
//!   [`RemoteSegments::refresh_every`]) applies what other processes
//!   published since, whole commits only. Reads never wait for its
//!   requests: they see the files of the last commit applied.
//! - **One log a directory** ([`LOG_OBJECT`]): every log has an identity,
//!   and a working directory never serves another log found at its URL
//!   (a prefix rebuilt, another endpoint): it starts over from it when
//!   opened, and an open handle refuses it ([`Error::OtherLog`]).
//! - **Removals.** What a writer removes (a compaction's old segments, a
//!   file deleted) is published in its commit, and readers remove those
//!   files on refresh; a store's local evictions (shard-store's disk
//!   budget, [`StoreFiles::evicted_locally`]) are never published.
//! - **Garbage** ([`gc()`]: `cachex gc`, `cachex du`): objects that no
//!   commit inside a retention window needs are deleted after a grace
//!   period, and the commits up to the window are folded into a
//!   checkpoint, from which a cold open starts: an open costs the same
//!   few requests after a million commits as after ten.
//! - **Whole directories** ([`push_dir`]: `cachex push`, `pull`): a
//!   directory published as one commit of the same log, and a log
//!   materialised into a directory.
//! - **Many machines, one commit** ([`mod@staged`]: `cachex.ray`'s
//!   sinks): writers upload their files as objects that no commit names,
//!   and one committer publishes them all as a single commit. On a local
//!   cache the same jobs stage their output beside it and commit with
//!   renames decided in a record first ([`StagingJob`], [`Decision`],
//!   [`recover_staging`]); a segment store's job becomes one multi-writer
//!   of it ([`decide_staged_segments`], [`decide_remote_segments`]).
//!
//! # One road from a URL
//!
//! Every caller — the stores' `Remote*` types here, the facade, the
//! `cachex` tool, the Python binding — goes from a cache root to an opened
//! directory the same way: [`Location::parse_with`] (a URL or a path, with
//! the caller's [`TierOptions`] over the environment's `CACHEX_TIER_DIR`
//! and `CACHEX_TIER_BUDGET`, which are read there and nowhere else), then
//! [`Location::open_dir`] for a [`StoreKind`], which yields a [`CacheDir`]
//! to open the store in and to [`publish`](CacheDir::publish) and
//! [`refresh`](CacheDir::refresh). Which files of a store stay on the
//! machine, which are read by blocks and whose removal is only a local
//! eviction, each store crate declares ([`StoreFiles`]); a URL is shown
//! only through [`redact_url`].
//!
//! Credentials and endpoints come from `object_store`'s environment
//! variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`) or options
//! ([`Location::with_options`]); they are never written to disk or shown
//! in errors.
//!
//! # Many writers, and shared file systems without `flock` (NFS, Lustre)
//!
//! Writers on many machines coordinate through the object store alone:
//! each commit number is claimed with a conditional put, on a server the
//! tier has checked honours it (publishing is refused where it does not,
//! unless `TierConfig::single_publisher` says one writer publishes), and
//! read back before it is trusted. That holds whatever file system the
//! writers' local directories are on.
//!
//! The local tier and the working directories are another matter: they
//! rely on `flock` for one fetcher per block, for keeping a copy that a
//! reader has open from eviction, for the tier's block maps, and for
//! giving each handle a working directory of its own. So:
//!
//! - **Holds everywhere:** commits are whole and in order, two writers
//!   never both claim one commit or one file, every byte read is checked
//!   against the BLAKE3 its commit recorded; temporary files are named by
//!   host and process, and a machine only removes those of its own dead
//!   processes, never another node's.
//! - **Holds where `flock` works across machines** (NFS v4 and Linux NFS
//!   clients, which map it to byte-range locks; Lustre mounted with
//!   `-o flock`): a tier directory may be shared by the machines too.
//! - **Does not hold where `flock` is local to a machine or missing**
//!   (NFS mounted with `local_lock=flock` or `local_lock=all`, Lustre
//!   with `-o localflock`): machines that share a tier directory may evict
//!   a copy another machine has open (its reads then fail with a stale
//!   file handle, never return wrong bytes, on NFS), lose each other's
//!   block-map updates (blocks fetched again), and two of them may take
//!   the same working directory, whose record of applied commits they
//!   then both append to. Where `flock` fails outright (Lustre with
//!   `-o noflock`: `ENOSYS`), opening fails with an error naming the lock
//!   file instead. Give every machine its own tier directory
//!   (`CACHEX_TIER_DIR` on local disk, or a directory per host on the
//!   shared file system): the object store stays the one shared place.
//!
//! # On disk
//! ```text
//! <url>/log.json                         the log's identity: a random id, created once with a
//!                                        conditional put before its first commit (and named
//!                                        in every commit since); see [`LOG_OBJECT`]
//! <url>/objects/<blake3>                 published bytes (content-addressed)
//! <url>/commits/<seq>.json               commit records, applied in order: pieces (with the
//!                                        BLAKE3 of each block of files read by blocks), then
//!                                        `removed`, the files the writer removed
//! <url>/checkpoints/<seq>.json           every file after commit seq, written by gc: where a
//!                                        cold open starts (the newest one)
//! <url>/leases/<writer>-<n>.json        a publish in flight: the objects its commit will name,
//!                                        kept by gc while the lease lives (see [`gc()`])
//! <url>/sweeps/<writer>-<n>.json        a gc deleting: the objects it may delete; a publish
//!                                        naming one waits for the sweep to end
//! <tier dir>/                            the local tier (remote-tier): fetched copies, budget
//! <tier dir>/work/<hash of url>[.<n>]/   a working directory the store opens: one
//!                                        per handle open at once (n = 0, 1, ...)
//!   .cachex-remote/lock, applied.jsonl   which commits are applied here (files written, removed)
//!   .cachex-remote/log.json              which log they are of: another log at the URL is
//!                                        started over from on open, refused by an open handle
//!   .cachex-remote/blocks/<blake3>.json  block lists of the files linked into the tier
//! ```
//! The records' formats and checks are in [`Commit`]; how a working
//! directory applies and publishes them in [`RemoteDir`].
//!
//! # Example
//! ```
//! use remote_cache::{Location, RemoteSegments};
//! use remote_tier::TierConfig;
//! use segment_store::Options;
//! use tensor_core::{Tensor, Value};
//!
//! let bucket = tempfile::tempdir()?; // stands for s3://bucket/prefix
//! let url = format!("file://{}", bucket.path().display());
//! let (tier_a, tier_b) = (tempfile::tempdir()?, tempfile::tempdir()?);
//!
//! // A writer on one machine: write, flush, publish.
//! let writer = RemoteSegments::open(
//!     &Location::remote(&url, TierConfig::new(tier_a.path(), 1 << 30)),
//!     Options { writer_id: Some(0), ..Options::default() },
//! )?;
//! let record = Value::from(Tensor::from_vec([2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?);
//! writer.put_batch(&[("a", record.clone())])?;
//! assert_eq!(writer.publish()?.seq, Some(1));
//!
//! // A reader on another: a cold local tier, then a refresh for more.
//! let reader = RemoteSegments::open(
//!     &Location::remote(&url, TierConfig::new(tier_b.path(), 1 << 30)),
//!     Options { read_only: true, ..Options::default() },
//! )?;
//! let (got, missing) = reader.get_batch(&["a"])?;
//! assert!(missing.is_empty() && got[0].as_ref() == Some(&record));
//! writer.put_batch(&[("b", record.clone())])?;
//! writer.publish()?;
//! reader.refresh()?;
//! assert_eq!(reader.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod commit;
mod error;
mod files;
#[doc(hidden)]
pub mod fuzz_entry;
mod gc;
#[doc(hidden)]
pub mod hooks;
mod lease;
mod links;
mod location;
mod log_id;
mod log_state;
mod prefetch;
mod publisher;
mod push_pull;
pub mod record;
mod remote_dir;
pub mod staged;
mod staged_segments;
mod staging;
mod store_kind;
mod stores;
mod upload;
mod workdir;

pub use commit::{
    CHECKPOINT_VERSION, CHECKPOINTS, COMMIT_VERSION, COMMITS, Checkpoint, Commit, OBJECTS, Piece,
    STATE_DIR, checkpoint_name, commit_name, parse_record_name,
};
pub use error::{Error, Result};
pub use files::{ARRAY_BLOCK_SIZE, PAGE_BLOCK_SIZE, SEGMENT_BLOCK_SIZE, StoreFiles};
pub use gc::{DEFAULT_GRACE, DEFAULT_KEEP, GcOptions, GcReport, Usage, du, gc};
pub use lease::{
    LEASE_VERSION, LEASES, MAX_LEASE, PUBLISH_LEASE, STAGED_LEASE, SWEEP_FOR, SWEEP_OBJECTS, SWEEPS,
};
pub use location::{
    CacheDir, DEFAULT_TIER_BUDGET, Location, MAX_WORK_DIRS, RemoteSpec, TIER_BUDGET_ENV,
    TIER_DIR_ENV, TierOptions, default_work_dir, is_url, open_in_work_dir, parse_bytes, work_dir,
};
pub use log_id::{LOG_OBJECT, LOG_VERSION};
pub use log_state::LogState;
pub use publisher::{
    DEFAULT_PUBLISH_INTERVAL, LAST_PUBLISH_BOUND, PUBLISH_INTERVAL_ENV, Publish, PublishError,
    PublishResult, Publisher, collect_failures, publish_all_at_exit, publish_interval,
    take_failures,
};
pub use push_pull::{PushReport, pull_dir, push_dir};
pub use remote_dir::{Next, PublishReport, RefreshReport, RemoteDir};
pub use remote_tier::redact_url;
pub use staged_segments::{
    SEGMENT_STAGING, SegmentCommit, StagedSegments, decide_remote_segments, decide_staged_segments,
    recover_staged_segments,
};
pub use staging::{
    COMMIT_RECORD, Decision, JOB_LOCK, StagingJob, commit_rename, finish_task, recover_staging,
    roll_forward, task_attempt, task_dir,
};
pub use store_kind::StoreKind;
pub use stores::{
    LeasedSample, Refresher, RemoteMemmapArray, RemotePages, RemoteSegments, RemoteShards,
};
pub use upload::REUSE_WITHIN;
