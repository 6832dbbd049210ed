//! W6 over W1's cache: keyed f32[512] records in a segment store.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use tensor_core::Value;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use remote_cache::{RemoteDir, SegmentsAt};
use remote_tier::{RemoteTier, TierConfig, build_store};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

use super::server::Server;
use super::{Baseline, LATENCY, Published, Run, dir_bytes, emit, err};
use crate::{Ctx, RunError, progress};

const DIM: usize = 512;
const BATCH: usize = 256;
const READ_BATCHES: usize = 200;

fn features(seed: u64, i: usize) -> Vec<f32> {
    let base = ((i as u64 + seed) % 65_536) as f32 * 0.25;
    (0..DIM).map(|j| base + j as f32).collect()
}

/// Writes W1's records locally, publishing them as the store's commits;
/// the cache's read URL, its local directory and its bytes.
fn write(
    ctx: &Ctx,
    server: &Server,
    bucket: &str,
    n: usize,
) -> Result<(String, PathBuf, u64), RunError> {
    let (read_url, url, options) = server.urls(bucket, "w1");
    let dir = ctx.fresh_dir("w6-w1-local").map_err(err)?;
    let t = ctx.fresh_dir("w6-w1-pubtier").map_err(err)?;
    let (inner, prefix) = build_store(&url, options).map_err(err)?;
    let tier =
        RemoteTier::with_store(inner, prefix, &url, TierConfig::new(&t, 1 << 30)).map_err(err)?;
    let remote = RemoteDir::open(tier, &dir, segment_files()).map_err(err)?;
    let store = SegmentsAt::with_remote(remote, Options::default()).map_err(err)?;
    let keys: Vec<String> = (0..n).map(|i| format!("sample_{i}")).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let items: Vec<(&str, Value)> = chunk
            .iter()
            .map(|&i| {
                let t = Tensor::from_vec([DIM], features(ctx.seed, i)).map_err(err)?;
                Ok((keys[i].as_str(), Value::from(t)))
            })
            .collect::<Result<_, RunError>>()?;
        store.put_batch(&items).map_err(err)?;
    }
    store.publish().map_err(err)?;
    drop(store);
    server.settle(bucket, "w1")?;
    let _ = std::fs::remove_dir_all(&t);
    let bytes = dir_bytes(&dir);
    Ok((read_url, dir, bytes))
}

/// The read's batches of keys: 200 of 256 uniformly random ones.
fn batches(ctx: &Ctx, n: usize) -> Vec<Vec<usize>> {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x57);
    (0..READ_BATCHES)
        .map(|_| (0..BATCH).map(|_| rng.random_range(0..n)).collect())
        .collect()
}

fn names(batch: &[usize]) -> Vec<String> {
    batch.iter().map(|i| format!("sample_{i}")).collect()
}

/// Checks every value of `batch` as read from `store`.
fn check(ctx: &Ctx, store: &SegmentStore, batch: &[usize]) -> Result<(), RunError> {
    let (records, missing) = store.get_batch(&names(batch)).map_err(err)?;
    if !missing.is_empty() {
        return Err(RunError::WrongValue {
            workload: "w6",
            detail: format!("{} keys missing", missing.len()),
        });
    }
    for (&i, r) in batch.iter().zip(&records) {
        let got = r
            .as_ref()
            .and_then(|r| r.as_tensor())
            .and_then(|t| t.view().as_slice::<f32>().ok().map(|s| s.to_vec()));
        if got.as_deref() != Some(&features(ctx.seed, i)[..]) {
            return Err(RunError::WrongValue {
                workload: "w6",
                detail: format!("sample_{i}"),
            });
        }
    }
    Ok(())
}

