//! The server's own delivery of a cache's bytes: a plain `object_store`
//! client fetching every object under the cache's prefix with ranged GETs
//! (one per block of the tier's block size), at the best of a few
//! concurrency levels, through the same metering (and latency) wrapper as
//! the store's reads. Every remote line's `fraction_of_server` is these
//! seconds over its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use remote_tier::build_store;

use super::err;
use super::meter::Meter;
use crate::RunError;

/// The concurrency levels tried; the best one is the yardstick.
pub const LEVELS: [usize; 3] = [4, 16, 64];

/// What the best level delivered.
#[derive(Debug, Clone, Copy)]
pub struct Yardstick {
    /// Seconds to fetch every byte.
    pub secs: f64,
    /// Requests in flight at the best level.
    pub concurrency: usize,
    /// GETs sent.
    pub requests: u64,
    /// Bytes fetched.
    pub bytes: u64,
    /// Median seconds of one GET of a small object: a round trip.
    pub round_trip: f64,
}

/// Fetches every object under `url` with ranged GETs of `block` bytes at
/// each of [`LEVELS`], adding `latency` to each request; the fastest level.
pub fn measure(
    url: &str,
    options: Vec<(String, String)>,
    latency: Duration,
    block: u64,
) -> Result<Yardstick, RunError> {
    let (inner, prefix) = build_store(url, options).map_err(err)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(err)?;
    let objects: Vec<(ObjectPath, u64)> = rt
        .block_on(
            inner
                .list(Some(&prefix))
                .map_ok(|m| (m.location, m.size))
                .try_collect(),
        )
        .map_err(err)?;
    let ranges: Vec<(ObjectPath, std::ops::Range<u64>)> = objects
        .iter()
        .flat_map(|(path, size)| {
            (0..size.div_ceil(block.max(1)))
                .map(move |b| (path.clone(), b * block..((b + 1) * block).min(*size)))
        })
        .collect();
    let smallest = objects
        .iter()
        .min_by_key(|(_, size)| *size)
        .map(|(p, _)| p.clone())
        .ok_or_else(|| err(format!("{url}: no objects to measure")))?;
    let mut best: Option<Yardstick> = None;
    for level in LEVELS {
        let (store, meter) = Meter::wrap(Arc::clone(&inner), latency);
        let start = Instant::now();
        let fetched: u64 = rt
            .block_on(
                futures::stream::iter(ranges.iter().cloned())
                    .map(|(path, range)| {
                        let store = Arc::clone(&store);
                        async move { store.get_range(&path, range).await.map(|b| b.len() as u64) }
                    })
                    .buffer_unordered(level)
                    .try_fold(0u64, |sum, n| async move { Ok(sum + n) }),
            )
            .map_err(err)?;
        let secs = start.elapsed().as_secs_f64();
        let run = Yardstick {
            secs,
            concurrency: level,
            requests: meter.requests(),
            bytes: fetched,
            round_trip: 0.0,
        };
        if best.is_none_or(|b| run.secs < b.secs) {
            best = Some(run);
        }
    }
    let (store, _) = Meter::wrap(inner, latency);
    let mut trips: Vec<f64> = (0..9)
        .map(|_| {
            let start = Instant::now();
            rt.block_on(store.get(&smallest))
                .map_err(err)
                .map(|_| start.elapsed().as_secs_f64())
        })
        .collect::<Result<_, _>>()?;
    let mut best = best.ok_or_else(|| err("no concurrency level"))?;
    best.round_trip = crate::median(&mut trips);
    Ok(best)
}
