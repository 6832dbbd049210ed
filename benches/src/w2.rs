//! W2 of `BENCHMARKS.md`: flush and open scaling (segment-store).
//!
//! Grows one cache of f32\[128\] samples through S = 1k, 10k, 100k, 1M (with
//! `--n N`: N/1000, N/100, N/10, N). At each S it times `put_batch` of
//! 1,000 new samples + `flush()` and opening the store until the first
//! `get_batch` has returned (medians of 9), and reports the index's
//! resident bytes per entry. Each timed flush is paired with one on a
//! fresh store of S = 1k, so that the two see the same disk. A final
//! "scaling" line holds the ratios: of medians (`flush_ratio`, S = 1M
//! against S = 1k measured first), of the fastest repetitions
//! (`flush_ratio_min`), and of S = 1M against its paired 1k flushes
//! (`flush_ratio_paired`): fsync latency on a shared disk drifts.

use std::time::Instant;

use segment_store::{Options, Record, SegmentStore};
use tensor_core::Tensor;

use crate::{Ctx, Line, RunError, median, progress};

const DIM: usize = 128;
const NEW: usize = 1_000;
const REPS: usize = 9;

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store("w2", e)
}

fn value(seed: u64, i: usize) -> Vec<f32> {
    let base = ((i as u64 + seed) % 65_536) as f32;
    (0..DIM).map(|j| base + j as f32 * 0.5).collect()
}

/// Samples `s{k}` for `k` in `range`.
fn items(seed: u64, range: std::ops::Range<usize>) -> Result<Vec<(String, Record)>, RunError> {
    range
        .map(|k| {
            Tensor::from_vec([DIM], value(seed, k))
                .map(|t| (format!("s{k}"), Record::from(t)))
                .map_err(err)
        })
        .collect()
}

fn put_range(
    store: &SegmentStore,
    seed: u64,
    range: std::ops::Range<usize>,
) -> Result<(), RunError> {
    let mut i = range.start;
    while i < range.end {
        let end = (i + 10_000).min(range.end);
        store.put_batch(&items(seed, i..end)?).map_err(err)?;
        i = end;
    }
    Ok(())
}

fn check(store: &SegmentStore, seed: u64, i: usize) -> Result<(), RunError> {
    let (r, _) = store.get_batch(&[format!("s{i}")]).map_err(err)?;
    let ok = r[0]
        .as_ref()
        .and_then(|r| r.as_tensor())
        .and_then(|t| {
            t.view()
                .as_slice::<f32>()
                .ok()
                .map(|s| s == value(seed, i).as_slice())
        })
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(RunError::WrongValue {
            workload: "w2",
            detail: format!("s{i} wrong or missing"),
        })
    }
}

