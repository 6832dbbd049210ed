//! W4 of `BENCHMARKS.md`: fixed-shape rows through `memmap-array`.
//!
//! N rows (default 20,000) of `data` int16 (3, 4096), `annotation` int8
//! (3, 4096) and `scaler` float32 (4096,). Every element is a function of
//! (row, element, seed). Phases:
//! - `write`: the streaming writer (default `sync_every`) then `finalize`,
//!   timed until finalize returns (every row durable), generation excluded;
//!   compared with the durable sequential write limit.
//! - `read_random`: reopen the cache, then read every row once in a seeded
//!   random order, touching every byte (a checksum per row, checked against
//!   the one taken at write time, plus exact checks of the first and last
//!   element of each array); median of 3 passes, each on a freshly opened
//!   cache; compared with the page-cache read limit.

use std::path::Path;
use std::time::{Duration, Instant};

use memmap_array::{ArrayCache, NewRow, RowWriter, Schema};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tensor_core::{DType, Tensor};

use crate::{Ctx, Limit, Line, RunError, median, progress};

const W: &str = "w4";
const L: usize = 4096;

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store(W, e)
}

fn data_value(i: usize, j: usize, seed: u64) -> i16 {
    (i.wrapping_mul(7).wrapping_add(j.wrapping_mul(13)) as u64).wrapping_add(seed) as i16
}

fn annotation_value(i: usize, j: usize, seed: u64) -> i8 {
    (i.wrapping_add(j.wrapping_mul(3)) as u64).wrapping_add(seed) as i8
}

fn scaler_value(i: usize, j: usize, seed: u64) -> f32 {
    ((i as u64 + seed) % 1000) as f32 + j as f32 * 0.25
}

