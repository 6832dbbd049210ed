//! `segment-store`: a persistent key → tensor-record cache on immutable
//! Arrow IPC segment files — the job torchcachex's `ArrowIPCCacheBackend`
//! does in Python, in its on-disk layout, without its costs that grow with
//! the cache.
//!
//! A `Value` is a [`tensor_core::Value`] one level deep: a single
//! tensor, named tensors and blobs (a dict), a tuple or list of tensors
//! and blobs, or one opaque blob; tensors carry every
//! [`tensor_core::DType`], bf16 included. Records read back are values
//! over the mapped segment, so a caller that speaks `Value` (the facade,
//! the Python binding) takes them as they are. The first record fixes the
//! [`RecordSchema`]; later records that differ are refused with
//! [`Error::SchemaMismatch`] naming the field, and nothing of their batch
//! is written.
//!
//! * **Writes** buffer in memory; every `flush_every` records become one
//!   new segment (temp file → fsync → rename → dir fsync), and only then is
//!   the segment's group of key hashes (XXH3) appended (and fsynced) to the index
//!   log. A flush never rewrites existing bytes, so it costs O(new records).
//!   By default the call that fills a segment builds and writes it (its
//!   write-back starting chunk by chunk), and the store's flush thread
//!   makes it durable and appends its group while the caller goes on, one
//!   segment at a time; [`SegmentStore::flush`] returns once everything is
//!   durable. With [`Options::async_write`] the thread builds and writes
//!   segments too, behind a bounded queue. Either way, a commit's error
//!   comes back from the next call.
//! * **Reads** try the byte-bounded LRU, then unflushed records, then the
//!   index: a table of 12-byte slots (≤ 24 bytes per key), loaded by one
//!   sequential read of the log without parsing any key string. A
//!   segment is mapped when a read needs it (at most
//!   [`Options::max_maps`] stay mapped; the least recently used are
//!   unmapped, while the records read from them keep their bytes) and
//!   decoded lazily by arrow-rs' `FileDecoder`
//!   over the mapped `Buffer`, validated before any row is read (buffer
//!   layout, offsets, UTF-8, nulls: in vectorized passes of this crate for
//!   the types segments hold, by Arrow for any other); a record's tensors
//!   are views into the map
//!   ([`tensor_core::SharedTensor::view`]) until the caller copies them. Before it
//!   returns, `get_batch` asks the CPU for the batch's tensor bytes (up to
//!   512 KiB), so the caller's first pass over the views reads from cache.
//!   Segments are written in whole 2 MiB chunks, so the page cache holds
//!   them in huge folios and random reads through the map miss the TLB
//!   less.
//! * **Recovery** on open removes temp files, drops a torn index tail,
//!   indexes segments newer than the index, rebuilds a missing index from
//!   the segments' `key` columns (a torchcachex cache: later rows win),
//!   re-derives a bad `schema.json`, and excludes a corrupt segment (its
//!   keys read as missing; see [`SegmentStore::problems`]).
//! * **One writer** by default: the writer rank takes an `fs2` lock; a
//!   second writer gets [`Error::Locked`]. Other ranks only fill their LRU.
//! * **Or every rank writes** ([`Options::writer_id`]): each writer gets
//!   its own segment ids (a residue class modulo
//!   [`format::WRITER_STRIDE`]) and its own index log under `writers/`, so
//!   writers share no mutable file and no lock (fit for NFS and Lustre);
//!   opening merges every log, a key written twice resolves to its
//!   greatest segment id (the same everywhere, and torchcachex's answer),
//!   and [`refresh`](SegmentStore::refresh) reads only the groups other
//!   writers appended since. See [`mod@format`] for the rules.
//! * **Or adopt stores written elsewhere** ([`adopt_staged`]): the
//!   segments of staged single-writer stores (a Ray job's write tasks)
//!   renumbered into one multi-writer's ids, with the writer log that
//!   names them, for a commit that publishes them all at once.
//!
//! # API at a glance
//! [`SegmentStore::open`]`(dir, `[`Options`]`)`, then
//! [`put_batch`](SegmentStore::put_batch)`(&[(key, Value)])`,
//! [`get_batch`](SegmentStore::get_batch)`(&[key]) -> (Vec<Option<Value>>, missing)`,
//! [`flush`](SegmentStore::flush), [`len`](SegmentStore::len),
//! [`stats`](SegmentStore::stats); maintenance:
//! [`compact`](SegmentStore::compact), [`verify`](SegmentStore::verify)
//! (every segment and index entry, including each segment's content hash),
//! [`inspect`](SegmentStore::inspect), and
//! [`problems`](SegmentStore::problems) (what recovery found on open);
//! [`verify`]`(dir)` opens read-only and returns both lists. Problems are
//! [`cache_check::Problem`]s, the shape every cachex store reports in.
//! `async_write` is off by default (torchcachex's default is on): a
//! segment's build and write errors come back from the call that filled
//! it, and only its commit overlaps the caller's next records.
//!
//! # Layout
//! ```text
//! <cache_dir>/<module_id>/
//!   segments/segment_000000.arrow   Arrow IPC file: key, data, shape, ... (torchcachex columns)
//!   segments/segment_000001.arrow
//!   schema.json                     {"fields", "metadata", "output_structure"}
//!   segment-index.log               header, then per segment: group header + u64 key hashes
//!   segment-store.lock              the writer's advisory lock (shared by multi-writers)
//!   writers/writer-0001.log         multi-writer 1's index log (same layout, version 3)
//!   writers/writer-0001.lock        multi-writer 1's lock
//! ```
//! The byte-level format is documented in [`mod@format`].
//!
//! # Example
//! ```
//! use segment_store::{Options, SegmentStore};
//! use tensor_core::{Tensor, Value};
//!
//! let dir = tempfile::tempdir()?;
//! let store = SegmentStore::open(dir.path(), Options::default())?;
//! let t = Tensor::from_vec([2, 2], vec![1.0f32, 2.0, 3.0, 4.0])?;
//! store.put_batch(&[("sample_0", Value::from(t))])?;
//! store.flush()?;
//! drop(store);
//!
//! let store = SegmentStore::open(dir.path(), Options::default())?;
//! let (records, missing) = store.get_batch(&["sample_0", "sample_9"])?;
//! assert_eq!(missing, vec![1]);
//! let view = records[0].as_ref().unwrap().as_tensor().unwrap().view();
//! assert_eq!(view.as_slice::<f32>()?, &[1.0, 2.0, 3.0, 4.0]);
//!
//! // Named tensors and blobs need a cache of their own.
//! let other = tempfile::tempdir()?;
//! let dicts = SegmentStore::open(other.path(), Options::default())?;
//! let rec = Value::dict([
//!     ("features", Value::from(Tensor::from_vec([3], vec![0.5f32; 3])?)),
//!     ("label", Value::Blob(b"cat".to_vec().into())),
//! ]);
//! dicts.put_batch(&[("a", rec)])?;
//! assert_eq!(dicts.len(), 1);
//!
//! // Every rank a writer: two writers (say, two ranks) and a reader.
//! let shared = tempfile::tempdir()?;
//! let rank = |w| Options { writer_id: Some(w), ..Options::default() };
//! let (r0, r1) = (SegmentStore::open(shared.path(), rank(0))?, SegmentStore::open(shared.path(), rank(1))?);
//! let reader = SegmentStore::open(shared.path(), Options { read_only: true, ..Options::default() })?;
//! let t = |v: f32| Tensor::from_vec([1], vec![v]);
//! r0.put_batch(&[("a", Value::from(t(0.0)?))])?;
//! r1.put_batch(&[("b", Value::from(t(1.0)?))])?;
//! r0.flush()?;
//! r1.flush()?;
//! reader.refresh()?;
//! assert_eq!(reader.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
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
