//! `page-alloc`: a single-file sample store for data loaders, built for
//! zero-copy, allocation-free reads — the job of FFCV's `DatasetWriter`
//! and `OSCacheManager` — plus reading and writing FFCV's own `.beton`
//! files ([`beton`]).
//!
//! Samples have a fixed [`Schema`] of fields: ints and floats stored inline
//! in a metadata table, and byte strings or fixed-shape arrays stored in
//! pages. [`PageWriter`] packs samples into pages (power of two, 64 KiB by
//! default; allocations aligned to 512 B by default) in sample order — a
//! sample never straddles pages, a sample larger than a page gets a run of
//! contiguous pages — fills pages from N threads, each with its own page
//! buffer, and produces the same bytes for any thread count. `finalize`
//! writes the tables and a checksummed footer, fsyncs and renames the file
//! into place. [`PageReader`] maps the file, validates every offset before
//! the first read, and hands out borrowed slices; [`BufferPool`] fills
//! batches without allocating; [`PageReader::prefetch`] and
//! [`PageReader::quasi_random_order`] serve low-RAM random access.
//!
//! On disk (all little-endian; the exact layout is in [`format`](mod@format)):
//!
//! ```text
//! data.pages
//! ├── header          magic, version, page size, alignment, sample count,
//! │                   field schema, table offsets, checksum of the tables
//! ├── (hole)          up to the next multiple of the page size (≤ 1 MiB)
//! ├── page 0 ..       data pages (runs of pages for oversized samples)
//! ├── metadata table  one row per sample: inline values, (ptr, size) pairs
//! ├── run table       per page run: pages, bytes used, samples, BLAKE3
//! └── footer          checksum of the header, file length, magic: the commit
//! ```
//!
//! ```
//! use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("train.pages");
//! let schema = Schema::new().int("label").bytes("jpeg");
//!
//! let mut writer = PageWriter::create(&path, schema, WriterOptions::default())?;
//! writer.append(&[Value::Int(7), Value::Bytes(b"\xff\xd8 first")])?;
//! // Many samples: plan in order, fill pages from two threads.
//! let rest: Vec<Vec<Value>> = (0..100)
//!     .map(|i| vec![Value::Int(i), Value::Bytes(b"pixels")])
//!     .collect();
//! writer.write_parallel(&rest[..], 2)?;
//! writer.finalize()?;
//!
//! let reader = PageReader::open(&path)?;
//! assert_eq!(reader.len(), 101);
//! let sample = reader.sample(0)?;
//! assert_eq!(sample.int(0)?, 7);
//! assert_eq!(sample.bytes(1)?, b"\xff\xd8 first"); // borrowed from the mmap
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod beton;
mod error;
pub mod format;
// Exists for the targets in `fuzz/` (and tests over damaged inputs), not
// for users: hidden from the docs, kept public so those targets compile.
#[doc(hidden)]
pub mod fuzz_entry;
mod inspect;
mod reader;
mod recover;
mod schema;
mod source;
mod validate;
mod writer;

pub use durable_fs::BoxError;
pub use error::{Error, Result};
pub use inspect::{FieldInfo, Inspection, MAX_PROBLEMS, inspect, verify, verify_with};
pub use reader::{BufferPool, FieldValue, PageReader, ReadOptions, Sample};
pub use recover::{lock_path, recover, temp_path};
pub use schema::{Field, FieldType, Schema};
pub use source::{SampleOut, SampleSource, Slot, Value};
pub use writer::{FinalizeStep, PageWriter, WriteSummary, WriterOptions};
