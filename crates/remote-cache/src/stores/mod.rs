//! The four stores opened on a [`Location`](crate::Location), one type per
//! kind whether the location is a local directory or a URL (hence the
//! names: `PagesAt`, `SegmentsAt`, `ShardsAt`, `ArraysAt` — the store *at*
//! a location). Each keeps reading and writing its local directory; a
//! remote location materialises it first through the tier and publishes
//! what the store wrote. One file per store.

mod memmap_array;
mod pages;
mod segments;
mod shards;

pub use memmap_array::ArraysAt;
pub use pages::{LeasedSample, PagesAt};
pub use segments::{Refresher, SegmentsAt};
pub use shards::ShardsAt;
