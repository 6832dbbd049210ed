#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod error;
pub mod format;
mod inner;
mod inspect;
mod introspect;
mod iter;
mod options;
mod pickle_check;
mod reader;
mod recover;
mod seq;
mod shards;
mod store;
mod stream;
mod value;
mod writer;

pub use error::{Error, Result};
pub use format::{Compression, Metadata, ShardName, StoreItem};
pub use inspect::{Inspection, inspect, verify};
pub use introspect::{Counters, CursorState, ShardFile};
pub use iter::{Iter, ShardIter};
pub use options::{Options, Preload, ShardLength};
pub use seq::{
    Concat, ConcatStep, Indices, Interleave, InterleaveIndex, RandomAccess, Repeat, SequenceView,
    block_shuffle_indices, chunk_shuffle, chunk_shuffle_indices, concat_locate, repeat_index,
};
pub use shards::Item;
pub use store::ShardStore;
pub use value::{Bytes, PickleValue, bytes};
