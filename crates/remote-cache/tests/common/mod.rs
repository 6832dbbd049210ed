//! Shared by the remote-cache integration tests: the S3 test server that
//! `scripts/test` starts (found through `CACHEX_S3_ENDPOINT`), a fresh
//! bucket per test, and locations on it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use remote_cache::Location;
use remote_tier::TierConfig;

/// The S3 endpoint of the test server, or `None` (after saying so) when
/// none runs outside CI. Under `CI=true` a missing server fails the test.
pub fn s3_endpoint() -> Option<String> {
    if let Ok(e) = std::env::var("CACHEX_S3_ENDPOINT") {
        return Some(e);
    }
    let msg = "CACHEX_S3_ENDPOINT not set: run scripts/test, which starts the S3 test server";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("skipping S3 test: {msg}");
    None
}

/// The store options that point `object_store` at the test server.
pub fn s3_options(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("aws_endpoint", endpoint.to_string()),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "cachex-test".into()),
        ("aws_secret_access_key", "cachex-test".into()),
        ("aws_region", "us-east-1".into()),
    ]
}

static BUCKETS: AtomicUsize = AtomicUsize::new(0);

/// Creates a bucket no other test uses; returns `s3://<bucket>/<prefix>`.
/// The test server accepts unsigned requests, so a bare `PUT /<bucket>` does.
pub fn new_bucket_url(endpoint: &str, prefix: &str) -> String {
    let n = BUCKETS.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let bucket = format!("cachex-rc-{}-{n}-{nanos}", std::process::id());
    let host = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = TcpStream::connect(host).expect("connect to the S3 test server");
    write!(
        conn,
        "PUT /{bucket} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send create-bucket");
    let mut answer = String::new();
    conn.read_to_string(&mut answer)
        .expect("read create-bucket answer");
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "create bucket {bucket}: {answer}"
    );
    format!("s3://{bucket}/{prefix}")
}

/// Small blocks so that tests cover many of them without much data.
pub fn small_tier(dir: &Path, budget: u64) -> TierConfig {
    let mut config = TierConfig::new(dir, budget);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 1;
    config.parallelism = 4;
    config.retry.backoff = Duration::from_millis(5);
    config
}

/// The S3 location `url` with a local tier in `tier_dir` (and the working
/// directory inside it).
pub fn s3_location(endpoint: &str, url: &str, tier_dir: &Path) -> Location {
    Location::remote(url, small_tier(tier_dir, 1 << 30)).with_options(s3_options(endpoint))
}
