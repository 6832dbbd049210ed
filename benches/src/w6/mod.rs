//! W6 of `BENCHMARKS.md`: the W1 and W5 reads against caches published to
//! S3-compatible servers on 127.0.0.1, each started here and stopped after
//! ([`server`]: moto, and `s3s-fs`, whose ranged GETs read only their range
//! from disk, as S3's do; `--server` picks, both by default).
//!
//! Two caches are written locally and published through `remote-cache`:
//! W1's keyed f32\[512\] records (segment-store, N items, default 20,000)
//! and W5's variable-size samples in one page file (N / 4 samples of 1 to
//! 64 KiB). For each server and cache:
//! - `yardstick` / `yardstick_latency`: the server's own delivery of the
//!   cache's bytes ([`yardstick`]: every object, ranged GETs of one tier
//!   block, the best of 4, 16 and 64 in flight), without and with 20 ms
//!   added to every request;
//! - `read_local`: the local cache (the baseline of `fraction_of_local`);
//! - `read_cold`: a fresh local tier — the timed region includes opening;
//! - `read_warm`: the same tier again, everything local;
//! - `read_budget`: a fresh tier whose budget is 25% of the cache
//!   (`fetch_ratio`: bytes fetched over the cache's bytes);
//! - `read_cold_latency`: cold, through a wrapper adding 20 ms to every
//!   request;
//! - W1's `first_batch`: open on a fresh tier and read one batch of 256
//!   keys, beside the goal of 5 round trips plus that batch's bytes at the
//!   yardstick's rate (`goal_s`).
//!
//! W1's read is 200 batches of 256 uniformly random keys (`get_batch` and
//! a pass over every element); W5's reads every sample once in a random
//! order, summing its bytes (`read_budget` in the plan's order, the pages
//! shuffled and then the samples within each page: the tier evicts inside
//! an open file, and a uniform order under a 25% budget would fetch most
//! pages again for each of their samples). Every value is checked after the timed
//! region. Each line's seconds include opening (the local line's too):
//! `fraction_of_local` compares open + read, `reads_fraction_of_local` the
//! reads alone, and `fraction_of_server` is the yardstick's seconds (the
//! latency one for `read_cold_latency`) over the line's. Remote lines carry
//! `server`, `requests` (GET, HEAD, PUT and LIST requests sent),
//! `bytes_fetched` and `tier_bytes` (the local tier's size after).

mod meter;
pub mod server;
mod w1;
pub(crate) mod w5;
pub mod yardstick;

use std::path::{Path, PathBuf};
use std::time::Duration;

use remote_cache::RemoteDir;
use remote_tier::{RemoteTier, TierConfig, build_store};

use crate::{Ctx, Line, RunError};
use meter::Meter;
use server::{Kind, Server};
use yardstick::Yardstick;

const LATENCY: Duration = Duration::from_millis(20);

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store("w6", e)
}

/// One published cache and how to open it through a tier.
struct Published {
    server: &'static str,
    url: String,
    options: Vec<(String, String)>,
    /// Bytes of the cache (what `read_budget`'s 25% is of).
    bytes: u64,
    /// The server's delivery of those bytes, without and with latency.
    yardstick: Yardstick,
    yardstick_latency: Yardstick,
}

/// A remote read's tier: its directory and the metered store.
struct Tier {
    metered: std::sync::Arc<Meter>,
    dir: PathBuf,
}

impl Published {
    /// Publishes nothing: measures the yardsticks of what `url` holds.
    fn measure(
        ctx: &Ctx,
        server: &Server,
        cache: &str,
        url: String,
        bytes: u64,
    ) -> Result<Published, RunError> {
        let block = TierConfig::new(".", 0).block_size;
        let options = server.options();
        let yardstick = yardstick::measure(&url, options.clone(), Duration::ZERO, block)?;
        let yardstick_latency = yardstick::measure(&url, options.clone(), LATENCY, block)?;
        let published = Published {
            server: server.kind.name(),
            url,
            options,
            bytes,
            yardstick,
            yardstick_latency,
        };
        for (phase, y) in [
            ("yardstick", yardstick),
            ("yardstick_latency", yardstick_latency),
        ] {
            ctx.emit(
                Line::new("w6", phase, y.requests as usize, y.bytes, y.secs)
                    .with("cache", cache)
                    .with("server", published.server)
                    .with("concurrency", y.concurrency)
                    .with("requests", y.requests)
                    .with("round_trip_s", y.round_trip)
                    .with("mb_per_s", y.bytes as f64 / y.secs.max(1e-9) / 1e6),
            );
        }
        Ok(published)
    }

    /// A commit log over a metered store with a local tier in `dir`, as
    /// it was left there (nothing applied yet).
    fn open(
        &self,
        dir: &Path,
        budget: u64,
        latency: Duration,
        files: remote_cache::StoreFiles,
    ) -> Result<(RemoteDir, Tier), RunError> {
        let (inner, prefix) = build_store(&self.url, self.options.clone()).map_err(err)?;
        let (store, metered) = Meter::wrap(inner, latency);
        let tier_dir = dir.join("tier");
        let tier =
            RemoteTier::with_store(store, prefix, &self.url, TierConfig::new(&tier_dir, budget))
                .map_err(err)?;
        let remote = RemoteDir::open_unapplied(tier, &dir.join("work"), files).map_err(err)?;
        Ok((
            remote,
            Tier {
                metered,
                dir: tier_dir,
            },
        ))
    }
}

