//! The S3-compatible test server that `scripts/test` starts on loopback
//! (moto, found through `CACHEX_S3_ENDPOINT`): whether it runs, the
//! `object_store` options that point at it, and a fresh bucket per test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The endpoint of the S3 test server, or `None` (said on stderr, so the
/// skip is visible) when none runs outside CI. Under `CI=true` a missing
/// server fails the test.
pub fn endpoint() -> Option<String> {
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

/// The `object_store` options that point at the test server, which takes
/// any credentials (real ones come from the environment, never from here).
pub fn options(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("aws_endpoint", endpoint.to_string()),
        ("aws_allow_http", "true".into()),
        ("aws_access_key_id", "cachex-test".into()),
        ("aws_secret_access_key", "cachex-test".into()),
        ("aws_region", "us-east-1".into()),
    ]
}

static BUCKETS: AtomicUsize = AtomicUsize::new(0);

/// Creates a bucket no other test (in this or another process) uses and
/// returns its name, `cachex-<tag>-<pid>-<n>-<nanos>`. The test server
/// accepts unsigned requests, so a bare `PUT /<bucket>` does.
pub fn new_bucket(endpoint: &str, tag: &str) -> String {
    let n = BUCKETS.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let bucket = format!("cachex-{tag}-{}-{n}-{nanos}", std::process::id());
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
    bucket
}
