//! W6 over W5's cache: variable-size samples in one page file, read by
//! blocks.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use remote_cache::PagesAt;

use super::server::Server;
use super::{Baseline, LATENCY, Published, Run, emit, err, publish_dir};
use crate::{Ctx, RunError, progress};

const PAGE_FILE: &str = "data.pages";

/// W5's sample `i` of seed `seed`: 1 to 64 KiB, each byte a function of
/// `i` and its place.
pub(crate) fn sample_bytes(seed: u64, i: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = rng.random_range(1024..=65_536);
    (0..len)
        .map(|k| (i as u64 * 31 + k as u64 * 7) as u8)
        .collect()
}

/// What a sample's read is checked against: the sum of its bytes.
pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().map(|&b| u64::from(b)).sum()
}

/// Writes W5's page file locally and publishes it; the read URL, the
/// local directory, the file's bytes and each sample's checksum.
fn write(
    ctx: &Ctx,
    server: &Server,
    bucket: &str,
    n: usize,
) -> Result<(String, PathBuf, u64, Vec<u64>), RunError> {
    let (read_url, url, options) = server.urls(bucket, "w5");
    let dir = ctx.fresh_dir("w6-w5-local").map_err(err)?;
    let schema = Schema::new().bytes("blob");
    let mut writer =
        PageWriter::create(dir.join(PAGE_FILE), schema, WriterOptions::default()).map_err(err)?;
    let mut sums = Vec::with_capacity(n);
    for i in 0..n {
        let b = sample_bytes(ctx.seed, i);
        sums.push(checksum(&b));
        writer.append(&[Value::Bytes(&b)]).map_err(err)?;
    }
    writer.finalize().map_err(err)?;
    let t = ctx.fresh_dir("w6-w5-pubtier").map_err(err)?;
    publish_dir(&url, options, &dir, &t)?;
    server.settle(bucket, "w5")?;
    let _ = std::fs::remove_dir_all(&t);
    let bytes = std::fs::metadata(dir.join(PAGE_FILE)).map_err(err)?.len();
    Ok((read_url, dir, bytes, sums))
}

/// How a read orders the samples.
#[derive(Clone, Copy)]
enum Order {
    /// Every sample once, uniformly shuffled.
    Shuffled,
    /// `cachex.sampling`'s epoch order: the pages shuffled, then the
    /// samples within each page, so each page is read once (what a
    /// budget smaller than the file needs once the tier evicts inside an
    /// open file).
    ByPage,
}

/// The samples of `reader` in `how`'s order for `seed`.
fn order(reader: &PageReader, seed: u64, how: Order) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x55);
    match how {
        Order::Shuffled => {
            let mut order: Vec<usize> = (0..reader.len()).collect();
            order.shuffle(&mut rng);
            order
        }
        Order::ByPage => {
            let runs = reader.run_spans();
            let mut pages: Vec<std::ops::Range<usize>> = runs
                .iter()
                .enumerate()
                .map(|(k, r)| {
                    let end = runs
                        .get(k + 1)
                        .map_or(reader.len() as u64, |n| n.first_sample);
                    r.first_sample as usize..end as usize
                })
                .collect();
            pages.shuffle(&mut rng);
            let mut order = Vec::with_capacity(reader.len());
            for page in pages {
                let mut within: Vec<usize> = page.collect();
                within.shuffle(&mut rng);
                order.extend(within);
            }
            order
        }
    }
}

/// Every sample once in `order`, summing its bytes (through `ensure`
/// first when remote); returns seconds, then checks every sum.
fn read(
    order: &[usize],
    reader: &PageReader,
    remote: Option<&PagesAt>,
    sums: &[u64],
    open_secs: f64,
) -> Result<f64, RunError> {
    let mut got = vec![0u64; sums.len()];
    let start = Instant::now();
    // The epoch's order is known before its first read: a remote reader
    // warms the tier in that order, many blocks in flight, while the
    // reads below take each sample as soon as its block is local.
    let _warming = remote.map(|r| r.prefetch(order));
    for &i in order {
        if let Some(r) = remote {
            r.ensure_samples(&[i]).map_err(err)?;
        }
        let s = reader.sample(i).map_err(err)?;
        got[i] = checksum(s.bytes(0).map_err(err)?);
    }
    let secs = start.elapsed().as_secs_f64() + open_secs;
    if let Some(i) = (0..sums.len()).find(|&i| got[i] != sums[i]) {
        return Err(RunError::WrongValue {
            workload: "w6",
            detail: format!("w5 sample {i}: checksum {} != {}", got[i], sums[i]),
        });
    }
    Ok(secs)
}

/// W6 over W5's cache on `server` (see the module docs).
pub(super) fn run(ctx: &Ctx, server: &Server, bucket: &str, n: usize) -> Result<(), RunError> {
    progress!("w6: writing and publishing W5's {n} samples");
    let (url, local_dir, bytes, sums) = write(ctx, server, bucket, n)?;
    let published = Published::measure(ctx, server, "w5", url, bytes)?;
    // Each line is the run of median seconds of `--reps`.
    let reps = ctx.w6_reps;
    let mut locals = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        let local = PageReader::open(local_dir.join(PAGE_FILE)).map_err(err)?;
        let open = start.elapsed().as_secs_f64();
        let secs = read(
            &order(&local, ctx.seed, Order::Shuffled),
            &local,
            None,
            &sums,
            open,
        )?;
        locals.push(Run {
            secs,
            open,
            tier: None,
            dir: None,
        });
    }
    let local = Run::median(locals, &mut Vec::new())?;
    let (local_secs, local_open) = (local.secs, local.open);
    let none = Baseline {
        local: None,
        remote: None,
    };
    emit(
        ctx,
        "w5",
        "read_local",
        n,
        bytes,
        local_secs,
        none,
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
                .fresh_dir(&format!("w6-w5-{phase}-{rep}"))
                .map_err(err)?;
            let passes = if phase == "read_cold" { 2 } else { 1 };
            for pass in 0..passes {
                let start = Instant::now();
                let (remote, tier) = published.open(
                    &dir,
                    budget,
                    latency,
                    remote_cache::StoreFiles::for_kind(remote_cache::StoreKind::PageAlloc),
                )?;
                remote.refresh().map_err(err)?;
                let pages = PagesAt::with_remote(remote, PAGE_FILE).map_err(err)?;
                let open = start.elapsed().as_secs_f64();
                let how = match phase {
                    "read_budget" => Order::ByPage,
                    _ => Order::Shuffled,
                };
                let order = order(pages.reader(), ctx.seed, how);
                let secs = read(&order, pages.reader(), Some(&pages), &sums, open)?;
                let run = Run {
                    secs,
                    open,
                    tier: Some(tier),
                    dir: (pass == 0).then(|| dir.clone()),
                };
                match pass {
                    0 => colds.push(run),
                    _ => warms.push(run),
                }
            }
        }
        Run::emit_medians(
            ctx,
            "w5",
            n,
            bytes,
            (local_secs, local_open),
            &published,
            vec![
                (phase, colds, latency),
                ("read_warm", warms, Duration::ZERO),
            ],
        )?;
    }
    let _ = std::fs::remove_dir_all(&local_dir);
    Ok(())
}
