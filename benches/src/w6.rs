//! W6 of `BENCHMARKS.md`: the W1 and W5 reads against caches published to
//! an S3-compatible server on 127.0.0.1 (`CACHEX_S3_ENDPOINT`, or a moto
//! server this workload starts from the test venv and stops after).
//!
//! Two caches are written locally and published through `remote-cache`:
//! W1's keyed f32\[512\] records (segment-store, N items, default 20,000)
//! and W5's variable-size samples in one page file (N / 4 samples of 1 to
//! 64 KiB). For each, the same read runs five ways:
//! - `read_local`: the local cache (the baseline of `fraction_of_local`);
//! - `read_cold`: a fresh local tier — the timed region includes opening,
//!   which for segment-store materialises every segment, and for the page
//!   file fetches each 8 MiB block on first use (the next ones prefetched);
//! - `read_warm`: the same tier again, everything local;
//! - `read_budget`: a fresh tier whose budget is 25% of the cache;
//! - `read_cold_latency`: cold, through a wrapper store adding 20 ms to
//!   every request.
//!
//! W1's read is 200 batches of 256 uniformly random keys (`get_batch` and
//! a pass over every element); W5's reads every sample once in a random
//! order, summing its bytes. Every value is checked after the timed
//! region. Each line's seconds include opening (the local line's too):
//! `fraction_of_local` compares open + read, `reads_fraction_of_local`
//! the reads alone (so a warm open's one freshness GET shows apart). Remote lines carry `requests` (GET and HEAD requests sent),
//! `bytes_fetched` and `tier_bytes` (the local tier's size after).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResult, ListResult, ObjectStore, PutOptions, PutPayload, PutResult,
};
use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use remote_cache::{RemoteDir, RemotePages, RemoteSegments};
use remote_tier::{RemoteTier, TierConfig, build_store};
use segment_store::{Options, Record, SegmentStore};
use tensor_core::Tensor;
use test_support::intercept::{Intercept, Intercepted};

use crate::{Ctx, Line, RunError, progress};

const DIM: usize = 512;
const BATCH: usize = 256;
const READ_BATCHES: usize = 200;
const PAGE_FILE: &str = "data.pages";
const LATENCY: Duration = Duration::from_millis(20);

