#![doc = include_str!("../README.md")]
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
