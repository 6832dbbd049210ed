//! Reading single rows of a segment through byte ranges, without the
//! whole file: for segments that live elsewhere (object storage) and are
//! fetched on demand.
//!
//! A segment is an Arrow IPC file: magic, the schema message, one record
//! batch message (its metadata, then its body of buffers), the footer and
//! its length. A row needs little of it:
//!
//! 1. the file's tail: the footer (schema, where each batch is);
//! 2. each batch's metadata (its field nodes and where each buffer lies
//!    in its body) and the file's magic;
//! 3. per row, the two offsets that bound it in each offset buffer (and
//!    its validity byte, where a column has nulls);
//! 4. per row, the bytes those offsets bound: the key, each tensor's
//!    elements and dims, each blob.
//!
//! Stages 1–2 happen once per segment ([`Layout::open`]); 3–4 once per
//! batch of rows ([`Layout::rows_at`]), every range of a stage asked for at
//! once. A plan of reads places rows by stage 3 alone
//! ([`Layout::spans_at`]: the ranges stage 4 would read, not read). What
//! the full decode validates for a whole batch is checked here for what a
//! row reads: the footer, the batch metadata (every buffer inside its body
//! and long enough for its field node), both offsets of the row within
//! their buffer (in order, inside the values), the key's
//! UTF-8, no null where the schema allows none, each tensor's dims
//! against its elements. Files this path does not know (dictionaries,
//! compression, types segments never hold) are left to the full read.
//!
//! `source.rs` is what a reader of ranges provides, `layout.rs` stages
//! 1–2, `rows.rs` stages 3–4, `lookup.rs` the store's lookup over them
//! ([`SegmentStore::get_batch_ranged`](crate::SegmentStore::get_batch_ranged)).

mod layout;
mod lookup;
mod rows;
mod source;

pub use layout::Layout;
pub use rows::RangedRow;
pub use source::SegmentRanges;
