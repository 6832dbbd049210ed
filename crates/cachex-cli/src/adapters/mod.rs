//! The adapters, one file per store.

pub(crate) mod beton;
pub(crate) mod memmap;
pub(crate) mod pages;
pub(crate) mod segments;
pub(crate) mod shards;
