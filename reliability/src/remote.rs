//! The remote path's shared pieces: a remote segment cache on the S3 test
//! server (moto, `CACHEX_S3_ENDPOINT`), the deterministic batches the
//! writers publish, and the check that a cache holds whole commits with
//! exact values.
//!
//! One batch is one publish (one commit): batch `b` of a stream is the
//! keys `b{b}_r{j}` with values derived from the stream's seed, so a
//! reader can tell a committed batch, a torn one and a wrong value apart.

use std::path::Path;
use std::time::Duration;
use tensor_core::Value;

use remote_cache::{Location, SegmentsAt};
use remote_tier::TierConfig;
use segment_store::Options;
use tensor_core::Tensor;

/// Records per batch.
pub const ROWS: usize = 4;

/// The timeout of one request attempt in the harness's tiers: short, so
/// that a held request costs little, long enough for a loaded machine
/// (a spurious timeout is retried, or is a typed error: both allowed).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Attempts per repeatable request in the harness's tiers.
pub const ATTEMPTS: u32 = 3;

/// The S3 test server, or `None` outside CI when none runs (under
/// `CI=true` a missing server fails the test).
pub fn endpoint() -> Option<String> {
    test_support::s3::endpoint()
}

/// A fresh bucket on the server; returns `s3://<bucket>`.
pub fn new_bucket(endpoint: &str, tag: &str) -> String {
    format!("s3://{}", test_support::s3::new_bucket(endpoint, tag))
}

/// The harness's local tier in `dir`: small blocks, short timeouts.
pub fn tier_config(dir: &Path) -> TierConfig {
    let mut config = TierConfig::new(dir, 1 << 30);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 0;
    config.parallelism = 2;
    config.retry.attempts = ATTEMPTS;
    config.retry.backoff = Duration::from_millis(5);
    config.retry.request_timeout = REQUEST_TIMEOUT;
    config
}

/// The cache `url` reached through `endpoint` (the server, or a proxy in
/// front of it), with its local tier — and so its working directory —
/// under `tier_dir`.
pub fn location(endpoint: &str, url: &str, tier_dir: &Path) -> Location {
    Location::remote(url, tier_config(tier_dir)).with_options(test_support::s3::options(endpoint))
}

/// Options of the one writer of a stream.
pub fn writer_options() -> Options {
    Options {
        writer_id: Some(0),
        lru_bytes: 0,
        ..Options::default()
    }
}

/// Options of a reader.
pub fn reader_options() -> Options {
    Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    }
}

/// Key of row `j` of batch `b`.
pub fn key(b: usize, j: usize) -> String {
    format!("b{b:04}_r{j}")
}

/// Value of row `j` of batch `b` of stream `seed`.
pub fn value(seed: u64, b: usize, j: usize) -> Vec<f32> {
    let base = (seed % 1000) as f32 * 1e4 + (b * 10 + j) as f32;
    (0..8).map(|k| base + k as f32 * 0.25).collect()
}

/// Batch `b` of stream `seed`.
pub fn batch(seed: u64, b: usize) -> Vec<(String, Value)> {
    (0..ROWS)
        .map(|j| {
            let t = Tensor::from_vec([8], value(seed, b, j)).expect("an 8-value tensor");
            (key(b, j), Value::from(t))
        })
        .collect()
}

/// Writes batch `b` and publishes it; returns the commit's number.
pub fn publish_batch(store: &SegmentsAt, seed: u64, b: usize) -> remote_cache::Result<Option<u64>> {
    store.put_batch(&batch(seed, b))?;
    Ok(store.publish()?.seq)
}

/// How many leading batches `store` holds: every batch below it whole with
/// exact values, none at or above it (up to `max_batches`), and nothing
/// else. The error says what is wrong (lost, torn, wrong or extra data).
pub fn whole_batches(store: &SegmentsAt, seed: u64, max_batches: usize) -> Result<usize, String> {
    let mut present_batches = 0;
    let mut ended = false;
    let mut rows = 0;
    for b in 0..max_batches {
        let keys: Vec<String> = (0..ROWS).map(|j| key(b, j)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (values, missing) = store
            .get_batch(&refs)
            .map_err(|e| format!("get_batch of batch {b}: {e}"))?;
        let present = ROWS - missing.len();
        if present != 0 && present != ROWS {
            return Err(format!("batch {b} is torn: {present} of {ROWS} rows"));
        }
        if present == ROWS && ended {
            return Err(format!("batch {b} is there, an earlier one is not"));
        }
        if present == 0 {
            ended = true;
            continue;
        }
        present_batches += 1;
        rows += present;
        for (j, v) in values.iter().enumerate() {
            let got = v
                .as_ref()
                .and_then(Value::as_tensor)
                .ok_or_else(|| format!("batch {b} row {j}: not a tensor"))?
                .to_tensor();
            let got = got
                .as_slice::<f32>()
                .map_err(|e| format!("batch {b} row {j}: {e}"))?;
            if got != &value(seed, b, j)[..] {
                return Err(format!("batch {b} row {j}: wrong value {got:?}"));
            }
        }
    }
    if store.len() != rows {
        return Err(format!(
            "{} keys where the batches hold {rows}: keys never written appeared",
            store.len()
        ));
    }
    Ok(present_batches)
}

/// The commit number and whole batches a cold reader (a fresh local tier
/// in `tier_dir`, straight to the server) sees at `url`.
pub fn cold_read(
    endpoint: &str,
    url: &str,
    tier_dir: &Path,
    seed: u64,
    max_batches: usize,
) -> Result<(u64, usize), String> {
    let reader = SegmentsAt::open(&location(endpoint, url, tier_dir), reader_options())
        .map_err(|e| format!("a cold reader cannot open {url}: {e}"))?;
    let seq = reader.remote().map_or(0, |r| r.seq());
    Ok((seq, whole_batches(&reader, seed, max_batches)?))
}
