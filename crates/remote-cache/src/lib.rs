#![doc = include_str!("../README.md")]
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
pub use stores::{ArraysAt, LeasedSample, PagesAt, Refresher, SegmentsAt, ShardsAt};
pub use upload::REUSE_WITHIN;
