//! W1 of `BENCHMARKS.md`: keyed tensor cache (segment-store).
//!
//! Writes N samples `sample_{i}` (f32\[512\]; then a second cache of dicts
//! `{features: f32[512], logits: f16[10]}`) with `put_batch` in batches of
//! 256 and the default flush policy, then `flush()` (timed as one interval
//! from open to the durable flush, over values generated before the clock
//! starts; three repetitions, each from a settled disk next to a fresh
//! durable-write limit, see [`crate::write_runs`]); once with the default
//! options (phase `write`) and once with `async_write` (`write_async`). Reopens from disk with
//! the LRU disabled and reads 200 batches of 256 uniformly random keys;
//! each timed batch is `get_batch` plus a pass over every returned element
//! (what a consumer does with the zero-copy views). Every value is checked
//! after the timed region. Each read pass runs twice, through the store's
//! own API (`"api": "store"`) and through `cache_facade::open(config)`'s
//! `CacheBackend::get_batch` (`"api": "facade"`), alternating, so the two
//! lines share the machine's conditions; the cache sits in the facade's
//! directory for its config (`<dir>/w1/<key>`).

use std::path::Path;
use std::time::Instant;

use cache_facade::{CacheBackend, CacheConfig, StoreKind};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use segment_store::{Options, SegmentStore};
use tensor_core::{Tensor, Value, f16};

use crate::limits::MemcpyProbe;
use crate::write_runs::{Synced, WritePattern, WriteRuns, remove_dir_if_any};
use crate::{Ctx, Limit, Line, RunError, median, progress};

const DIM: usize = 512;
const LOGITS: usize = 10;
const BATCH: usize = 256;
const READ_BATCHES: usize = 200;
/// Read passes per cache; the reported one is the median by fraction of
/// the limit.
const PASSES: usize = 5;

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store("w1", e)
}

fn features(seed: u64, i: usize) -> Vec<f32> {
    let base = ((i as u64 + seed) % 65_536) as f32 * 0.25;
    (0..DIM).map(|j| base + j as f32).collect()
}

fn logits(seed: u64, i: usize) -> Vec<f16> {
    (0..LOGITS)
        .map(|j| f16::from_f32(((i as u64 + seed + j as u64) % 1024) as f32))
        .collect()
}

fn record(seed: u64, i: usize, dict: bool) -> Result<Value, RunError> {
    let f = Tensor::from_vec([DIM], features(seed, i)).map_err(err)?;
    if !dict {
        return Ok(Value::from(f));
    }
    let l = Tensor::from_vec([LOGITS], logits(seed, i)).map_err(err)?;
    Ok(Value::dict([
        ("features", Value::from(f)),
        ("logits", Value::from(l)),
    ]))
}

fn check(seed: u64, i: usize, rec: Option<&Value>, dict: bool) -> Result<(), RunError> {
    let wrong = |detail: String| RunError::WrongValue {
        workload: "w1",
        detail,
    };
    let rec = rec.ok_or_else(|| wrong(format!("sample_{i} missing")))?;
    let f = if dict {
        rec.get("features").and_then(Value::as_tensor)
    } else {
        rec.as_tensor()
    }
    .ok_or_else(|| wrong(format!("sample_{i}: no features tensor")))?;
    if f.view().as_slice::<f32>().map_err(err)? != features(seed, i).as_slice() {
        return Err(wrong(format!("sample_{i}: features differ")));
    }
    if dict {
        let l = rec
            .get("logits")
            .and_then(Value::as_tensor)
            .ok_or_else(|| wrong(format!("sample_{i}: no logits")))?;
        if l.view().as_slice::<f16>().map_err(err)? != logits(seed, i).as_slice() {
            return Err(wrong(format!("sample_{i}: logits differ")));
        }
    }
    Ok(())
}

fn disk_bytes(dir: &Path) -> u64 {
    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
    }
    walk(dir)
}