fn err(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> RunError {
    RunError::store("w6", e)
}

/// The S3 server: the caller's, or a moto server started here (stopped
/// on drop).
struct Server {
    endpoint: String,
    child: Option<Child>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `CACHEX_VENV`, else `target/py-venv` of the workspace (as scripts/test).
fn venv() -> PathBuf {
    if let Some(v) = std::env::var_os("CACHEX_VENV") {
        return PathBuf::from(v);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
        .join("target")
        .join("py-venv")
}

fn server() -> Result<Server, RunError> {
    if let Ok(endpoint) = std::env::var("CACHEX_S3_ENDPOINT") {
        return Ok(Server {
            endpoint,
            child: None,
        });
    }
    let moto = venv().join("bin").join("moto_server");
    if !moto.is_file() {
        return Err(err(format!(
            "no CACHEX_S3_ENDPOINT and no {} (run scripts/test once, or set CACHEX_VENV)",
            moto.display()
        )));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(err)?
        .port();
    let child = Command::new(&moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(err)?;
    let server = Server {
        endpoint: format!("http://127.0.0.1:{port}"),
        child: Some(child),
    };
    for _ in 0..300 {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            progress!("w6: moto S3 server at {}", server.endpoint);
            return Ok(server);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(err("the moto S3 server did not start"))
}

fn s3_options(endpoint: &str) -> Vec<(String, String)> {
    [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "cachex-bench"),
        ("aws_secret_access_key", "cachex-bench"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Creates a bucket (the test server takes an unsigned `PUT /<bucket>`).
fn new_bucket(endpoint: &str, name: &str) -> Result<(), RunError> {
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = TcpStream::connect(host).map_err(err)?;
    write!(
        conn,
        "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(err)?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).map_err(err)?;
    if !answer.starts_with("HTTP/1.1 200") {
        return Err(err(format!("create bucket {name}: {answer}")));
    }
    Ok(())
}

/// Counts requests and bytes, and adds a fixed latency to each request
/// (but a streamed LIST, which is only counted).
#[derive(Debug)]
struct Meter {
    latency: Duration,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Meter {
    async fn wait(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

#[async_trait]
impl Intercept for Meter {
    fn name(&self) -> &'static str {
        "Metered"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.wait().await;
        inner.put_opts(location, payload, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.wait().await;
        let head = options.head;
        let got = inner.get_opts(location, options).await?;
        if !head {
            self.bytes
                .fetch_add(got.range.end - got.range.start, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn list(&self, _prefix: Option<&ObjectPath>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.wait().await;
        inner.list_with_delimiter(prefix).await
    }
}

/// One published cache and how to open it through a tier.
struct Published {
    url: String,
    endpoint: String,
    /// Bytes of the cache (what `read_budget`'s 25% is of).
    bytes: u64,
}

/// A remote read's tier: its directory, the metered store, the commit log.
struct Tier {
    metered: Arc<Meter>,
    dir: PathBuf,
}

impl Published {
    /// A commit log over a metered store with a local tier in `dir`, as
    /// it was left there (nothing applied yet).
    fn open(
        &self,
        dir: &Path,
        budget: u64,
        latency: Duration,
        by_blocks: remote_cache::journal::ReadByBlocks,
    ) -> Result<(RemoteDir, Tier), RunError> {
        let (inner, prefix) = build_store(&self.url, s3_options(&self.endpoint)).map_err(err)?;
        let metered = Arc::new(Meter {
            latency,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        let store: Arc<dyn ObjectStore> = Arc::new(Intercepted::new(inner, Arc::clone(&metered)));
        let tier_dir = dir.join("tier");
        let tier =
            RemoteTier::with_store(store, prefix, &self.url, TierConfig::new(&tier_dir, budget))
                .map_err(err)?;
        let remote = RemoteDir::open_unapplied(tier, &dir.join("work"), by_blocks, |_| false)
            .map_err(err)?;
        Ok((
            remote,
            Tier {
                metered,
                dir: tier_dir,
            },
        ))
    }
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

/// The line of one read: items/s, and its fraction of the local read.
#[allow(clippy::too_many_arguments)]
fn emit(
    ctx: &Ctx,
    cache: &str,
    phase: &str,
    items: usize,
    bytes: u64,
    secs: f64,
    local: Option<(f64, f64)>,
    tier: Option<&Tier>,
    open_secs: Option<f64>,
) -> f64 {
    let mut line = Line::new("w6", phase, items, bytes, secs).with("cache", cache);
    if let Some(open) = open_secs {
        line = line.with("open_s", open);
    }
    if let Some((local_secs, local_open)) = local {
        let open = open_secs.unwrap_or(0.0);
        line = line
            .with("fraction_of_local", local_secs / secs.max(1e-9))
            .with(
                "reads_fraction_of_local",
                (local_secs - local_open) / (secs - open).max(1e-9),
            );
    }
    if let Some(t) = tier {
        line = line
            .with("requests", t.metered.requests.load(Ordering::Relaxed))
            .with("bytes_fetched", t.metered.bytes.load(Ordering::Relaxed))
            .with("tier_bytes", dir_bytes(&t.dir));
    }
    ctx.emit(line);
    secs
}

// ---- W1: keyed records (segment-store) ----

fn features(seed: u64, i: usize) -> Vec<f32> {
    let base = ((i as u64 + seed) % 65_536) as f32 * 0.25;
    (0..DIM).map(|j| base + j as f32).collect()
}

fn w1_write(
    ctx: &Ctx,
    endpoint: &str,
    bucket: &str,
    n: usize,
) -> Result<(Published, PathBuf), RunError> {
    let url = format!("s3://{bucket}/w1");
    let dir = ctx.fresh_dir("w6-w1-local").map_err(err)?;
    let t = ctx.fresh_dir("w6-w1-pubtier").map_err(err)?;
    let (inner, prefix) = build_store(&url, s3_options(endpoint)).map_err(err)?;
    let tier =
        RemoteTier::with_store(inner, prefix, &url, TierConfig::new(&t, 1 << 30)).map_err(err)?;
    let remote = RemoteDir::open(tier, &dir, |_, _| false, |_| false).map_err(err)?;
    let store = RemoteSegments::with_remote(remote, Options::default()).map_err(err)?;
    let keys: Vec<String> = (0..n).map(|i| format!("sample_{i}")).collect();
    for chunk in (0..n).collect::<Vec<_>>().chunks(BATCH) {
        let items: Vec<(&str, Record)> = chunk
            .iter()
            .map(|&i| {
                let t = Tensor::from_vec([DIM], features(ctx.seed, i)).map_err(err)?;
                Ok((keys[i].as_str(), Record::from(t)))
            })
            .collect::<Result<_, RunError>>()?;
        store.put_batch(&items).map_err(err)?;
    }
    store.publish().map_err(err)?;
    drop(store);
    let _ = std::fs::remove_dir_all(&t);
    Ok((
        Published {
            url,
            endpoint: endpoint.to_string(),
            bytes: dir_bytes(&dir),
        },
        dir,
    ))
}

/// 200 batches of 256 random keys: `get_batch`, a pass over every element;
/// returns seconds, then checks every value.
fn w1_read(ctx: &Ctx, store: &SegmentStore, n: usize, open_secs: f64) -> Result<f64, RunError> {
    let mut rng = StdRng::seed_from_u64(ctx.seed ^ 0x57);
    let batches: Vec<Vec<usize>> = (0..READ_BATCHES)
        .map(|_| (0..BATCH).map(|_| rng.random_range(0..n)).collect())
        .collect();
    let names: Vec<Vec<String>> = batches
        .iter()
        .map(|b| b.iter().map(|i| format!("sample_{i}")).collect())
        .collect();
    let mut sink = 0f32;
    let start = Instant::now();
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
    for (b, keys) in batches.iter().zip(&names).take(8) {
        let (records, missing) = store.get_batch(keys).map_err(err)?;
        if !missing.is_empty() {
            return Err(RunError::WrongValue {
                workload: "w6",
                detail: format!("{} keys missing", missing.len()),
            });
        }
        for (&i, r) in b.iter().zip(&records) {
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
    }
    Ok(secs)
}

fn w1(ctx: &Ctx, endpoint: &str, bucket: &str, n: usize) -> Result<(), RunError> {
    progress!("w6: writing and publishing W1's {n} records");
    let (published, local_dir) = w1_write(ctx, endpoint, bucket, n)?;
    let items = READ_BATCHES * BATCH;
    let batch_bytes = (items * DIM * 4) as u64;
    let read_only = || Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    // Every line times opening and reading, the local one too.
    let start = Instant::now();
    let local = SegmentStore::open(&local_dir, read_only()).map_err(err)?;
    let local_open = start.elapsed().as_secs_f64();
    let local_secs = w1_read(ctx, &local, n, local_open)?;
    drop(local);
    emit(
        ctx,
        "w1",
        "read_local",
        items,
        batch_bytes,
        local_secs,
        None,
        None,
        Some(local_open),
    );

    let never = |_: &str, _: u64| false;
    for (phase, budget, latency) in [
        ("read_cold", 1u64 << 40, Duration::ZERO),
        ("read_budget", published.bytes / 4, Duration::ZERO),
        ("read_cold_latency", 1 << 40, LATENCY),
    ] {
        let dir = ctx.fresh_dir(&format!("w6-w1-{phase}")).map_err(err)?;
        let start = Instant::now();
        let (remote, tier) = published.open(&dir, budget, latency, never)?;
        let store = RemoteSegments::with_unapplied(remote, read_only()).map_err(err)?;
        let open_secs = start.elapsed().as_secs_f64();
        let secs = w1_read(ctx, &store, n, open_secs)?;
        emit(
            ctx,
            "w1",
            phase,
            items,
            batch_bytes,
            secs,
            Some((local_secs, local_open)),
            Some(&tier),
            Some(open_secs),
        );
        drop(store);
        if phase == "read_cold" {
            // The same working directory and tier again: everything local.
            let start = Instant::now();
            let (remote, tier) = published.open(&dir, budget, latency, never)?;
            let store = RemoteSegments::with_unapplied(remote, read_only()).map_err(err)?;
            let open_secs = start.elapsed().as_secs_f64();
            let secs = w1_read(ctx, &store, n, open_secs)?;
            emit(
                ctx,
                "w1",
                "read_warm",
                items,
                batch_bytes,
                secs,
                Some((local_secs, local_open)),
                Some(&tier),
                Some(open_secs),
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&local_dir);
    Ok(())
}

// ---- W5: variable-size samples (page-alloc) ----

fn sample_bytes(seed: u64, i: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let len = rng.random_range(1024..=65_536);
    (0..len)
        .map(|k| (i as u64 * 31 + k as u64 * 7) as u8)
        .collect()
}

fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().map(|&b| u64::from(b)).sum()
}

fn w5_write(
    ctx: &Ctx,
    endpoint: &str,
    bucket: &str,
    n: usize,
) -> Result<(Published, PathBuf, Vec<u64>), RunError> {
    let url = format!("s3://{bucket}/w5");
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
    let (inner, prefix) = build_store(&url, s3_options(endpoint)).map_err(err)?;
    let tier =
        RemoteTier::with_store(inner, prefix, &url, TierConfig::new(&t, 1 << 30)).map_err(err)?;
    let remote = RemoteDir::open(tier, &dir, |_, _| false, |_| false).map_err(err)?;
    remote.publish().map_err(err)?;
    drop(remote);
    let _ = std::fs::remove_dir_all(&t);
    let bytes = std::fs::metadata(dir.join(PAGE_FILE)).map_err(err)?.len();
    Ok((
        Published {
            url,
            endpoint: endpoint.to_string(),
            bytes,
        },
        dir,
        sums,
    ))
}

/// Every sample once in a random order, summing its bytes (through
/// `ensure` first when remote); returns seconds, then checks every sum.
fn w5_read(
    ctx: &Ctx,
    reader: &PageReader,
    remote: Option<&RemotePages>,
    sums: &[u64],
    open_secs: f64,
) -> Result<f64, RunError> {
    let mut order: Vec<usize> = (0..sums.len()).collect();
    order.shuffle(&mut StdRng::seed_from_u64(ctx.seed ^ 0x55));
    let mut got = vec![0u64; sums.len()];
    let start = Instant::now();
    for &i in &order {
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

fn w5(ctx: &Ctx, endpoint: &str, bucket: &str, n: usize) -> Result<(), RunError> {
    progress!("w6: writing and publishing W5's {n} samples");
    let (published, local_dir, sums) = w5_write(ctx, endpoint, bucket, n)?;
    let bytes = published.bytes;
    let start = Instant::now();
    let local = PageReader::open(local_dir.join(PAGE_FILE)).map_err(err)?;
    let local_open = start.elapsed().as_secs_f64();
    let local_secs = w5_read(ctx, &local, None, &sums, local_open)?;
    drop(local);
    emit(
        ctx,
        "w5",
        "read_local",
        n,
        bytes,
        local_secs,
        None,
        None,
        Some(local_open),
    );
    for (phase, budget, latency) in [
        ("read_cold", 1u64 << 40, Duration::ZERO),
        ("read_budget", published.bytes / 4, Duration::ZERO),
        ("read_cold_latency", 1 << 40, LATENCY),
    ] {
        let dir = ctx.fresh_dir(&format!("w6-w5-{phase}")).map_err(err)?;
        let runs = if phase == "read_cold" { 2 } else { 1 };
        for run in 0..runs {
            let start = Instant::now();
            let (remote, tier) = published.open(&dir, budget, latency, RemotePages::BY_BLOCKS)?;
            remote.refresh().map_err(err)?;
            let pages = RemotePages::with_remote(remote, PAGE_FILE).map_err(err)?;
            let open_secs = start.elapsed().as_secs_f64();
            let secs = w5_read(ctx, pages.reader(), Some(&pages), &sums, open_secs)?;
            let name = if run == 0 { phase } else { "read_warm" };
            emit(
                ctx,
                "w5",
                name,
                n,
                bytes,
                secs,
                Some((local_secs, local_open)),
                Some(&tier),
                Some(open_secs),
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&local_dir);
    Ok(())
}

/// Runs W6 (see the module docs).
pub fn run(ctx: &Ctx) -> Result<(), RunError> {
    let server = server()?;
    let n = ctx.n_or(20_000);
    let bucket = format!(
        "cachex-w6-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
    );
    new_bucket(&server.endpoint, &bucket)?;
    w1(ctx, &server.endpoint, &bucket, n)?;
    w5(ctx, &server.endpoint, &bucket, (n / 4).max(1))?;
    drop(server);
    Ok(())
}
