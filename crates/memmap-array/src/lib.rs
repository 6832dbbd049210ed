//! `memmap-array`: a cache of fixed-shape rows stored as raw row-major
//! arrays, one `.bin` file per named array, that numpy reads with
//! `numpy.memmap(path, dtype, mode="r", shape=(N, *shape))` and this crate
//! reads zero-copy through memory maps.
//!
//! - [`RowWriter`] streams rows in, crash-safe and resumable, then
//!   [`RowWriter::finalize`] writes the Parquet row index, the
//!   deduplicated sidecars and `shapes.json`, and marks the cache complete.
//! - [`MemmapArray`] opens a finished cache, validating every file size
//!   against `shapes.json`, and hands out [`tensor_core::TensorView`]s that
//!   borrow the mapped files (`Send + Sync`, no lock on the hot path;
//!   [`MemmapArray::find`] by source id; [`MemmapArray::prefetch`] for the
//!   next row of a random scan;
//!   [`MemmapArray::load_in_memory`] with a RAM guard).
//! - [`open_or_build`] keys a cache directory by its config (crate
//!   `fingerprint`), opens it when its fingerprint matches, resumes a
//!   half-built one, and rebuilds a stale one, saying why ([`Outcome`]);
//!   its sources are stamped with `fingerprint::stamp_sources`.
//! - [`inspect`] describes a cache (sizes, schema, sidecar dedup, RAM a
//!   load would take; [`Inspection::summary`] in the shared `cache-check`
//!   shape) and [`verify`] lists every problem in one, as
//!   [`cache_check::Problem`]s (file, kind, detail).
//!
//! # On-disk layout
//!
//! ```text
//! <cache_dir>/<key>/        (open_or_build: <root>/<name>/<key>)
//!   <array>.bin        (N, *shape) row-major little-endian, one per array
//!   index.parquet      row, source, has_<array>, key_<sidecar>, meta_json
//!   <sidecar>.json     {"0": "<string>", ...}: each distinct value once
//!   shapes.json        format version, N, per array: numpy dtype, shape, row bytes
//!   fingerprint.json   what the cache was built from (fingerprint::Fingerprint
//!                      when built by open_or_build)
//!   manifest.jsonl     commit log while writing; removed once complete
//!   _COMPLETE          written by finalize after every file above is durable
//!   .writer.lock       the writer's advisory lock file
//! ```
//!
//! The full specification (file formats, manifest lines, validation
//! rules) lives in one place, `src/format.rs`; its constants are
//! re-exported here. A cache is immutable once complete.
//!
//! # Durability
//!
//! A row's bytes are appended to every `.bin`; its manifest line waits in
//! memory until the next group commit (every [`WriterOptions::sync_every`]
//! rows, on [`RowWriter::flush`] and at finalize), which fsyncs the `.bin`
//! files *before* appending and fsyncing the lines, so no line ever
//! commits bytes that are not durable. A crash loses at most the rows
//! since the last group commit; resuming truncates every `.bin` to the
//! committed rows and drops a torn manifest line, and
//! [`RowWriter::resume_keys`] lists the sources to skip. The file-system
//! steps (temporary file, fsync, rename, directory fsync, writer lock) are
//! the shared ones of the `durable-fs` crate.
//!
//! # Example
//!
//! ```
//! use memmap_array::{MemmapArray, NewRow, RowWriter, Schema};
//! use tensor_core::{DType, Tensor};
//!
//! let dir = tempfile::tempdir()?;
//! let schema = Schema::builder()
//!     .array("data", DType::I16, [2, 3])
//!     .nullable_array("mask", DType::U8, [3])
//!     .sidecar("config")
//!     .build()?;
//!
//! let mut writer = RowWriter::create_or_resume(dir.path(), &schema, "v1")?;
//! for i in 0..4i16 {
//!     let data = Tensor::from_vec([2, 3], vec![i; 6])?;
//!     let mask = Tensor::from_vec([3], vec![1u8, 0, 1])?;
//!     let source = format!("sample_{i}");
//!     let mut row = NewRow::new(&source)
//!         .array("data", data.view())
//!         .sidecar("config", r#"{"loci": ["A", "B"]}"#)
//!         .meta(r#"{"label": 1}"#);
//!     row = if i % 2 == 0 { row.array("mask", mask.view()) } else { row.null("mask") };
//!     writer.write(&row)?;
//! }
//! writer.finalize()?;
//!
//! let cache = MemmapArray::open(dir.path())?;
//! let row = cache.row(2)?;
//! assert_eq!(row.source(), "sample_2");
//! assert_eq!(row.get("data")?.unwrap().as_slice::<i16>()?, &[2; 6]);
//! assert!(cache.row(1)?.get("mask")?.is_none());
//! assert_eq!(row.sidecar("config")?, Some(r#"{"loci": ["A", "B"]}"#));
//! assert_eq!(cache.sidecar_values("config")?.len(), 1); // stored once
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod build;
mod error;
mod format;
// Exists for the targets in `fuzz/` (and tests over damaged inputs), not
// for users: hidden from the docs, kept public so those targets compile.
#[doc(hidden)]
pub mod fuzz_entry;
mod index;
mod inspect;
mod reader;
mod recover;
mod writer;

pub use build::{
    BACKEND_NAME, CACHE_VERSION, Opened, Outcome, RebuildReason, open_or_build, open_or_build_with,
};
pub use error::{Error, Result};
pub use format::{
    ArraySpec, COMPLETE_FILE, FINGERPRINT_FILE, FORMAT_VERSION, INDEX_FILE, LOCK_FILE,
    MANIFEST_FILE, SHAPES_FILE, Schema, SchemaBuilder, bin_file, has_column, is_array_file,
    key_column, sidecar_file,
};
pub use inspect::{ArrayInfo, FileInfo, Inspection, SidecarInfo, inspect, verify};
pub use reader::{DEFAULT_RAM_FRACTION, MemmapArray, Row, physical_ram};
pub use writer::{NewRow, RowWriter, WriterOptions};