/// The yardstick of a segment-store write: each segment written under a
/// temporary name, fsynced, renamed, the directory fsynced; the index log
/// appended and fsynced once per segment; `schema.json` like a segment.
pub fn segment_pattern(dir: &Path) -> std::io::Result<WritePattern> {
    let segments = std::fs::read_dir(dir.join(segment_store::format::SEGMENTS_DIR))?.count();
    WritePattern::of_dir(dir, |path, _| {
        let name = path.file_name()?.to_str()?;
        if name.ends_with(".lock") {
            None
        } else if name.ends_with(".log") {
            Some(Synced::Appended(segments as u64))
        } else {
            Some(Synced::Renamed(1))
        }
    })
}

fn run_one(ctx: &Ctx, n: usize, dict: bool) -> Result<(), RunError> {
    let suffix = if dict { "_dict" } else { "" };
    let name = format!("w1{suffix}");
    // The facade's directory for this config, under <dir>/<name> (emptied
    // before each write repetition); the LRU is off for reads.
    let root = ctx.dir.join(&name);
    let config = CacheConfig::new(StoreKind::SegmentStore, &root, "w1").option("lru_bytes", 0);
    let dir = config.cache_dir().map_err(err)?;
    let item_bytes = DIM * 4 + if dict { LOGITS * 2 } else { 0 };
    // Timed as one interval: open, every put_batch and the final flush
    // (durable), over values generated before the clock starts (their
    // generation is not the store's cost, and generating them between
    // calls would hand the disk untimed write-back time). Twice: with the
    // store's default options (each full segment written and committed
    // inside the `put_batch` that fills it) as phase `write{suffix}`, and
    // with `async_write` (torchcachex's default: a background thread
    // writes and commits while the caller goes on) as
    // `write{suffix}_async`. Each repetition writes a fresh store; the
    // reads use the last one.
    for (mode, async_write) in [("", false), ("_async", true)] {
        progress!("w1{suffix}{mode}: writing {n} samples");
        let runs = WriteRuns::measure(
            ctx,
            &format!("{name}{mode}"),
            || remove_dir_if_any(&ctx.dir.join(&name)),
            |_| {
                ctx.fresh_dir(&name).map_err(err)?;
                std::fs::create_dir_all(&dir).map_err(err)?;
                let batches = (0..n)
                    .step_by(BATCH)
                    .map(|i| {
                        (i..(i + BATCH).min(n))
                            .map(|k| Ok((format!("sample_{k}"), record(ctx.seed, k, dict)?)))
                            .collect::<Result<Vec<_>, RunError>>()
                    })
                    .collect::<Result<Vec<_>, RunError>>()?;
                let opts = Options {
                    async_write,
                    ..Options::default()
                };
                let t = Instant::now();
                let store = SegmentStore::open(&dir, opts).map_err(err)?;
                for items in &batches {
                    store.put_batch(items).map_err(err)?;
                }
                store.flush().map_err(err)?;
                drop(store);
                Ok(t.elapsed().as_secs_f64())
            },
            || segment_pattern(&dir),
        )?;
        let on_disk = disk_bytes(&dir);
        ctx.emit(
            runs.line(
                "w1",
                &format!("write{suffix}{mode}"),
                n,
                (n * item_bytes) as u64,
            )
            .with("bytes_on_disk_per_item", on_disk as f64 / n.max(1) as f64),
        );
    }

    // The read pass is repeated: one pass right after the write swings
    // with the machine's state (the VM's neighbours, the page cache
    // settling after 400 MB of writes). Each pass is preceded by a fresh
    // measurement of the memcpy limit, which also flushes the CPU caches,
    // so no pass finds the previous one's metadata cached.
    let mut probe = MemcpyProbe::new(ctx.limits.memcpy_bytes);
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x5eed);
    let mut passes = Vec::with_capacity(PASSES);
    let mut facade_passes = Vec::with_capacity(PASSES);
    for p in 0..PASSES {
        // The two APIs take turns going first, so neither always reads
        // right after the other.
        for facade in [p % 2 == 1, p % 2 == 0] {
            let memcpy = probe.median_of_3();
            if facade {
                let pass = facade_read_pass(ctx, &config, n, dict, &mut rng)?;
                facade_passes.push((pass, memcpy));
            } else {
                let pass = read_pass(ctx, &dir, n, dict, &mut rng)?;
                passes.push((pass, memcpy));
            }
        }
    }
    drop(probe);
    let store_secs = emit_read(ctx, "store", &passes, item_bytes, suffix);
    let facade_secs = emit_read(ctx, "facade", &facade_passes, item_bytes, suffix);
    progress!(
        "w1{suffix}: facade reads cost {:+.1}% over the store's",
        (facade_secs / store_secs - 1.0) * 100.0
    );
    Ok(())
}

