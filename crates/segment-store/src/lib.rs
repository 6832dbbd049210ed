#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod adopt;
mod compact;
mod decode;
mod error;
mod flush;
pub mod format;
mod index;
mod inspect;
mod lookup;
mod lru;
mod maps;
mod options;
mod ranged;
mod reader;
mod record;
mod recover;
mod refresh;
mod schema;
mod state;
mod store;
mod validate;
mod writer;

pub use adopt::{
    AdoptedSegment, Adoption, StagedLog, adopt_staged, claim_free_writer, free_writer,
    last_segment_id, last_segment_id_of, lock_as_multi_writer,
};
pub use compact::CompactReport;
pub use durable_fs::BoxError;
pub use error::{Error, Result};
pub use inspect::{Inspection, SegmentInfo, WriterInfo, verify};
pub use options::{Keeper, Options, WholeSegment};
pub use ranged::SegmentRanges;
pub use record::Structure;
pub use schema::{PartKind, PartSpec, RecordSchema, SCHEMA_FILE_CAP};
pub use store::{SegmentStore, Stats};