/// Publishes the local directory `dir` to `url` (nothing private, nothing
/// read by blocks: a snapshot of whole files as a commit).
fn publish_dir(
    url: &str,
    options: Vec<(String, String)>,
    dir: &Path,
    scratch: &Path,
) -> Result<(), RunError> {
    let (inner, prefix) = build_store(url, options).map_err(err)?;
    let tier = RemoteTier::with_store(inner, prefix, url, TierConfig::new(scratch, 1 << 30))
        .map_err(err)?;
    let remote = RemoteDir::open(tier, dir, remote_cache::StoreFiles::PLAIN).map_err(err)?;
    remote.publish().map_err(err)?;
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.blocks() * 512).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// One run of a read: its seconds (opening included), its open's, the
/// tier it read through and the directory that holds it.
struct Run {
    secs: f64,
    open: f64,
    tier: Option<Tier>,
    dir: Option<PathBuf>,
}

impl Run {
    /// The run of median seconds of `runs` (the upper one of an even
    /// count); the others go to `rest` (whose directories the caller
    /// removes once every line that reads them is out).
    fn median(mut runs: Vec<Run>, rest: &mut Vec<Run>) -> Result<Run, RunError> {
        runs.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        if runs.is_empty() {
            return Err(err("no run"));
        }
        let mid = runs.swap_remove(runs.len() / 2);
        rest.extend(runs);
        Ok(mid)
    }

    /// Emits the line of the median run of each of `lines` (phase, the
    /// remote runs, the latency they were read through), compared with
    /// the local read `local` (seconds, open) and `published`'s
    /// yardsticks; then removes every run's directory.
    #[allow(clippy::too_many_arguments)]
    fn emit_medians(
        ctx: &Ctx,
        cache: &str,
        items: usize,
        bytes: u64,
        local: (f64, f64),
        published: &Published,
        lines: Vec<(&str, Vec<Run>, Duration)>,
    ) -> Result<(), RunError> {
        let mut done = Vec::new();
        for (phase, runs, latency) in lines {
            if runs.is_empty() {
                continue;
            }
            let run = Run::median(runs, &mut done)?;
            if let Some(tier) = &run.tier {
                let base = Baseline {
                    local: Some(local),
                    remote: Some((published, tier, !latency.is_zero())),
                };
                emit(
                    ctx,
                    cache,
                    phase,
                    items,
                    bytes,
                    run.secs,
                    base,
                    Some(run.open),
                );
            }
            done.push(run);
        }
        done.into_iter().for_each(Run::remove);
        Ok(())
    }

    fn remove(self) {
        if let Some(d) = &self.dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// What one read line is compared with.
struct Baseline<'a> {
    /// The local read's seconds and its open's.
    local: Option<(f64, f64)>,
    /// The cache, its tier, and whether the yardstick to use is the
    /// latency one.
    remote: Option<(&'a Published, &'a Tier, bool)>,
}

/// The line of one read: items/s, and its fractions of the local read and
/// of the server's delivery.
#[allow(clippy::too_many_arguments)]
fn emit(
    ctx: &Ctx,
    cache: &str,
    phase: &str,
    items: usize,
    bytes: u64,
    secs: f64,
    base: Baseline<'_>,
    open_secs: Option<f64>,
) -> f64 {
    let mut line = Line::new("w6", phase, items, bytes, secs).with("cache", cache);
    if let Some(open) = open_secs {
        line = line.with("open_s", open);
    }
    if let Some((local_secs, local_open)) = base.local {
        let open = open_secs.unwrap_or(0.0);
        line = line
            .with("fraction_of_local", local_secs / secs.max(1e-9))
            .with(
                "reads_fraction_of_local",
                (local_secs - local_open) / (secs - open).max(1e-9),
            );
    }
    if let Some((published, tier, latency)) = base.remote {
        let y = if latency {
            published.yardstick_latency
        } else {
            published.yardstick
        };
        let fetched = tier.metered.bytes();
        line = line
            .with("server", published.server)
            .with("fraction_of_server", y.secs / secs.max(1e-9))
            .with("requests", tier.metered.requests())
            .with("bytes_fetched", fetched)
            .with(
                "fetch_ratio",
                fetched as f64 / published.bytes.max(1) as f64,
            )
            .with("tier_bytes", dir_bytes(&tier.dir));
    }
    ctx.emit(line);
    secs
}

/// Runs W6 (see the module docs) on each server of `servers`.
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let servers = Kind::parse_list(ctx.w6_server.as_deref().unwrap_or("both"))?;
    let (w1, w5) = match ctx.w6_cache.as_deref().unwrap_or("both") {
        "w1" => (true, false),
        "w5" => (false, true),
        "both" => (true, true),
        other => return Err(err(format!("unknown W6 cache {other:?} (w1, w5 or both)"))),
    };
    let n = ctx.n_or(20_000);
    for kind in servers {
        let scratch = ctx.fresh_dir(&format!("w6-{}", kind.name())).map_err(err)?;
        let server = Server::start(kind, &scratch)?;
        let bucket = server.run_bucket("w6")?;
        if w1 {
            w1::run(ctx, &server, &bucket, n)?;
        }
        if w5 {
            w5::run(ctx, &server, &bucket, (n / 4).max(1))?;
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(())
}
