//! W4 of `BENCHMARKS.md`: fixed-shape rows through `memmap-array`.
//!
//! N rows (default 20,000) of `data` int16 (3, 4096), `annotation` int8
//! (3, 4096) and `scaler` float32 (4096,). Every element is a function of
//! (row, element, seed). Phases:
//! - `write`: the streaming writer (default `sync_every`) then `finalize`,
//!   timed until finalize returns (every row durable), generation excluded;
//!   three repetitions from a settled disk, each compared with the durable
//!   sequential write limit measured right before it ([`crate::write_runs`]).
//! - reads: reopen the cache, then read every row once in a seeded random
//!   order, touching every byte (a checksum per row, checked against the
//!   one taken at write time, plus exact checks of the first and last
//!   element of each array), with `MemmapArray::prefetch` of the next row.
//!   `read_random_first_pass` is the first pass after open (it also pays
//!   the page faults that map the files); `read_random` is the median of
//!   the next 3 passes over the same open cache (the steady state of an
//!   epoch loop). Both are compared with the page-cache read limit.
//!   Each steady-state pass is followed by the same pass through
//!   `cache_facade::open(config)` (`CacheBackend::get_index` per row,
//!   `prefetch` of the next), reported as `read_random` with
//!   `"api": "facade"` beside the store's `"api": "store"`; the cache sits
//!   in the facade's directory for its config (`<dir>/w4/<key>`).

use std::path::Path;
use std::time::{Duration, Instant};

use cache_facade::{CacheBackend, CacheConfig, StoreKind, Value};
use memmap_array::{MemmapArray, NewRow, RowWriter, Schema, WriterOptions};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use tensor_core::{DType, Tensor, TensorView};

use crate::write_runs::{Synced, WritePattern, WriteRuns, remove_dir_if_any};
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
    acc.iter()
        .fold(tail, |a, &b| a.rotate_left(7).wrapping_add(b))
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
    // The facade's directory and fingerprint for this config (under
    // <dir>/w4, emptied before each write repetition), so the facade opens
    // what the writer built.
    let root = ctx.dir.join("w4");
    let config = CacheConfig::new(StoreKind::MemmapArray, &root, "w4").option("w4", seed);
    let dir = config.cache_dir().map_err(err)?;
    let fingerprint = fingerprint::compute_fingerprint(
        &config.identity().map_err(err)?,
        Vec::new(),
        memmap_array::CACHE_VERSION,
    )
    .map_err(err)?;
    let schema = schema()?;
    let row_bytes = schema.row_bytes();
    let total_bytes = row_bytes * n as u64;

    // Write.
    progress!("w4: writing {n} rows ({} MB)", total_bytes / 1_000_000);
    // Rows are generated once, outside the timed region (W4 times the
    // writer, not the generator); each repetition writes a fresh cache.
    let mut data = Tensor::zeros(DType::I16, [3, L]).map_err(err)?;
    let mut annotation = Tensor::zeros(DType::I8, [3, L]).map_err(err)?;
    let mut scaler = Tensor::zeros(DType::F32, [L]).map_err(err)?;
    let mut sums = Vec::with_capacity(n);
    let runs = WriteRuns::measure(
        ctx,
        W,
        || remove_dir_if_any(&ctx.dir.join("w4")),
        |_| {
            ctx.fresh_dir("w4").map_err(err)?;
            sums.clear();
            let mut timed = Duration::ZERO;
            let start = Instant::now();
            let mut writer =
                RowWriter::create_or_resume(&dir, &schema, &fingerprint).map_err(err)?;
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
                sums.push(row_checksum([
                    data.bytes(),
                    annotation.bytes(),
                    scaler.bytes(),
                ]));
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
            Ok(timed.as_secs_f64())
        },
        || {
            // The yardstick: each `.bin` appended with one fsync per group
            // commit (every `DEFAULT_SYNC_EVERY` rows, and at finalize), the
            // manifest likewise (finalize removes it: its size is taken as
            // one 64-byte line a row), then every finalized file written to a
            // temporary name, fsynced and renamed.
            let groups = n.div_ceil(WriterOptions::DEFAULT_SYNC_EVERY).max(1) as u64;
            let pattern = WritePattern::of_dir(&dir, |path, _| {
                let name = path.file_name()?.to_str()?;
                if name.ends_with(".lock") {
                    None
                } else if name.ends_with(".bin") {
                    Some(Synced::Appended(groups))
                } else {
                    Some(Synced::Renamed(1))
                }
            })?;
            Ok(pattern.with(64 * n as u64, Synced::Appended(groups)))
        },
    )?;
    let disk = dir_bytes(&dir)?;
    ctx.emit(
        runs.line(W, "write", n, total_bytes)
            .with("bytes_on_disk_per_item", disk as f64 / n.max(1) as f64),
    );

    // Random reads. The first pass after open also pays for mapping the
    // files (page faults); the later passes are the steady state of a
    // training loop that reads epoch after epoch through one open cache.
    let t = Instant::now();
    let cache = MemmapArray::open(&dir).map_err(err)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    if cache.len() != n as u64 {
        return Err(RunError::WrongValue {
            workload: W,
            detail: format!("{} rows after reopen, wrote {n}", cache.len()),
        });
    }
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let facade = cache_facade::open(&config).map_err(err)?;
    let mut pass_secs = Vec::new();
    let mut facade_secs = Vec::new();
    let mut facade_plain = Vec::new();
    let mut plain_read = Vec::new();
    for pass in 0..4 {
        order.shuffle(&mut rng);
        // The machine is shared and noisy: read the same files with plain
        // read() right before each pass, so each pass has a ceiling taken
        // under the same conditions.
        plain_read.push(plain_read_bytes_per_s(&dir)?);
        let t = Instant::now();
        for (k, &i) in order.iter().enumerate() {
            // The sampler knows the next row: let the reader start on it.
            if let Some(&next) = order.get(k + 1) {
                cache.prefetch(next as u64);
            }
            verify_row(&cache, i, seed, sums[i])?;
        }
        let secs = t.elapsed().as_secs_f64();
        progress!(
            "w4: read pass {pass}: {:.2} GB/s",
            total_bytes as f64 / secs / 1e9
        );
        pass_secs.push(secs);
        if pass > 0 {
            // The same conditions as the store's pass: a plain read first.
            facade_plain.push(plain_read_bytes_per_s(&dir)?);
            let t = Instant::now();
            for (k, &i) in order.iter().enumerate() {
                if let Some(&next) = order.get(k + 1) {
                    facade.prefetch(&[next as i64]);
                }
                verify_value(&facade.get_index(i as i64).map_err(err)?, i, seed, sums[i])?;
            }
            facade_secs.push(t.elapsed().as_secs_f64());
        }
    }
    let first = pass_secs[0];
    ctx.emit(
        Line::new(W, "read_random_first_pass", n, total_bytes, first)
            .limit(Limit::PageCacheRead)
            .with("gb_per_s", total_bytes as f64 / first / 1e9)
            .with("open_ms", open_ms),
    );
    let secs = median(&mut pass_secs[1..]);
    let plain = median(&mut plain_read[1..]);
    ctx.emit(
        Line::new(W, "read_random", n, total_bytes, secs)
            .limit(Limit::PageCacheRead)
            .with("gb_per_s", total_bytes as f64 / secs / 1e9)
            .with("open_ms", open_ms)
            .with("passes", 3)
            .with("same_files_read_gb_per_s", plain / 1e9)
            .with(
                "fraction_of_same_files_read",
                total_bytes as f64 / secs / plain,
            )
            .with("api", "store"),
    );
    let fsecs = median(&mut facade_secs);
    let fplain = median(&mut facade_plain);
    ctx.emit(
        Line::new(W, "read_random", n, total_bytes, fsecs)
            .limit(Limit::PageCacheRead)
            .with("gb_per_s", total_bytes as f64 / fsecs / 1e9)
            .with("passes", 3)
            .with("same_files_read_gb_per_s", fplain / 1e9)
            .with(
                "fraction_of_same_files_read",
                total_bytes as f64 / fsecs / fplain,
            )
            .with("api", "facade"),
    );
    progress!(
        "w4: facade reads cost {:+.1}% over the store's",
        (fsecs / secs - 1.0) * 100.0
    );
    Ok(())
}

