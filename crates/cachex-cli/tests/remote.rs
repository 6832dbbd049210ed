//! `cachex push` and `cachex pull` against the S3 test server that
//! `scripts/test` starts (CACHEX_S3_ENDPOINT), as real processes.

use std::path::Path;
use std::process::{Command, Output};
use tensor_core::Value;

use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

/// The S3 test server, or `None` (said on stderr) outside CI.
fn s3_endpoint() -> Option<String> {
    test_support::s3::endpoint()
}

/// A fresh bucket (the test server takes an unsigned `PUT /<bucket>`).
fn new_bucket(endpoint: &str) -> String {
    test_support::s3::new_bucket(endpoint, "cli")
}

fn cachex(endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachex"))
        .args(args)
        .env("AWS_ENDPOINT", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "cachex-test")
        .env("AWS_SECRET_ACCESS_KEY", "cachex-test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("spawn cachex")
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = cachex(endpoint, args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "cachex {args:?} failed: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn push_then_pull_through_s3_gives_a_sound_cache() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = format!("s3://{}/caches/features", new_bucket(&endpoint));
    let local = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(local.path(), Options::default()).unwrap();
    for batch in 0..4 {
        let items: Vec<(String, Value)> = (0..20)
            .map(|i| {
                let n = batch * 20 + i;
                let t = Tensor::from_vec([4], vec![n as f32; 4]).unwrap();
                (format!("k{n}"), Value::from(t))
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
    drop(store);

    let text = ok(&endpoint, &["push", p(local.path()), &url]);
    assert!(text.contains("as snapshot 1"), "{text}");
    let dest = tempfile::tempdir().unwrap();
    let pulled = dest.path().join("features");
    let text = ok(&endpoint, &["pull", &url, p(&pulled)]);
    assert!(text.contains("pulled snapshot 1"), "{text}");
    let text = ok(&endpoint, &["verify", p(&pulled)]);
    assert!(text.contains("sound"), "{text}");
    let text = ok(&endpoint, &["get", p(&pulled), "k77", "--json"]);
    assert!(text.contains("77"), "{text}");
    // Pulling again finds everything right and writes nothing.
    let text = ok(&endpoint, &["pull", &url, p(&pulled)]);
    assert!(text.contains(", 0 written"), "{text}");

    // Nothing published at another prefix: a problem (exit 1), named.
    let out = cachex(&endpoint, &["pull", &format!("{url}-none"), p(&pulled)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing published"));
    // A URL no store opens: a usage error (exit 2).
    let out = cachex(&endpoint, &["push", p(local.path()), "ftp://host/x"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn inspect_verify_and_get_read_a_cache_at_its_url() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = new_bucket(&endpoint);
    let url = format!("s3://{bucket}/live/features");
    // A writer publishes through remote-cache (a commit log).
    let work = tempfile::tempdir().unwrap();
    let location =
        remote_cache::Location::remote(&url, remote_tier::TierConfig::new(work.path(), 1 << 30))
            .with_options([
                ("aws_endpoint", endpoint.as_str()),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", "cachex-test"),
                ("aws_secret_access_key", "cachex-test"),
                ("aws_region", "us-east-1"),
            ]);
    let store = remote_cache::RemoteSegments::open(&location, Options::default()).unwrap();
    let items: Vec<(String, Value)> = (0..30)
        .map(|n| {
            let t = Tensor::from_vec([4], vec![n as f32; 4]).unwrap();
            (format!("k{n}"), Value::from(t))
        })
        .collect();
    store.put_batch(&items).unwrap();
    assert_eq!(store.publish().unwrap().seq, Some(1));

    let text = ok(&endpoint, &["inspect", &url, "--json"]);
    assert!(text.contains("segment-store"), "{text}");
    let text = ok(&endpoint, &["verify", &url]);
    assert!(text.contains("sound"), "{text}");
    let text = ok(&endpoint, &["get", &url, "k17", "--json"]);
    assert!(text.contains("17"), "{text}");
    let out = cachex(&endpoint, &["get", &url, "nope"]);
    assert_eq!(out.status.code(), Some(1));

    // A push snapshot reads the same way.
    let snap = format!("s3://{bucket}/snap");
    ok(&endpoint, &["push", p(store.store().dir()), &snap]);
    let text = ok(&endpoint, &["get", &snap, "k29", "--json"]);
    assert!(text.contains("29"), "{text}");
    // Nothing published at a URL: a problem, named.
    let out = cachex(&endpoint, &["inspect", &format!("s3://{bucket}/none")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing published"));
}

/// Bytes the files under `dir` whose name ends with `suffix` take on disk
/// (sparse files: only the blocks written).
fn allocated(dir: &Path, suffix: &str) -> (usize, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut found = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if entry.file_name().to_string_lossy().ends_with(suffix) {
                found.0 += 1;
                found.1 += meta.blocks() * 512;
            }
        }
    }
    found
}

#[test]
fn get_of_a_key_at_a_url_fetches_its_row_not_the_segments() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = format!("s3://{}/keyed/features", new_bucket(&endpoint));
    let work = tempfile::tempdir().unwrap();
    let location =
        remote_cache::Location::remote(&url, remote_tier::TierConfig::new(work.path(), 1 << 30))
            .with_options(test_support::s3::options(&endpoint));
    let writer = remote_cache::RemoteSegments::open(
        &location,
        Options {
            flush_every: 1000,
            ..Options::default()
        },
    )
    .unwrap();
    // Three segments of 1,000 f32[512] records: 2 MB each.
    let items: Vec<(String, Value)> = (0..3000)
        .map(|n| {
            let t = Tensor::from_vec([512], vec![n as f32; 512]).unwrap();
            (format!("sample_{n}"), Value::from(t))
        })
        .collect();
    writer.put_batch(&items).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    let tier = tempfile::tempdir().unwrap();
    let get = |key: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cachex"))
            .args(["get", &url, key, "--json"])
            .env("CACHEX_TIER_DIR", tier.path())
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "cachex-test")
            .env("AWS_SECRET_ACCESS_KEY", "cachex-test")
            .env("AWS_REGION", "us-east-1")
            .output()
            .expect("spawn cachex");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "cachex get {key}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let text = get("sample_1234");
    assert!(text.contains("1234"), "{text}");
    // The segments stay sparse in the tier: of 6 MB, the blocks of one
    // row (and of one segment's footer and batch metadata).
    let (files, bytes) = allocated(tier.path(), ".sparse");
    assert_eq!(files, 3, "one sparse copy per segment");
    assert!(
        bytes <= 64 << 10,
        "{bytes} bytes of segments fetched for one key"
    );
    // A second call reads the same working directory and tier.
    let text = get("sample_2999");
    assert!(text.contains("2999"), "{text}");
    let (_, bytes) = allocated(tier.path(), ".sparse");
    assert!(
        bytes <= 2 * (64 << 10),
        "{bytes} bytes of segments for two keys"
    );
}
