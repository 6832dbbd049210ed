#![doc = include_str!("../README.md")]
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
mod report;
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
pub use report::{PlanStatus, TierReport};
pub use state::{TierBudget, TierStats};
pub use store_url::{build_store, redact_url};
pub use tier::RemoteTier;
pub use warm::{Warming, WarmingSet};