/// 200 batches of 256 random keys: `get_batch`, a pass over every element;
/// returns seconds, then checks every value.
fn read(ctx: &Ctx, store: &SegmentsAt, n: usize, open_secs: f64) -> Result<f64, RunError> {
    let batches = batches(ctx, n);
    let names: Vec<Vec<String>> = batches.iter().map(|b| names(b)).collect();
    let mut sink = 0f32;
    let start = Instant::now();
    // The epoch's keys are known before its first read: a remote store
    // fetches the segments that hold them, whole, in the order they are
    // needed, while the reads go on (a read of a segment on its way waits
    // for it).
    let order: Vec<&String> = names.iter().flatten().collect();
    let _warming = store.prefetch(&order);
    for keys in &names {
        let (records, _) = store.get_batch(keys).map_err(err)?;
        for r in records.iter().flatten() {
            if let Some(t) = r.as_tensor() {
                sink += t
                    .view()
                    .as_slice::<f32>()
                    .map(|xs| xs.iter().sum::<f32>())
                    .unwrap_or(0.0);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64() + open_secs;
    std::hint::black_box(sink);
    for b in batches.iter().take(8) {
        check(ctx, store, b)?;
    }
    Ok(secs)
}

/// How W1's files travel: segments read by blocks (in the store's small
/// blocks, fetched by byte ranges or whole), the index copied whole.
fn segment_files() -> remote_cache::StoreFiles {
    remote_cache::StoreFiles::for_kind(remote_cache::StoreKind::SegmentStore)
}

fn read_only() -> Options {
    Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    }
}

/// W6 over W1's cache on `server` (see the module docs).
pub(super) fn run(ctx: &Ctx, server: &Server, bucket: &str, n: usize) -> Result<(), RunError> {
    progress!("w6: writing and publishing W1's {n} records");
    let (url, local_dir, cache_bytes) = write(ctx, server, bucket, n)?;
    let published = Published::measure(ctx, server, "w1", url, cache_bytes)?;
    let items = READ_BATCHES * BATCH;
    let batch_bytes = (items * DIM * 4) as u64;
    // Every line times opening and reading, the local one too; each is
    // the run of median seconds of `--reps`.
    let reps = ctx.w6_reps;
    let mut locals = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        let local = SegmentsAt::open(
            &remote_cache::Location::Local(local_dir.clone()),
            read_only(),
        )
        .map_err(err)?;
        let open = start.elapsed().as_secs_f64();
        let secs = read(ctx, &local, n, open)?;
        locals.push(Run {
            secs,
            open,
            tier: None,
            dir: None,
        });
    }
    let local = Run::median(locals, &mut Vec::new())?;
    let (local_secs, local_open) = (local.secs, local.open);
    emit(
        ctx,
        "w1",
        "read_local",
        items,
        batch_bytes,
        local_secs,
        Baseline {
            local: None,
            remote: None,
        },
        Some(local_open),
    );

    for (phase, budget, latency) in [
        ("read_cold", 1u64 << 40, Duration::ZERO),
        ("read_budget", published.bytes / 4, Duration::ZERO),
        ("read_cold_latency", 1 << 40, LATENCY),
    ] {
        let (mut colds, mut warms) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let dir = ctx
                .fresh_dir(&format!("w6-w1-{phase}-{rep}"))
                .map_err(err)?;
            let start = Instant::now();
            let (remote, tier) = published.open(&dir, budget, latency, segment_files())?;
            let store = SegmentsAt::with_unapplied(remote, read_only()).map_err(err)?;
            let open = start.elapsed().as_secs_f64();
            let secs = read(ctx, &store, n, open)?;
            drop(store);
            if phase == "read_cold" {
                // The same working directory and tier again: everything local.
                let start = Instant::now();
                let (remote, warm_tier) = published.open(&dir, budget, latency, segment_files())?;
                let store = SegmentsAt::with_unapplied(remote, read_only()).map_err(err)?;
                let open = start.elapsed().as_secs_f64();
                let secs = read(ctx, &store, n, open)?;
                warms.push(Run {
                    secs,
                    open,
                    tier: Some(warm_tier),
                    dir: None,
                });
            }
            colds.push(Run {
                secs,
                open,
                tier: Some(tier),
                dir: Some(dir),
            });
        }
        Run::emit_medians(
            ctx,
            "w1",
            items,
            batch_bytes,
            (local_secs, local_open),
            &published,
            vec![
                (phase, colds, latency),
                ("read_warm", warms, Duration::ZERO),
            ],
        )?;
    }
    first_batch(ctx, &published, n)?;
    let _ = std::fs::remove_dir_all(&local_dir);
    Ok(())
}

/// Open on a fresh tier and read the first batch: seconds, beside the goal
/// of 5 round trips plus the batch's bytes at the yardstick's rate.
fn first_batch(ctx: &Ctx, published: &Published, n: usize) -> Result<(), RunError> {
    let batch = batches(ctx, n).swap_remove(0);
    let keys = names(&batch);
    let mut runs = Vec::new();
    for rep in 0..ctx.w6_reps {
        let dir = ctx
            .fresh_dir(&format!("w6-w1-first-batch-{rep}"))
            .map_err(err)?;
        let start = Instant::now();
        let (remote, tier) = published.open(&dir, 1 << 40, Duration::ZERO, segment_files())?;
        let store = SegmentsAt::with_unapplied(remote, read_only()).map_err(err)?;
        let (records, _) = store.get_batch(&keys).map_err(err)?;
        let secs = start.elapsed().as_secs_f64();
        // What the batch cost, before the check reads it again.
        let cost = (tier.metered.requests(), tier.metered.bytes());
        drop(records);
        check(ctx, &store, &batch)?;
        drop(store);
        runs.push((
            cost,
            Run {
                secs,
                open: 0.0,
                tier: Some(tier),
                dir: Some(dir),
            },
        ));
    }
    let mut costs: Vec<(f64, (u64, u64))> = runs.iter().map(|(c, r)| (r.secs, *c)).collect();
    costs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (requests, fetched) = costs[costs.len() / 2].1;
    let runs: Vec<Run> = runs.into_iter().map(|(_, r)| r).collect();
    let mut rest = Vec::new();
    let run = Run::median(runs, &mut rest)?;
    let secs = run.secs;
    let bytes = (BATCH * DIM * 4) as u64;
    let y = published.yardstick;
    let rate = y.bytes as f64 / y.secs.max(1e-9);
    let goal = 5.0 * y.round_trip + bytes as f64 / rate;
    let line = crate::Line::new("w6", "first_batch", BATCH, bytes, secs)
        .with("cache", "w1")
        .with("first_batch_s", secs)
        .with("round_trip_s", y.round_trip)
        .with("goal_s", goal)
        .with("within_goal", secs <= goal);
    ctx.emit(
        line.with("server", published.server)
            .with("requests", requests)
            .with("bytes_fetched", fetched),
    );
    run.remove();
    rest.into_iter().for_each(Run::remove);
    Ok(())
}