/// Emits the median pass (by fraction of its memcpy limit) of one API as
/// the `read_random` line; returns its seconds.
fn emit_read(ctx: &Ctx, api: &str, passes: &[(Pass, f64)], item_bytes: usize, suffix: &str) -> f64 {
    let reads = READ_BATCHES * BATCH;
    let bytes = (reads * item_bytes) as u64;
    let fraction = |(p, memcpy): &(Pass, f64)| bytes as f64 / p.secs / memcpy;
    let fractions: Vec<f64> = passes.iter().map(fraction).collect();
    let mut by_fraction: Vec<usize> = (0..passes.len()).collect();
    by_fraction.sort_by(|&a, &b| fractions[a].total_cmp(&fractions[b]));
    let (pass, memcpy) = &passes[by_fraction[by_fraction.len() / 2]];
    let mut sorted = pass.lat.clone();
    let p50 = median(&mut sorted);
    let p99 = sorted[(sorted.len() * 99 / 100).min(sorted.len() - 1)];
    ctx.emit(
        Line::new(
            "w1",
            &format!("read_random{suffix}"),
            reads,
            bytes,
            pass.secs,
        )
        .limit_measured(Limit::Memcpy, *memcpy)
        .with("passes", PASSES)
        .with("pass_fractions", fractions)
        .with("open_ms", pass.open_ms)
        .with("p50_ms", p50)
        .with("first_batch_ms", pass.lat[0])
        .with("p99_ms", p99)
        .with("batch", BATCH)
        .with("api", api),
    );
    pass.secs
}

/// One timed read pass.
struct Pass {
    /// Time inside the 200 timed batches.
    secs: f64,
    /// Per-batch latency, ms.
    lat: Vec<f64>,
    /// Reopening the store, ms (not part of `secs`).
    open_ms: f64,
}

/// Reopens the store with the LRU disabled and reads 200 batches of
/// random keys; values are checked after the timed region.
fn read_pass(
    ctx: &Ctx,
    dir: &Path,
    n: usize,
    dict: bool,
    rng: &mut StdRng,
) -> Result<Pass, RunError> {
    let opts = Options {
        lru_bytes: 0,
        ..Options::default()
    };
    // The reopen is reported (`open_ms`) but not part of the read
    // throughput; segments decode lazily, so the first timed batch pays
    // for decoding them (`first_batch_ms`).
    let t = Instant::now();
    let store = SegmentStore::open(dir, opts).map_err(err)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    timed_batches(
        n,
        rng,
        open_ms,
        "",
        |keys| store.get_batch(keys).map_err(err),
        |r: &Value| {
            let f = if dict {
                r.get("features").and_then(Value::as_tensor)
            } else {
                r.as_tensor()
            };
            f.map(|f| f.view().as_slice::<f32>().map(touch).map_err(err))
                .transpose()
        },
        |i, r| check(ctx.seed, i, r, dict),
    )
}

