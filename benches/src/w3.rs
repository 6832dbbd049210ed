//! W3 of `BENCHMARKS.md`: random access over an iterable (shard-store).
//!
//! The source yields N records `(id: u64, payload: 200 bytes)`, payload byte
//! j of record i a function of (i, j, seed). Shards hold
//! [`SHARD_ITEMS`] records (~1.7 MB pickled) so that the disk budget of the
//! last phase leaves a quarter of the shards on disk. Phases:
//!
//! - `first_pass`: a fresh store iterated end to end (the source is pulled,
//!   pickled and written durably shard by shard); three repetitions from a
//!   settled disk ([`crate::write_runs`]).
//! - `decode_only`: decoding every shard file's bytes (already in memory)
//!   with this crate's decoder, safety checks included: the floor of a cached
//!   pass. `decode_only_serde_pickle`: the same with plain serde-pickle.
//! - `read_sequential_cached`: a fresh handle (no source, empty memory cache)
//!   iterated end to end from the shard files with `iter()` (owned items);
//!   `ratio_to_decode` compares it with `decode_only` (target <= 2).
//! - `read_random_cold`: 100,000 uniform random `get`s on a fresh handle
//!   (shards load from disk on first touch).
//! - `read_random`: the same reads again on the now warm handle.
//! - `read_random_budget`: the same reads on a fresh root with
//!   `memory_limit` = 25% of the full cache and 8 shards in memory, issued
//!   as `get_many` batches of 10,000 (each batch is served in one forward
//!   pass of the source for the shards that were evicted).
//! - `read_random_budget_single_replay`: a few hundred single `get`s under
//!   the same budget with the plain source (each miss replays the source
//!   from item 0: the cost loadit also pays).
//! - `read_random_budget_single`: single `get`s under the same budget with
//!   a seekable source (`open_with_seekable_source`): a miss replays its
//!   own shard. Reports `miss_s` (all the time over the shards
//!   regenerated) beside `shard_generate_write_s` (generating, pickling
//!   and durably writing one shard by hand) and their ratio.
//!
//! Every value read is checked after the timed region; a wrong one fails the run.

use std::path::Path;
use std::time::Instant;

use shard_store::{Bytes, Options, ShardName, ShardStore, format, inspect};

use crate::write_runs::{Synced, WritePattern, WriteRuns, remove_dir_if_any};
use crate::{Ctx, Limit, Line, RunError, progress};

/// Records per shard.
pub const SHARD_ITEMS: u64 = 8192;
/// Payload bytes per record.
pub const PAYLOAD: usize = 200;
/// Random reads per random phase.
pub const RANDOM_READS: usize = 100_000;
/// `get_many` batch size under the disk budget.
pub const BUDGET_BATCH: usize = 10_000;

type Record = (u64, Bytes);

fn record(i: u64, seed: u64) -> Record {
    let base = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    let payload = (0..PAYLOAD as u64)
        .map(|j| (base.wrapping_add(j.wrapping_mul(131)) >> 7) as u8)
        .collect();
    (i, Bytes(payload))
}

fn check(workload: &'static str, i: u64, got: &Record, seed: u64) -> Result<(), RunError> {
    let want = record(i, seed);
    if *got != want {
        return Err(RunError::WrongValue {
            workload,
            detail: format!(
                "record {i}: got id {} and {} payload bytes",
                got.0,
                got.1.len()
            ),
        });
    }
    Ok(())
}

fn store_err(e: shard_store::Error) -> RunError {
    RunError::store("w3", e)
}

/// Uniform random indices from a small LCG (deterministic from the seed).
fn random_indices(n: u64, count: usize, seed: u64) -> Vec<u64> {
    let mut x = seed ^ 0x5DEE_CE66_D1CE_4E5B;
    (0..count)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (x >> 11) % n
        })
        .collect()
}

const ITEM_BYTES: u64 = 8 + PAYLOAD as u64;

