//! `shard-store`: random access to the items of any deterministic iterator,
//! cached on disk in shards — the job of Python's
//! [loadit](https://github.com/ashok-cutkosky/loadit) ("a list that fits on
//! disk"), for Rust, in loadit's own directory format, so that a root
//! written by one is read by the other.
//!
//! Give [`ShardStore`] a source (a factory returning a fresh iterator that
//! yields the same items every time, or one that starts at a given item) and read `store.get(i)` in any order:
//! the items are pulled from the source once, written in shards of
//! `max_shard_length` items, kept decoded in a bounded in-memory cache, and
//! regenerated from the source if a disk budget evicted them. Many threads
//! and processes may share one root; file locks make sure each shard is
//! generated once and atomic renames that nobody sees a partial shard.
//!
//! # On-disk layout (loadit 0.0.8, documented in [`mod@format`])
//!
//! ```text
//! root/
//!   metadata.json                    {max_shard_length, length, length_final,
//!                                     compression, version: 4, info}
//!   completed                        flag: every shard present
//!   shards/<start>.<end>.shard.pickle[.zstd]   a pickled list of items
//!   locks/writer_lock.lock           root-wide flock (shared with loadit)
//!   locks/shard-<start>.lock         one shard being generated
//!   scratch/                         files being written
//!   quarantine/                      corrupt shards moved aside
//! ```
//!
//! Items are any `T: Serialize + DeserializeOwned` that pickles as plain
//! Python data (numbers, strings, lists, tuples, dicts; [`Bytes`] or
//! [`bytes`] for Python `bytes`). Shards are decoded without executing
//! anything: pickled Python objects are refused with
//! [`Error::UnsupportedPickle`]. Read items of unknown shape as
//! [`PickleValue`] (a `serde_pickle::Value`; `cachex get` prints them as
//! JSON). [`verify`] and [`inspect`] answer in the shared
//! [`cache_check`] shape every cachex store uses.
//!
//! # Behaviour worth knowing
//!
//! - **Determinism**: the source is called again whenever items must be
//!   regenerated (eviction, corruption, another process's cursor); shards
//!   from different calls are mixed, so it must yield the same items in
//!   the same order every time. A replay that ends at another length is
//!   reported as [`Error::NondeterministicSource`].
//! - **Regeneration cost**: a plain iterator can only restart, so a shard
//!   behind every cursor costs a replay from item 0. A source opened with
//!   [`ShardStore::open_with_seekable_source`] (`|start| iterator from
//!   start`) replays only the shard it regenerates. [`ShardStore::get_many`]
//!   serves indices shard by shard in ascending order: one forward pass
//!   regenerates all the shards it needs.
//! - **Decoding**: shards written by this crate (serde-pickle's opcode
//!   subset) are decoded by a streaming deserializer without building a
//!   value tree; other pickles (e.g. CPython's, with memo references)
//!   fall back to serde-pickle. Both run after a full opcode check that
//!   bounds nesting depth and memo expansion.
//! - **Crash safety**: shards and `metadata.json` are written to `scratch/`,
//!   fsynced and renamed (then the directory is fsynced). A torn or
//!   corrupt shard is detected on read (size, decode, item count),
//!   quarantined and regenerated, or reported when there is no source.
//!   [`verify`] lists every problem of a root; [`inspect`] summarizes it.
//! - **Introspection** (what loadit's users read from its internals):
//!   [`ShardStore::shard_files`], [`ShardStore::disk_bytes`],
//!   [`ShardStore::cached_shards`], [`ShardStore::counters`] (cache misses)
//!   and [`ShardStore::cursors`] report the store's state;
//!   [`ShardStore::set_preload`] changes the preload of an open store and
//!   [`ShardStore::finalize`] makes the shards on disk the whole length.
//!
//! # Example
//!
//! ```
//! use shard_store::{Options, ShardStore, RandomAccess, Repeat, chunk_shuffle};
//!
//! # fn main() -> Result<(), shard_store::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let store = ShardStore::open_with_source(
//!     dir.path(),
//!     Options::default().shard_items(100),
//!     || (0..1000u64).map(|i| (i, format!("item {i}"))),
//! )?;
//! assert_eq!(store.get(123)?.1, "item 123");
//! assert_eq!(store.get(-1)?.0, 999); // drives the source to its end
//! assert_eq!(store.len()?, 1000);
//!
//! // A second handle without a source reads the cache (loadit can too).
//! let cached: ShardStore<(u64, String)> = ShardStore::open(dir.path(), Options::default())?;
//! assert_eq!(cached.get(500)?.0, 500);
//!
//! // Lazy sequence utilities over anything with len + get.
//! let shuffled = chunk_shuffle(&cached, Some(10), None, 7)?;
//! let twice = Repeat::new(shuffled, 2);
//! assert_eq!(twice.length()?, 2000);
//! # Ok(()) }
//! ```
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