/// The timed loop of both read passes: [`READ_BATCHES`] batches of
/// [`BATCH`] random keys, each timed as `lookup` plus `touch` of every
/// returned value (the sum of its features); every value of a sample of
/// batches (all of them at small sizes) is checked after the timed region.
fn timed_batches<V>(
    n: usize,
    rng: &mut StdRng,
    open_ms: f64,
    api: &str,
    mut lookup: impl FnMut(&[String]) -> Result<(Vec<Option<V>>, Vec<usize>), RunError>,
    touch: impl Fn(&V) -> Result<Option<f32>, RunError>,
    check: impl Fn(usize, Option<&V>) -> Result<(), RunError>,
) -> Result<Pass, RunError> {
    let mut lat = Vec::with_capacity(READ_BATCHES);
    let mut secs = 0.0f64;
    let mut sink = 0.0f32;
    let mut to_check = Vec::new();
    for b in 0..READ_BATCHES {
        let ids: Vec<usize> = (0..BATCH).map(|_| rng.random_range(0..n)).collect();
        let keys: Vec<String> = ids.iter().map(|i| format!("sample_{i}")).collect();
        let t = Instant::now();
        let (values, missing) = lookup(&keys)?;
        for v in values.iter().flatten() {
            sink += touch(v)?.unwrap_or(0.0);
        }
        let dt = t.elapsed().as_secs_f64();
        secs += dt;
        lat.push(dt * 1e3);
        if !missing.is_empty() {
            return Err(RunError::WrongValue {
                workload: "w1",
                detail: format!("{api}{} keys missing", missing.len()),
            });
        }
        if b % 10 == 0 || n <= 10_000 {
            to_check.push((ids, values));
        }
    }
    std::hint::black_box(sink);
    for (ids, values) in &to_check {
        for (i, v) in ids.iter().zip(values) {
            check(*i, v.as_ref())?;
        }
    }
    Ok(Pass { secs, lat, open_ms })
}

/// [`read_pass`] through the facade: `open(config)` and
/// `CacheBackend::get_batch`, values as [`Value`] views.
fn facade_read_pass(
    ctx: &Ctx,
    config: &CacheConfig,
    n: usize,
    dict: bool,
    rng: &mut StdRng,
) -> Result<Pass, RunError> {
    let t = Instant::now();
    let cache = cache_facade::open(config).map_err(err)?;
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    timed_batches(
        n,
        rng,
        open_ms,
        "facade: ",
        |keys| {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            cache.get_batch(&refs).map_err(err)
        },
        |v: &Value| {
            let f = if dict {
                v.get("features").and_then(Value::as_tensor)
            } else {
                v.as_tensor()
            };
            f.map(|f| f.as_slice::<f32>().map(touch).map_err(err))
                .transpose()
        },
        |i, v| check_value(ctx.seed, i, v, dict),
    )
}

/// [`check`] for a value read through the facade.
fn check_value(seed: u64, i: usize, v: Option<&Value>, dict: bool) -> Result<(), RunError> {
    let wrong = |detail: String| RunError::WrongValue {
        workload: "w1",
        detail: format!("facade: {detail}"),
    };
    let v = v.ok_or_else(|| wrong(format!("sample_{i} missing")))?;
    let f = if dict {
        v.get("features").and_then(Value::as_tensor)
    } else {
        v.as_tensor()
    }
    .ok_or_else(|| wrong(format!("sample_{i}: no features tensor")))?;
    if f.as_slice::<f32>().map_err(err)? != features(seed, i).as_slice() {
        return Err(wrong(format!("sample_{i}: features differ")));
    }
    if dict {
        let l = v
            .get("logits")
            .and_then(Value::as_tensor)
            .ok_or_else(|| wrong(format!("sample_{i}: no logits")))?;
        if l.as_slice::<f16>().map_err(err)? != logits(seed, i).as_slice() {
            return Err(wrong(format!("sample_{i}: logits differ")));
        }
    }
    Ok(())
}

/// Reads every element (16 independent lanes, so the pass runs at memory
/// speed rather than at the latency of one chain of float adds).
fn touch(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = xs.chunks_exact(16);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Runs W1.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let n = ctx.n_or(200_000).max(1);
    run_one(ctx, n, false)?;
    run_one(ctx, n, true)
}
