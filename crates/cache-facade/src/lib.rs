//! `cache-facade`: the layer applications use over the cachex stores.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod backend;
mod backends;
mod cached_fn;
pub mod cli;
mod config;
pub mod demo;
mod detect;
mod error;
pub mod json;
mod kinds;

pub use backend::{CacheBackend, Lookup, Stats};
pub use backends::{FACADE_CACHE_VERSION, SegmentBackend, record_from_tensor};
pub use cached_fn::{CachedFn, CallStats};
pub use config::{BackendKind, CacheConfig, OnStale, SourcesConfig};
pub use detect::{CacheKind, detect};
pub use error::{FacadeError, Result};
