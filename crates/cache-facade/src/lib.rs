//! `cache-facade`: the layer applications use over the cachex stores.
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod backend;
mod cached_fn;
mod config;
mod error;

pub use backend::{CacheBackend, Lookup, Stats};
pub use cached_fn::{CachedFn, CallStats};
pub use config::{BackendKind, CacheConfig, OnStale, SourcesConfig};
pub use error::{FacadeError, Result};
