//! `cache-facade`: one interface over the four cachex stores, the
//! decorator that caches a function's outputs, and the indexed view a data
//! loader samples. The `cachex` command-line tool lives in its own crate,
//! `cachex-cli`, so an application that uses [`CachedFn`] compiles no
//! command-line parser.
//!
//! [`open`]`(config)` opens any store behind [`CacheBackend`];
//! [`open_with_source`]`(config, source)` also builds it (memmap-array,
//! page-alloc) or feeds it (shard-store) from a [`Source`]. Every backend
//! returns one value type, [`Value`] (from `tensor-core`: a tensor, named
//! values, a tuple or list, a blob), as views into the store's files
//! wherever the store has them. A call a backend cannot serve is a typed
//! [`FacadeError::Unsupported`] that says why and what to use instead.
//!
//! # Which backend for which job
//!
//! | backend | fits | keys | values | cannot |
//! |---|---|---|---|---|
//! | `segment-store` ([`SegmentBackend`]) | outputs of a model or feature extractor, cached as you go ([`CachedFn`]); any record shape | string ids | views into mapped Arrow segments | indices (records have no order); nesting deeper than one level; removing a key (last write wins) |
//! | `memmap-array` ([`MemmapBackend`]) | a dataset of fixed-shape rows, built once (resumable), read at memory speed; numpy reads it | string ids (the row's source) and indices | dicts of views into the mapped `.bin` arrays | puts (rebuild to change it); rows of other shapes; blobs |
//! | `shard-store` ([`ShardBackend`]) | random access to a deterministic iterator's items, filled on demand; loadit reads it | indices (negative from the end) | decoded from pickle: copies | string keys; puts (the source is the truth); a keyed source (it replays an iterator) |
//! | `page-alloc` ([`PageBackend`]) | a training set read in random order by a loader, zero-copy, one file | indices | dicts of views into the mapped page file | string keys; puts (built once; rebuild to change it) |
//!
//! Keyed backends serve [`CacheBackend::get_batch`] and [`CachedFn`];
//! indexed ones serve [`CacheBackend::get_indices`] and [`Dataset`]
//! (memmap-array serves both). [`CacheBackend::supports`] says which.
//!
//! # Configs, keys, staleness
//!
//! A [`CacheConfig`] names the backend, root, name and options (JSON or
//! builder). The directory is `root/<name>/<key>`, the key hashing
//! [`CacheConfig::identity`] `= {backend, name, options}` — the same
//! directory memmap-array's own `open_or_build(root, name, options, ..)`
//! uses, so a cache built either way is found the other. The config's
//! source files and the store's format version go into `fingerprint.json`;
//! every backend opens through one staleness path: a stale cache is
//! refused with the reason ([`OnStale::Error`]) or cleared and rebuilt
//! ([`OnStale::Rebuild`]) — by the holder of the exclusive lock on
//! `root/<name>/<key>.lock` only, while openers hold it shared, so no
//! process ever opens a half-cleared directory.
//!
//! # On disk
//! ```text
//! <root>/<name>/<key>.lock    the facade's lock: shared to open, exclusive to build/clear
//! <root>/<name>/<key>/        key = 16 hex chars over {backend, name, options}
//!   fingerprint.json          identity, source stamps, store version: written last
//!   ...                       the store's own files: segments/ (segment-store),
//!                             *.bin + index.parquet + _COMPLETE (memmap-array),
//!                             metadata.json + shards/ (shard-store), data.pages (page-alloc)
//! ```
//!
//! # Example
//! ```
//! use cache_facade::{CacheConfig, CachedFn, Value, open};
//! use tensor_core::Tensor;
//!
//! let root = tempfile::tempdir()?;
//! let config = CacheConfig::from_json(&format!(
//!     r#"{{"backend": "segment-store", "root": {:?}, "name": "embeddings",
//!         "options": {{"flush_every": 512}}}}"#,
//!     root.path()
//! ))?;
//! let embed = |xs: &[&u32]| -> Result<Vec<Value>, tensor_core::TensorError> {
//!     xs.iter().map(|&&x| Ok(Value::from(Tensor::from_vec([2], vec![x as f32, 0.5])?))).collect()
//! };
//! let cached = CachedFn::new(open(&config)?, embed)?;
//! let out = cached.call(&[3, 4, 3], &["a3", "a4", "a3"])?; // computes a3, a4 once each
//! assert_eq!(out[2].as_tensor().unwrap().as_slice::<f32>()?, &[3.0, 0.5]);
//! cached.call(&[4], &["a4"])?; // a hit
//! assert_eq!(cached.stats().computed, 2);
//! assert_eq!(cached.stats().hits, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
