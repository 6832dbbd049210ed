//! The four stores opened on a [`Location`](crate::Location): each keeps
//! reading and writing its local directory; a remote location
//! materialises it first and publishes what the store wrote. One file per
//! store.

mod memmap_array;
mod pages;
mod segments;
mod shards;

pub use memmap_array::RemoteMemmapArray;
pub use pages::{LeasedSample, RemotePages};
pub use segments::{Refresher, RemoteSegments};
pub use shards::RemoteShards;