/// `put_batch` of 1,000 new samples from `from` plus `flush()`, in ms.
fn timed_flush(store: &SegmentStore, seed: u64, from: usize) -> Result<f64, RunError> {
    let items = items(seed, from..from + NEW)?;
    let t = Instant::now();
    store.put_batch(&items).map_err(err)?;
    store.flush().map_err(err)?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

fn quiesce() {
    // SAFETY: sync(2) takes no arguments and only flushes file-system
    // buffers; it cannot fail or touch this process's memory.
    unsafe { libc::sync() };
    std::thread::sleep(std::time::Duration::from_millis(200));
}

/// Runs W2.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let max = ctx.n_or(1_000_000).max(1_000);
    let sizes: Vec<usize> = [max / 1000, max / 100, max / 10, max]
        .into_iter()
        .map(|s| s.max(1))
        .collect();
    let dir = ctx.fresh_dir("w2").map_err(err)?;
    let opts = Options {
        lru_bytes: 0,
        ..Options::default()
    };
    let mut filled = 0usize;
    let mut flush_ms_all = Vec::new();
    let mut flush_min_all = Vec::new();
    let mut open_ms_all = Vec::new();
    let mut paired_all = Vec::new();
    for &s in &sizes {
        progress!("w2: filling to S = {s}");
        {
            let store = SegmentStore::open(&dir, opts.clone()).map_err(err)?;
            if s > filled {
                put_range(&store, ctx.seed, filled..s)?;
                store.flush().map_err(err)?;
                filled = s;
            }
        }
        // Let the fill's writeback drain, so every S is timed on a quiet
        // disk (the fill at S = 1M writes 0.5 GB just before).
        quiesce();
        // Open until the first get_batch can run.
        let mut open_ms = Vec::new();
        let mut index_bpe = 0.0;
        for _ in 0..REPS {
            let t = Instant::now();
            let store = SegmentStore::open(&dir, opts.clone()).map_err(err)?;
            let (_, _) = store.get_batch(&["s0"]).map_err(err)?;
            open_ms.push(t.elapsed().as_secs_f64() * 1e3);
            index_bpe = store.stats().index_bytes_per_entry;
        }
        // Flush of 1,000 new samples, each repetition paired with one on a
        // fresh store of S = 1k: fsync latency on this shared disk drifts
        // from minute to minute, and the pair sees the same disk.
        let store = SegmentStore::open(&dir, opts.clone()).map_err(err)?;
        let base_dir = ctx.fresh_dir("w2_base").map_err(err)?;
        let base = SegmentStore::open(&base_dir, opts.clone()).map_err(err)?;
        put_range(&base, ctx.seed, 0..NEW)?;
        base.flush().map_err(err)?;
        let mut base_filled = NEW;
        let mut flush_ms = Vec::new();
        let mut base_ms = Vec::new();
        for _ in 0..REPS {
            flush_ms.push(timed_flush(&store, ctx.seed, filled)?);
            filled += NEW;
            base_ms.push(timed_flush(&base, ctx.seed, base_filled)?);
            base_filled += NEW;
        }
        drop(base);
        std::fs::remove_dir_all(&base_dir).map_err(err)?;
        check(&store, ctx.seed, 0)?;
        check(&store, ctx.seed, filled - 1)?;
        check(&store, ctx.seed, s / 2)?;
        let entries = store.len();
        if entries != filled {
            return Err(RunError::WrongValue {
                workload: "w2",
                detail: format!("len {entries}, expected {filled}"),
            });
        }
        drop(store);
        let f = median(&mut flush_ms);
        let b = median(&mut base_ms);
        paired_all.push(f / b.max(1e-9));
        // Sorted by `median`: the fastest repetition, least disturbed by
        // other I/O on a shared disk.
        let f_min = flush_ms[0];
        flush_min_all.push(f_min);
        let o = median(&mut open_ms);
        flush_ms_all.push(f);
        open_ms_all.push(o);
        ctx.emit(
            Line::new("w2", "flush", NEW, (NEW * DIM * 4) as u64, f / 1e3)
                .with("s", s)
                .with("flush_ms", f)
                .with("flush_ms_min", f_min)
                .with("flush_ms_at_1k_paired", b)
                .with("open_ms", o)
                .with("index_bytes_per_entry", index_bpe),
        );
    }
    let first_f = flush_ms_all.first().copied().unwrap_or(1.0);
    let last_f = flush_ms_all.last().copied().unwrap_or(1.0);
    let first_o = open_ms_all.first().copied().unwrap_or(1.0);
    let last_o = open_ms_all.last().copied().unwrap_or(1.0);
    ctx.emit(
        Line::new("w2", "scaling", max, 0, 1.0)
            .with("s", max)
            .with("flush_ratio", last_f / first_f.max(1e-9))
            .with(
                "flush_ratio_min",
                flush_min_all.last().copied().unwrap_or(1.0)
                    / flush_min_all.first().copied().unwrap_or(1.0).max(1e-9),
            )
            .with(
                "flush_ratio_paired",
                paired_all.last().copied().unwrap_or(1.0),
            )
            .with("open_ratio", last_o / first_o.max(1e-9))
            .with("open_ms_at_max", last_o),
    );
    Ok(())
}
