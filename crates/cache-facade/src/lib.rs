//! `cache-facade`: the layer applications use over the cachex stores.
//! The `cachex` command-line tool lives in its own crate, `cachex-cli`, so
//! an application that uses [`CachedFn`] compiles no command-line parser.
//!
//! - [`CacheBackend`]: keyed batch caching (`get_batch`, `put_batch`,
//!   `flush`, `len`, `stats`, `path`), implemented by [`SegmentBackend`]
//!   (segment-store: any tensor record, written incrementally) and
//!   [`MemmapBackend`] (memmap-array: a read-only keyed view of a built
//!   dataset cache). shard-store and page-alloc address items by index and
//!   are used directly. The `backends` table in the source says which fits
//!   which job and what each cannot do.
//! - [`CacheConfig`]: backend, root, name and options (JSON or builder).
//!   The directory is `root/<name>/<key>` with the key from the
//!   `fingerprint` crate over backend, name and options, so changing an
//!   option never reads a stale cache; source files and the store's format
//!   version go into `fingerprint.json`, and a stale cache is refused with
//!   the reason (or rebuilt, with [`OnStale::Rebuild`]). [`open`] picks
//!   the backend from the config.
//! - [`detect`]: which [`CacheKind`] a path holds (every store's layout,
//!   and torchcachex, loadit and FFCV `.beton` files); `open` refuses a
//!   directory of another kind, and the `cachex` tool picks its adapter.
//! - [`CachedFn`]: the decorator. Given inputs and their stable ids, it
//!   returns cached outputs for hits and calls the wrapped batch function
//!   once for the misses (duplicates computed once), in the caller's order.
//!
//! # On disk
//! ```text
//! <root>/<name>/<key>/        key = 16 hex chars over {backend, name, options}
//!   fingerprint.json          config, source stamps, cache version
//!   ...                       the backend's own files (see its crate)
//! ```
//! Everything is local files with one writer per directory (an `fs2`
//! lock); on a shared file system every rank opens the same directory,
//! the `writer_rank` (segment-store option; `RANK` from the environment)
//! persists, and the other ranks cache in memory and read what the writer
//! flushed when they reopen.
//!
//! # Example
//! ```
//! use cache_facade::{BackendKind, CacheConfig, CachedFn, SegmentBackend};
//! use segment_store::Record;
//! use tensor_core::Tensor;
//!
//! let root = tempfile::tempdir()?;
//! let config = CacheConfig::new(BackendKind::SegmentStore, root.path(), "embeddings")
//!     .option("flush_every", 512);
//! let embed = |xs: &[&u32]| -> Result<Vec<Record>, tensor_core::TensorError> {
//!     xs.iter().map(|&&x| Ok(Record::from(Tensor::from_vec([2], vec![x as f32, 0.5])?))).collect()
//! };
//! let cached = CachedFn::new(SegmentBackend::open(&config)?, embed);
//! let out = cached.call(&[3, 4, 3], &["a3", "a4", "a3"])?; // computes a3, a4 once each
//! assert_eq!(out[2].as_tensor().unwrap().view().as_slice::<f32>()?, &[3.0, 0.5]);
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
mod detect;
mod error;

pub use backend::{CacheBackend, Lookup, Stats};
pub use backends::{FACADE_CACHE_VERSION, MemmapBackend, SegmentBackend, open, record_from_tensor};
pub use cached_fn::{CachedFn, CallStats};
pub use config::{BackendKind, CacheConfig, OnStale, SourcesConfig};
pub use detect::{CacheKind, detect};
pub use error::{FacadeError, Result};