/// Runs W3.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let n = ctx.n_or(1_000_000) as u64;
    let seed = ctx.seed;
    let root = ctx.dir.join("w3");
    let opts = Options::default().shard_items(SHARD_ITEMS);
    let source = move || (0..n).map(move |i| record(i, seed));

    // 1. First pass: pull, pickle, write durably (a fresh root each repetition).
    progress!("w3: first pass over {n} records");
    // Its yardstick: every shard (and metadata file) written to a
    // temporary name, fsynced, renamed, the directory fsynced.
    let shard_pattern = || {
        WritePattern::of_dir(&root, |path, _| {
            let name = path.file_name()?.to_str()?;
            (!name.ends_with(".lock")).then_some(Synced::Renamed(1))
        })
    };
    let runs = WriteRuns::measure(
        ctx,
        "w3 first_pass",
        || remove_dir_if_any(&ctx.dir.join("w3")),
        |_| {
            let root = ctx.fresh_dir("w3").map_err(|e| RunError::store("w3", e))?;
            let store =
                ShardStore::open_with_source(&root, opts.clone(), source).map_err(store_err)?;
            let t = Instant::now();
            let mut count = 0u64;
            for shard in store.iter_shards() {
                let shard = shard.map_err(store_err)?;
                count += shard.len() as u64;
            }
            let secs = t.elapsed().as_secs_f64();
            drop(store);
            let summary = inspect(&root).map_err(store_err)?;
            if count != n || summary.length != Some(n) || !summary.complete {
                return Err(RunError::WrongValue {
                    workload: "w3",
                    detail: format!(
                        "first pass saw {count} records, store says {:?}",
                        summary.length
                    ),
                });
            }
            Ok(secs)
        },
        shard_pattern,
    )?;
    let summary = inspect(&root).map_err(store_err)?;
    let disk = summary.bytes_on_disk;
    ctx.emit(
        runs.line("w3", "first_pass", n as usize, n * ITEM_BYTES)
            .with("bytes_on_disk_per_item", disk as f64 / n as f64)
            .with("shards", summary.shards),
    );

    // 2. The floor: decoding the shard bytes alone (already in memory), with
    // this crate's decoder (checks included), and with serde-pickle for reference.
    let files = shard_files(&root)?;
    let mut decoded = 0u64;
    let mut samples = Vec::new();
    for _ in 0..3 {
        decoded = 0;
        let t = Instant::now();
        for (name, bytes) in &files {
            let items: Vec<Record> =
                format::decode_shard(Path::new("w3"), *name, bytes).map_err(store_err)?;
            decoded += items.len() as u64;
        }
        samples.push(t.elapsed().as_secs_f64());
    }
    let decode_secs = crate::median(&mut samples);
    let t = Instant::now();
    for (_, bytes) in &files {
        let items: Vec<Record> = serde_pickle::from_slice(bytes, serde_pickle::DeOptions::new())
            .map_err(|e| RunError::store("w3", e))?;
        decoded += items.len() as u64;
    }
    let serde_pickle_secs = t.elapsed().as_secs_f64();
    if decoded != 2 * n {
        return Err(RunError::WrongValue {
            workload: "w3",
            detail: format!("decoded {decoded} records from the shard files twice"),
        });
    }
    drop(files);
    ctx.emit(Line::new("w3", "decode_only", n as usize, disk, decode_secs).limit(Limit::Memcpy));
    ctx.emit(
        Line::new(
            "w3",
            "decode_only_serde_pickle",
            n as usize,
            disk,
            serde_pickle_secs,
        )
        .limit(Limit::Memcpy),
    );

    // 3. Sequential pass from the cache: a fresh handle (no source, empty
    // memory cache) each repetition, median of 3.
    let want_checksum = (0..n).fold(0u64, |a, i| a.wrapping_add(i ^ record(i, seed).1[0] as u64));
    let mut samples = Vec::new();
    for _ in 0..3 {
        let cached: ShardStore<Record> =
            ShardStore::open(&root, opts.clone()).map_err(store_err)?;
        let t = Instant::now();
        let mut seq_checksum = 0u64;
        let mut seen = 0u64;
        for r in cached.iter() {
            let r = r.map_err(store_err)?;
            seq_checksum = seq_checksum.wrapping_add(r.0 ^ r.1[0] as u64);
            seen += 1;
        }
        samples.push(t.elapsed().as_secs_f64());
        if seen != n || seq_checksum != want_checksum {
            return Err(RunError::WrongValue {
                workload: "w3",
                detail: format!(
                    "sequential pass: {seen} records, checksum {seq_checksum:#x} != {want_checksum:#x}"
                ),
            });
        }
    }
    let seq_secs = crate::median(&mut samples);
    ctx.emit(
        Line::new(
            "w3",
            "read_sequential_cached",
            n as usize,
            n * ITEM_BYTES,
            seq_secs,
        )
        .limit(Limit::PageCacheRead)
        .with("ratio_to_decode", seq_secs / decode_secs.max(1e-9))
        .with("repetitions", 3),
    );

    // 4. Random reads, cold then warm, on a fresh handle.
    let reads = RANDOM_READS.min(n as usize * 10);
    let idx = random_indices(n, reads, seed);
    let fresh: ShardStore<Record> = ShardStore::open(&root, opts.clone()).map_err(store_err)?;
    for (phase, repeat) in [("read_random_cold", 1), ("read_random", 5)] {
        let mut samples = Vec::new();
        let mut got = Vec::with_capacity(reads);
        for _ in 0..repeat {
            got.clear();
            let t = Instant::now();
            for &i in &idx {
                got.push(fresh.get(i as i64).map_err(store_err)?);
            }
            samples.push(t.elapsed().as_secs_f64());
        }
        for (k, &i) in idx.iter().enumerate() {
            check("w3", i, &got[k], seed)?;
        }
        let secs = crate::median(&mut samples);
        ctx.emit(
            Line::new("w3", phase, reads, reads as u64 * ITEM_BYTES, secs)
                .limit(Limit::Memcpy)
                .with("repetitions", repeat),
        );
    }
    drop(fresh);

    // 5. Random reads under a disk budget of 25% of the full cache.
    let budget = disk / 4;
    let broot = ctx
        .fresh_dir("w3-budget")
        .map_err(|e| RunError::store("w3", e))?;
    let bopts = Options {
        memory_limit: Some(budget),
        max_cache_size: 8,
        ..opts.clone()
    };
    let bstore = ShardStore::open_with_source(&broot, bopts, source).map_err(store_err)?;
    progress!("w3: {reads} random reads under a {budget} byte disk budget");
    let t = Instant::now();
    let mut got = Vec::with_capacity(reads);
    for batch in idx.chunks(BUDGET_BATCH) {
        let ask: Vec<i64> = batch.iter().map(|&i| i as i64).collect();
        got.extend(bstore.get_many(&ask).map_err(store_err)?);
    }
    let secs = t.elapsed().as_secs_f64();
    for (k, &i) in idx.iter().enumerate() {
        check("w3", i, &got[k], seed)?;
    }
    let peak_disk = inspect(&broot).map_err(store_err)?.bytes_on_disk;
    ctx.emit(
        Line::new(
            "w3",
            "read_random_budget",
            reads,
            reads as u64 * ITEM_BYTES,
            secs,
        )
        .with("memory_limit", budget)
        .with("bytes_on_disk_after", peak_disk)
        .with("batch", BUDGET_BATCH),
    );
    let singles = (reads / 500).clamp(1, 200);
    let t = Instant::now();
    let mut got = Vec::with_capacity(singles);
    for &i in &idx[..singles] {
        // Owned copies: holding the items would pin every regenerated shard.
        got.push(bstore.get(i as i64).map_err(store_err)?.to_owned_item());
    }
    let secs = t.elapsed().as_secs_f64();
    for (k, &i) in idx[..singles].iter().enumerate() {
        check("w3", i, &got[k], seed)?;
    }
    ctx.emit(
        Line::new(
            "w3",
            "read_random_budget_single_replay",
            singles,
            singles as u64 * ITEM_BYTES,
            secs,
        )
        .with("memory_limit", budget),
    );
    drop(bstore);

    // 6. Single gets under the same budget with a seekable source: a miss
    // regenerates its own shard only. Compared with generating, pickling
    // and durably writing one shard by hand.
    let (shard_secs, shard_plain_secs) = shard_generate_write_secs(ctx, seed)?;
    let pulled = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = std::sync::Arc::clone(&pulled);
    let seekable = move |start: u64| {
        let counter = std::sync::Arc::clone(&counter);
        (start..n).map(move |i| {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            record(i, seed)
        })
    };
    let sopts = Options {
        memory_limit: Some(budget),
        max_cache_size: 8,
        ..opts.clone()
    };
    let sstore =
        ShardStore::open_with_seekable_source(&broot, sopts, seekable).map_err(store_err)?;
    let singles = (reads / 50).clamp(1, 2000);
    let t = Instant::now();
    let mut got = Vec::with_capacity(singles);
    for &i in &idx[..singles] {
        got.push(sstore.get(i as i64).map_err(store_err)?.to_owned_item());
    }
    let secs = t.elapsed().as_secs_f64();
    for (k, &i) in idx[..singles].iter().enumerate() {
        check("w3", i, &got[k], seed)?;
    }
    let regenerated = pulled.load(std::sync::atomic::Ordering::Relaxed) as f64 / SHARD_ITEMS as f64;
    // Every get is charged to the misses (hits and disk loads included).
    let miss_secs = secs / regenerated.max(1.0);
    ctx.emit(
        Line::new(
            "w3",
            "read_random_budget_single",
            singles,
            singles as u64 * ITEM_BYTES,
            secs,
        )
        .with("memory_limit", budget)
        .with("shards_regenerated", regenerated)
        .with("miss_s", miss_secs)
        .with("shard_generate_write_s", shard_secs)
        .with(
            "miss_ratio_to_shard_write",
            miss_secs / shard_secs.max(1e-9),
        )
        .with("shard_generate_write_plain_s", shard_plain_secs)
        .with(
            "miss_ratio_to_shard_write_plain",
            miss_secs / shard_plain_secs.max(1e-9),
        ),
    );
    Ok(())
}

