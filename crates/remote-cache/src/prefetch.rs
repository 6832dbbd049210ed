//! Fetching a commit's whole pieces ahead of applying them, many requests
//! at once: applying a commit copies its pieces into the working directory
//! one at a time, in order, and each copy waits on the tier's fetch of its
//! object; a cold open of a cache of many segments would otherwise be one
//! round trip after another. The pieces are fetched in windows that fit
//! half the tier's budget (so a window's objects are still in the tier
//! when the copies reach them), each window by up to [`IN_FLIGHT`]
//! threads. A failed fetch here is left for the in-order apply, which
//! fetches the object again and reports the error with its commit.
//!
//! The pieces read by blocks are opened ahead the same way, in the
//! background while the whole ones are fetched ([`open_in_background`]):
//! on a cold tier each open asks the store for its object (a HEAD).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use durable_fs::Pool;
use remote_tier::{BlockHashes, Expected, RemoteFile, RemoteTier};

/// Requests in flight while a window is fetched.
pub const IN_FLIGHT: usize = 16;

/// One object a commit's apply will fetch whole.
#[derive(Debug, Clone)]
pub struct Ahead {
    /// Its name in the store (`objects/<blake3>`).
    pub object: String,
    /// What it must be.
    pub expected: Expected,
}

/// Windows of `pieces` (object and size): consecutive runs whose bytes fit
/// half of `budget` (a larger object is a window of its own).
pub fn windows(pieces: &[(Ahead, u64)], budget: u64) -> Vec<std::ops::Range<usize>> {
    let cap = (budget / 2).max(1);
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, (_, size)) in pieces.iter().enumerate() {
        if i > start && bytes.saturating_add(*size) > cap {
            out.push(start..i);
            (start, bytes) = (i, 0);
        }
        bytes = bytes.saturating_add(*size);
    }
    if start < pieces.len() {
        out.push(start..pieces.len());
    }
    out
}

/// Fetches every object of `window` into `tier`, up to [`IN_FLIGHT`] at a
/// time; returns how many arrived (errors are left to the caller's own
/// fetch, which names the commit).
pub fn fetch_window(tier: &RemoteTier, window: &[(Ahead, u64)]) -> usize {
    Pool::new(IN_FLIGHT)
        .map(window, |(ahead, _)| {
            tier.fetch(&ahead.object, &ahead.expected).is_ok()
        })
        .into_iter()
        .filter(|arrived| *arrived)
        .count()
}

/// Opens each object of `wanted` (name, block list, whether its reader
/// leases what it reads) by blocks through `tier`, leased where its link
/// will be (so the open keeps none of its blocks from eviction), up to
/// the tier's parallelism at once, on a thread of its own;
/// the handles stay open until the returned [`Opening`] is dropped. A
/// failed open is left to the apply, which opens the object again and
/// reports it. The handles hold no descriptors (see
/// [`RemoteFile`]): however many objects, the opens cost the process
/// none beyond the tier's few.
pub fn open_in_background(
    tier: RemoteTier,
    wanted: Vec<(String, Arc<BlockHashes>, bool)>,
) -> Opening {
    let workers = tier.config().parallelism;
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = Arc::clone(&stop);
    let opening = std::thread::Builder::new()
        .name("cachex-open".into())
        .spawn(move || {
            Pool::new(workers)
                .map(&wanted, |(object, hashes, leased)| {
                    if stopped.load(Ordering::Relaxed) {
                        return None;
                    }
                    let hashes = Arc::clone(hashes);
                    match leased {
                        true => tier.open_leased(object, Some(hashes)).ok(),
                        false => tier.open_by_blocks(object, hashes).ok(),
                    }
                })
                .into_iter()
                .flatten()
                .collect()
        });
    Opening {
        thread: opening.ok(),
        stop,
    }
}

/// Objects being opened by [`open_in_background`]: kept open until this
/// is dropped. Dropping it starts no further open and waits only for
/// those in flight (each bounded by the tier's timeouts): an apply that
/// failed — a server that stopped answering — reports its error after a
/// few call bounds, not one per object left to open.
#[derive(Debug)]
pub struct Opening {
    thread: Option<std::thread::JoinHandle<Vec<RemoteFile>>>,
    stop: Arc<AtomicBool>,
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.take() {
            drop(h.join());
        }
    }
}

/// Whether `local` already holds `end` bytes: a re-applied piece whose
/// bytes are in place needs no fetch (the apply checks their hash).
pub fn in_place(local: &Path, end: u64) -> bool {
    std::fs::symlink_metadata(local).is_ok_and(|m| m.file_type().is_file() && m.len() >= end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ahead(size: u64) -> (Ahead, u64) {
        (
            Ahead {
                object: format!("objects/{size}"),
                expected: Expected {
                    size: Some(size),
                    blake3: None,
                },
            },
            size,
        )
    }

    #[test]
    fn windows_fit_half_the_budget_and_cover_every_piece() {
        let pieces: Vec<_> = [10, 20, 30, 100, 5, 5].into_iter().map(ahead).collect();
        let w = windows(&pieces, 80);
        assert_eq!(w, vec![0..2, 2..3, 3..4, 4..6]);
        assert_eq!(windows(&pieces, u64::MAX), vec![0..6]);
        assert!(windows(&[], 10).is_empty());
    }
}