/// Sum of the bytes read as little-endian u64 words in 8 lanes (every
/// byte counts; the lanes let the compiler vectorise the loop).
fn checksum(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(64);
    let mut acc = [0u64; 8];
    for c in &mut chunks {
        for (lane, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            *lane = lane.wrapping_add(u64::from_le_bytes(word));
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    acc.iter().fold(tail, |a, &b| a.rotate_left(7).wrapping_add(b))
}

fn row_checksum(parts: [&[u8]; 3]) -> u64 {
    parts
        .iter()
        .fold(0u64, |a, p| a.rotate_left(17) ^ checksum(p))
}

fn schema() -> Result<Schema, RunError> {
    Schema::builder()
        .array("data", DType::I16, [3, L])
        .array("annotation", DType::I8, [3, L])
        .array("scaler", DType::F32, [L])
        .build()
        .map_err(err)
}

fn dir_bytes(dir: &Path) -> Result<u64, RunError> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(err)? {
        total += entry.map_err(err)?.metadata().map_err(err)?.len();
    }
    Ok(total)
}

/// Runs W4.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let n = ctx.n_or(20_000);
    let seed = ctx.seed;
    let dir = ctx.fresh_dir("w4").map_err(err)?;
    let schema = schema()?;
    let row_bytes = schema.row_bytes();
    let total_bytes = row_bytes * n as u64;

    // Write.
    progress!("w4: writing {n} rows ({} MB)", total_bytes / 1_000_000);
    let mut data = Tensor::zeros(DType::I16, [3, L]).map_err(err)?;
    let mut annotation = Tensor::zeros(DType::I8, [3, L]).map_err(err)?;
    let mut scaler = Tensor::zeros(DType::F32, [L]).map_err(err)?;
    let mut sums = Vec::with_capacity(n);
    let mut timed = Duration::ZERO;
    let start = Instant::now();
    let mut writer = RowWriter::create_or_resume(&dir, &schema, serde_json::json!({"w4": seed}))
        .map_err(err)?;
    timed += start.elapsed();
    for i in 0..n {
        for (j, c) in data.bytes_mut().chunks_exact_mut(2).enumerate() {
            c.copy_from_slice(&data_value(i, j, seed).to_le_bytes());
        }
        for (j, c) in annotation.bytes_mut().iter_mut().enumerate() {
            *c = annotation_value(i, j, seed) as u8;
        }
        for (j, c) in scaler.bytes_mut().chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&scaler_value(i, j, seed).to_le_bytes());
        }
        sums.push(row_checksum([data.bytes(), annotation.bytes(), scaler.bytes()]));
        let source = format!("sample_{i}");
        let row = NewRow::new(&source)
            .array("data", data.view())
            .array("annotation", annotation.view())
            .array("scaler", scaler.view());
        let t = Instant::now();
        writer.write(&row).map_err(err)?;
        timed += t.elapsed();
    }
    let t = Instant::now();
    writer.finalize().map_err(err)?;
    timed += t.elapsed();
    let disk = dir_bytes(&dir)?;
    ctx.emit(
        Line::new(W, "write", n, total_bytes, timed.as_secs_f64())
            .limit(Limit::DurableWrite)
            .with("bytes_on_disk_per_item", disk as f64 / n.max(1) as f64),
    );

    // Random reads, each pass on a freshly opened cache.
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut read_secs = Vec::new();
    let mut open_ms = Vec::new();
    let same = std::env::var_os("W4_SAME").is_some();
    let shared = ArrayCache::open(&dir).map_err(err)?;
    for pass in 0..3 {
        if std::env::var_os("W4_SEQ").is_none() { order.shuffle(&mut rng); }
        let t = Instant::now();
        let fresh;
        let cache = if same { &shared } else { fresh = ArrayCache::open(&dir).map_err(err)?; &fresh };
        open_ms.push(t.elapsed().as_secs_f64() * 1e3);
        if cache.len() != n as u64 {
            return Err(RunError::WrongValue {
                workload: W,
                detail: format!("{} rows after reopen, wrote {n}", cache.len()),
            });
        }
        let t = Instant::now();
        let pf = std::env::var_os("W4_PF").is_some();
        for (k, &i) in order.iter().enumerate() {
            if pf { if let Some(&next) = order.get(k + 1) { cache.prefetch(next as u64); } }
            verify_row(cache, i, seed, sums[i])?;
        }
        let secs = t.elapsed().as_secs_f64();
        progress!("w4: read pass {pass}: {:.2} GB/s", total_bytes as f64 / secs / 1e9);
        read_secs.push(secs);
    }
    let secs = median(&mut read_secs);
    ctx.emit(
        Line::new(W, "read_random", n, total_bytes, secs)
            .limit(Limit::PageCacheRead)
            .with("gb_per_s", total_bytes as f64 / secs / 1e9)
            .with("open_ms", median(&mut open_ms)),
    );
    Ok(())
}

fn verify_row(cache: &ArrayCache, i: usize, seed: u64, expected: u64) -> Result<(), RunError> {
    let wrong = |detail: String| RunError::WrongValue { workload: W, detail };
    let view = |k: usize| {
        cache
            .array_at(i as u64, k)
            .map_err(err)?
            .ok_or_else(|| wrong(format!("row {i}: array {k} missing")))
    };
    let (data, annotation, scaler) = (view(0)?, view(1)?, view(2)?);
    let sum = row_checksum([data.bytes(), annotation.bytes(), scaler.bytes()]);
    if sum != expected {
        return Err(wrong(format!("row {i}: checksum {sum:#x}, expected {expected:#x}")));
    }
    let d = data.as_slice::<i16>().map_err(err)?;
    let a = annotation.as_slice::<i8>().map_err(err)?;
    let s = scaler.as_slice::<f32>().map_err(err)?;
    let last = 3 * L - 1;
    if d[0] != data_value(i, 0, seed)
        || d[last] != data_value(i, last, seed)
        || a[0] != annotation_value(i, 0, seed)
        || a[last] != annotation_value(i, last, seed)
        || s[0] != scaler_value(i, 0, seed)
        || s[L - 1] != scaler_value(i, L - 1, seed)
    {
        return Err(wrong(format!("row {i}: first or last element differs")));
    }
    Ok(())
}
