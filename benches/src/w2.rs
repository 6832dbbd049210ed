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
//!
//! With `--writers K` (K > 1) a `multi_writer` line follows: K writer
//! processes (this binary, re-run as children) each flush `FLUSHES` x 1,000
//! samples into one multi-writer cache at once, against one single-writer
//! process doing the same alone, in the same run (`aggregate_ratio`: the
//! K writers' aggregate samples/s over the one writer's; each writer's
//! `p99_flush_ms`); `open_ratio` opens the largest S spread over K
//! writers' logs against the single-writer cache of the same S; and
//! `refresh_ms` is a reader's refresh after one writer flushed 1,000 more.

use std::time::Instant;
use tensor_core::Value;

use segment_store::{Options, SegmentStore};
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
fn items(seed: u64, range: std::ops::Range<usize>) -> Result<Vec<(String, Value)>, RunError> {
    range
        .map(|k| {
            Tensor::from_vec([DIM], value(seed, k))
                .map(|t| (format!("s{k}"), Value::from(t)))
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
    if ctx.writers > 1 {
        multi_writer(ctx, &dir, filled)?;
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

/// Flushes of 1,000 samples each writer process does in `multi_writer`.
const FLUSHES: usize = 40;
/// Environment variable that turns the workload binary into one writer
/// child of `multi_writer`: `<writer id or "single">:<dir>:<go file>`.
pub const CHILD_ENV: &str = "CACHEX_W2_WRITER";

/// In a child (when [`CHILD_ENV`] is set): waits for the go file, does
/// `FLUSHES` (40) timed flushes and prints one JSON line with its start and
/// end (Unix ns) and each flush's latency (ms). `None` in the parent.
pub fn child_from_env() -> Option<Result<(), RunError>> {
    let spec = std::env::var(CHILD_ENV).ok()?;
    Some(child(&spec))
}

fn child(spec: &str) -> Result<(), RunError> {
    let mut parts = spec.splitn(3, ':');
    let (Some(who), Some(dir), Some(go)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(err(format!("bad {CHILD_ENV} {spec:?}")));
    };
    let writer_id = match who {
        "single" => None,
        w => Some(w.parse::<u32>().map_err(err)?),
    };
    let store = SegmentStore::open(
        dir,
        Options {
            lru_bytes: 0,
            writer_id,
            ..Options::default()
        },
    )
    .map_err(err)?;
    let base = writer_id.map_or(0, |w| w as usize) * 100_000_000;
    let batches: Vec<Vec<(String, Value)>> = (0..FLUSHES)
        .map(|f| items(0, base + f * NEW..base + (f + 1) * NEW))
        .collect::<Result<_, _>>()?;
    while !std::path::Path::new(go).exists() {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    let start = now_ns();
    let mut lat = Vec::with_capacity(FLUSHES);
    for b in &batches {
        let t = Instant::now();
        store.put_batch(b).map_err(err)?;
        store.flush().map_err(err)?;
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let end = now_ns();
    println!(
        "{}",
        serde_json::json!({"start": start, "end": end, "lat_ms": lat})
    );
    Ok(())
}

/// What one writer child reported.
struct ChildRun {
    start: u64,
    end: u64,
    lat_ms: Vec<f64>,
}

/// Runs one writer child per entry of `who` at once; returns their reports.
fn run_children(dir: &std::path::Path, who: &[String]) -> Result<Vec<ChildRun>, RunError> {
    let exe = std::env::current_exe().map_err(err)?;
    let go = dir.with_extension("go");
    let _ = std::fs::remove_file(&go);
    let mut kids = Vec::new();
    for w in who {
        let spec = format!("{w}:{}:{}", dir.display(), go.display());
        let kid = std::process::Command::new(&exe)
            .arg("w2")
            .env(CHILD_ENV, spec)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(err)?;
        kids.push(kid);
    }
    // Let every child open its store and build its batches first.
    std::thread::sleep(std::time::Duration::from_millis(500));
    std::fs::write(&go, b"").map_err(err)?;
    let mut out = Vec::new();
    for kid in kids {
        let o = kid.wait_with_output().map_err(err)?;
        if !o.status.success() {
            return Err(err(format!("writer child failed: {}", o.status)));
        }
        let text = String::from_utf8_lossy(&o.stdout);
        let v: serde_json::Value = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| err(format!("writer child printed no report: {text}")))?;
        let lat_ms = v["lat_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default();
        out.push(ChildRun {
            start: v["start"].as_u64().unwrap_or(0),
            end: v["end"].as_u64().unwrap_or(0),
            lat_ms,
        });
    }
    let _ = std::fs::remove_file(&go);
    Ok(out)
}

/// Samples per second of runs that went on at once: all their samples over
/// the span from the first start to the last end.
fn aggregate_rate(runs: &[ChildRun]) -> f64 {
    let start = runs.iter().map(|r| r.start).min().unwrap_or(0);
    let end = runs.iter().map(|r| r.end).max().unwrap_or(0);
    let samples = (runs.len() * FLUSHES * NEW) as f64;
    samples / ((end.saturating_sub(start)) as f64 / 1e9).max(1e-9)
}

fn p99(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    s.get((s.len() * 99).div_ceil(100).saturating_sub(1))
        .copied()
        .unwrap_or(0.0)
}

/// Median ms to open each of `dirs` read-only until the first `get_batch`
/// returned, the directories taking turns in every repetition (so that
/// both see the same page cache and the same disk).
fn open_ms(dirs: &[&std::path::Path]) -> Result<Vec<f64>, RunError> {
    let mut ms = vec![Vec::new(); dirs.len()];
    for _ in 0..REPS {
        for (dir, ms) in dirs.iter().zip(&mut ms) {
            let t = Instant::now();
            let store = SegmentStore::open(
                dir,
                Options {
                    read_only: true,
                    lru_bytes: 0,
                    ..Options::default()
                },
            )
            .map_err(err)?;
            let (_, _) = store.get_batch(&["s0"]).map_err(err)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(ms.iter_mut().map(|m| median(m)).collect())
}

/// The `multi_writer` line; `single_dir` is W2's single-writer cache of
/// `filled` samples.
fn multi_writer(ctx: &Ctx, single_dir: &std::path::Path, filled: usize) -> Result<(), RunError> {
    let k = ctx.writers;
    progress!("w2: {k} writer processes against one");
    let one_dir = ctx.fresh_dir("w2_one").map_err(err)?;
    quiesce();
    let one = run_children(&one_dir, &["single".to_owned()])?;
    let many_dir = ctx.fresh_dir("w2_many").map_err(err)?;
    quiesce();
    let who: Vec<String> = (0..k).map(|w| w.to_string()).collect();
    let many = run_children(&many_dir, &who)?;
    let one_rate = aggregate_rate(&one);
    let many_rate = aggregate_rate(&many);
    let reader = SegmentStore::open(
        &many_dir,
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .map_err(err)?;
    if reader.len() != k * FLUSHES * NEW {
        return Err(RunError::WrongValue {
            workload: "w2",
            detail: format!(
                "{} keys after {k} writers, expected {}",
                reader.len(),
                k * FLUSHES * NEW
            ),
        });
    }
    drop(reader);
    std::fs::remove_dir_all(&one_dir).map_err(err)?;
    std::fs::remove_dir_all(&many_dir).map_err(err)?;

    // Open at S = max spread over k writers' logs, against the
    // single-writer cache of W2 (`filled` ~ max samples).
    // As many samples as the single-writer cache holds.
    let max = filled;
    progress!("w2: filling {max} samples over {k} writers");
    let spread = ctx.fresh_dir("w2_spread").map_err(err)?;
    let writers: Vec<SegmentStore> = (0..k as u32)
        .map(|w| {
            SegmentStore::open(
                &spread,
                Options {
                    lru_bytes: 0,
                    writer_id: Some(w),
                    ..Options::default()
                },
            )
            .map_err(err)
        })
        .collect::<Result<_, _>>()?;
    // Interleaved, as writers of one job fill a cache.
    let mut from = 0;
    while from < max {
        for w in &writers {
            let to = (from + 10_000).min(max);
            put_range(w, ctx.seed, from..to)?;
            from = to;
        }
    }
    for w in &writers {
        w.flush().map_err(err)?;
    }
    quiesce();
    let opens = open_ms(&[single_dir, &spread])?;
    let (single_open, multi_open) = (opens[0], opens[1]);

    // Refresh of a reader after one writer's flush of 1,000 samples.
    let reader = SegmentStore::open(
        &spread,
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .map_err(err)?;
    let mut refresh = Vec::new();
    let mut next = max;
    for _ in 0..REPS {
        put_range(&writers[1 % k], ctx.seed, next..next + NEW)?;
        writers[1 % k].flush().map_err(err)?;
        next += NEW;
        let t = Instant::now();
        reader.refresh().map_err(err)?;
        refresh.push(t.elapsed().as_secs_f64() * 1e3);
        check(&reader, ctx.seed, next - 1)?;
    }
    check(&reader, ctx.seed, 0)?;
    check(&reader, ctx.seed, max / 2)?;
    drop((reader, writers));
    std::fs::remove_dir_all(&spread).map_err(err)?;

    let mut line = Line::new(
        "w2",
        "multi_writer",
        k * FLUSHES * NEW,
        (k * FLUSHES * NEW * DIM * 4) as u64,
        (k * FLUSHES * NEW) as f64 / many_rate.max(1e-9),
    )
    .with("writers", k)
    .with("s", filled)
    .with("aggregate_ratio", many_rate / one_rate.max(1e-9))
    .with("one_writer_items_per_s", one_rate)
    .with("aggregate_items_per_s", many_rate)
    .with("p99_flush_ms_one_writer", p99(&one[0].lat_ms))
    .with(
        "p99_flush_ms",
        serde_json::Value::from(many.iter().map(|r| p99(&r.lat_ms)).collect::<Vec<_>>()),
    )
    .with("open_ms_single", single_open)
    .with("open_ms_multi", multi_open)
    .with("open_ratio", multi_open / single_open.max(1e-9))
    .with("refresh_ms", median(&mut refresh));
    line = line.with("open_keys", max);
    ctx.emit(line);
    Ok(())
}