/// [`verify_row`] for a row read through the facade (a dict of views).
fn verify_value(row: &Value, i: usize, seed: u64, expected: u64) -> Result<(), RunError> {
    let wrong = |detail: String| RunError::WrongValue {
        workload: W,
        detail: format!("facade: {detail}"),
    };
    let array = |name: &str| {
        row.get(name)
            .and_then(Value::as_tensor)
            .ok_or_else(|| wrong(format!("row {i}: array {name} missing")))
    };
    let (data, annotation, scaler) = (array("data")?, array("annotation")?, array("scaler")?);
    check_arrays(
        [data.view(), annotation.view(), scaler.view()],
        i,
        seed,
        expected,
        wrong,
    )
}

/// Bandwidth of reading every `.bin` of the cache with read() into a 1 MiB
/// buffer (the page-cache read limit's method, on these files).
fn plain_read_bytes_per_s(dir: &Path) -> Result<f64, RunError> {
    use std::io::Read;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0usize;
    let t = Instant::now();
    for name in ["data.bin", "annotation.bin", "scaler.bin"] {
        let mut file = std::fs::File::open(dir.join(name)).map_err(err)?;
        loop {
            let n = file.read(&mut buf).map_err(err)?;
            if n == 0 {
                break;
            }
            total += n;
        }
    }
    std::hint::black_box(&buf);
    Ok(total as f64 / t.elapsed().as_secs_f64().max(1e-9))
}

fn verify_row(cache: &MemmapArray, i: usize, seed: u64, expected: u64) -> Result<(), RunError> {
    let wrong = |detail: String| RunError::WrongValue {
        workload: W,
        detail,
    };
    let view = |k: usize| {
        cache
            .array_at(i as u64, k)
            .map_err(err)?
            .ok_or_else(|| wrong(format!("row {i}: array {k} missing")))
    };
    check_arrays([view(0)?, view(1)?, view(2)?], i, seed, expected, wrong)
}

/// The checks of one row, whichever API read it: the checksum of every
/// byte, and the first and last element of each array.
fn check_arrays(
    [data, annotation, scaler]: [TensorView<'_>; 3],
    i: usize,
    seed: u64,
    expected: u64,
    wrong: impl Fn(String) -> RunError,
) -> Result<(), RunError> {
    let sum = row_checksum([data.bytes(), annotation.bytes(), scaler.bytes()]);
    if sum != expected {
        return Err(wrong(format!(
            "row {i}: checksum {sum:#x}, expected {expected:#x}"
        )));
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
