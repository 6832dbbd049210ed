#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod backend;
mod backends;
mod cached_fn;
mod config;
mod convert;
mod dataset;
mod detect;
mod error;
pub mod json;
mod kinds;
mod prepare;
mod remote;
mod source;

pub use backend::{CacheBackend, Lookup, Operation, Stats};
pub use backends::{
    Cache, MemmapBackend, PAGE_FILE, PageBackend, SegmentBackend, ShardBackend, open,
    open_with_source, segment::open_at as open_segments_at,
};
pub use cached_fn::{CachedFn, CallStats};
pub use config::{CacheConfig, OnStale, SourcesConfig};
pub use dataset::Dataset;
pub use detect::{Detected, PeerFormat};
pub use durable_fs::BoxError;
pub use error::{FacadeError, Result};
pub use kinds::{KINDS, KindSpec, Probe, detect, spec, spec_at, verify};
pub use remote_cache::{StoreKind, TierOptions};
pub use source::Source;
pub use tensor_core::{SharedBytes, SharedTensor, Value};
