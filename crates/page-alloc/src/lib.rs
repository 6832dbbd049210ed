#![doc = include_str!("../README.md")]
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
