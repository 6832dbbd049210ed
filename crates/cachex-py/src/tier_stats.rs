//! `cachex.tier_stats`: the counters of a machine's local tier.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use remote_tier::TierStats;

use crate::errors;

/// The counters of the local tier at `tier_dir`, shared by every process
/// of the machine that uses it: `{"allocated", "generation",
/// "fetched_bytes", "get_requests", "head_requests", "evicted_bytes",
/// "punched_blocks", "rebuilds", "over_budget", "hits", "misses"}`, all
/// ints (hits and misses count read calls). Read without
/// a lock from the tier's `tier.state` (a tier no reader has opened yet
/// has none: `CacheIOError`).
#[pyfunction]
pub fn tier_stats(py: Python<'_>, tier_dir: PathBuf) -> PyResult<Bound<'_, PyDict>> {
    let s = errors::enter(py, || {
        TierStats::read(&tier_dir).map_err(remote_cache::Error::from)
    })?;
    let TierStats {
        allocated,
        generation,
        fetched_bytes,
        get_requests,
        head_requests,
        evicted_bytes,
        punched_blocks,
        rebuilds,
        over_budget,
        hits,
        misses,
    } = s;
    let d = PyDict::new(py);
    for (name, value) in [
        ("allocated", allocated),
        ("generation", generation),
        ("fetched_bytes", fetched_bytes),
        ("get_requests", get_requests),
        ("head_requests", head_requests),
        ("evicted_bytes", evicted_bytes),
        ("punched_blocks", punched_blocks),
        ("rebuilds", rebuilds),
        ("over_budget", over_budget),
        ("hits", hits),
        ("misses", misses),
    ] {
        d.set_item(name, value)?;
    }
    Ok(d)
}