/// Seconds to generate one shard of records, pickle it and write it
/// durably, by hand: what one regenerated shard must cost at least. Two
/// figures, each the median of 3: the way the store must write it to stay
/// crash-safe (a temporary name, fsync, rename, directory fsync: a shard
/// is never seen half-written under its name), which is the reference a
/// miss is measured against, and a plain new file with one fsync (no
/// rename, no directory fsync), which a crash can leave torn.
fn shard_generate_write_secs(ctx: &Ctx, seed: u64) -> Result<(f64, f64), RunError> {
    let dir = ctx
        .fresh_dir("w3-shard-write")
        .map_err(|e| RunError::store("w3", e))?;
    let io = |e| RunError::store("w3", e);
    let (mut atomic, mut plain) = (Vec::new(), Vec::new());
    for k in 0..6u64 {
        let renamed = k % 2 == 0;
        let path = dir.join(format!("{k}.shard.pickle"));
        let t = Instant::now();
        let first = k * SHARD_ITEMS;
        let items: Vec<Record> = (first..first + SHARD_ITEMS)
            .map(|i| record(i, seed))
            .collect();
        let bytes =
            format::encode_shard(&path, &items, format::Compression::None).map_err(store_err)?;
        let target = if renamed {
            dir.join(format!("{k}.shard.pickle.tmp"))
        } else {
            path.clone()
        };
        let mut file = std::fs::File::create(&target).map_err(io)?;
        std::io::Write::write_all(&mut file, &bytes).map_err(io)?;
        file.sync_all().map_err(io)?;
        if renamed {
            std::fs::rename(&target, &path).map_err(io)?;
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io)?;
            atomic.push(t.elapsed().as_secs_f64());
        } else {
            plain.push(t.elapsed().as_secs_f64());
        }
    }
    std::fs::remove_dir_all(&dir).map_err(io)?;
    Ok((crate::median(&mut atomic), crate::median(&mut plain)))
}

/// Every shard file of `root`, read into memory (page cache warm).
fn shard_files(root: &Path) -> Result<Vec<(ShardName, Vec<u8>)>, RunError> {
    let dir = root.join(format::SHARDS_DIR);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| RunError::store("w3", e))? {
        let entry = entry.map_err(|e| RunError::store("w3", e))?;
        let Some(name) = entry
            .file_name()
            .to_str()
            .and_then(|s| ShardName::parse(s, format::Compression::None))
        else {
            continue;
        };
        out.push((
            name,
            std::fs::read(entry.path()).map_err(|e| RunError::store("w3", e))?,
        ));
    }
    out.sort_by_key(|(n, _)| n.start);
    Ok(out)
}
