//! A config whose root is an S3 URL, for every backend: built or written
//! by one process (its own local tier), read by another with an empty one.

use cache_facade::{CacheConfig, Source, StoreKind, TierOptions, open, open_with_source};
use tensor_core::{Tensor, Value};

/// The S3 endpoint `scripts/test` starts, or `None` (said) outside CI.
fn s3_endpoint() -> Option<String> {
    test_support::s3::endpoint()
}

/// A fresh bucket on the test server (it accepts unsigned requests).
fn new_bucket(endpoint: &str, tag: &str) -> String {
    test_support::s3::new_bucket(endpoint, &format!("facade-{tag}"))
}

/// A config on `s3://<bucket>/caches` with its own local tier. The test
/// server takes any credentials; real ones come from the environment.
fn config(endpoint: &str, kind: StoreKind, bucket: &str, tier: &std::path::Path) -> CacheConfig {
    let options = [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "cachex-test"),
        ("aws_secret_access_key", "cachex-test"),
    ];
    let config = CacheConfig::new(kind, format!("s3://{bucket}/caches"), "toy");
    let config = match kind {
        StoreKind::SegmentStore => config,
        _ => config.option("dataset", "toy"),
    };
    config.remote(TierOptions {
        tier_dir: Some(tier.to_path_buf()),
        tier_budget: Some(1 << 30),
        storage_options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        single_publisher: false,
    })
}

fn row(i: u32) -> Value {
    Value::dict([
        (
            "label",
            Value::from(Tensor::from_vec([1], vec![i as i64 % 3]).unwrap()),
        ),
        (
            "x",
            Value::from(Tensor::from_vec([3], vec![i as f32, 1.0, -(i as f32)]).unwrap()),
        ),
    ])
}

/// A segment store at a fresh bucket's URL: 30 records put by a writer
/// on one tier, which `finish` ends (a flush, a drop), then a reader on
/// another tier (returned with its directory).
fn segments_written_then_read(
    endpoint: &str,
    tag: &str,
    finish: impl FnOnce(Box<dyn cache_facade::CacheBackend>),
) -> (Box<dyn cache_facade::CacheBackend>, tempfile::TempDir) {
    let bucket = new_bucket(endpoint, tag);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = open(&config(
        endpoint,
        StoreKind::SegmentStore,
        &bucket,
        a.path(),
    ))
    .unwrap();
    writer
        .put_batch((0..30).map(|i| (format!("k{i}"), row(i))).collect())
        .unwrap();
    finish(writer);
    let reader = open(&config(
        endpoint,
        StoreKind::SegmentStore,
        &bucket,
        b.path(),
    ))
    .unwrap();
    (reader, b)
}

#[test]
fn segment_store_with_a_url_root_publishes_on_flush() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (reader, _tier) =
        segments_written_then_read(&endpoint, "seg", |writer| writer.flush().unwrap());
    assert_eq!(reader.len().unwrap(), 30);
    let (values, missing) = reader.get_batch(&["k3", "k29", "nope"]).unwrap();
    assert_eq!(missing, vec![2]);
    assert_eq!(values[0].as_ref().unwrap(), &row(3));
    assert_eq!(values[1].as_ref().unwrap(), &row(29));
}

#[test]
fn a_segment_store_with_a_url_root_dropped_without_flush_publishes() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (reader, _tier) = segments_written_then_read(&endpoint, "dropped", drop);
    assert_eq!(reader.len().unwrap(), 30);
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (values, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    assert_eq!(values[7].as_ref().unwrap(), &row(7));
}

#[test]
fn built_backends_with_a_url_root_are_built_once_and_read_elsewhere() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    for kind in [
        StoreKind::MemmapArray,
        StoreKind::PageAlloc,
        StoreKind::ShardStore,
    ] {
        let bucket = new_bucket(&endpoint, kind.name());
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let built_config = config(&endpoint, kind, &bucket, a.path());
        let source = match kind {
            StoreKind::MemmapArray => Source::keyed(
                (0..40).map(|i| format!("s{i}")).collect::<Vec<_>>(),
                |id: &str| -> Result<Value, std::num::ParseIntError> { Ok(row(id[1..].parse()?)) },
            ),
            _ => Source::items(|| (0..40).map(row)),
        };
        let built = open_with_source(&built_config, source).unwrap();
        assert_eq!(built.len().unwrap(), 40, "{}", kind.name());
        // Shard-store generates on demand: what was generated is published
        // on flush.
        built.flush().unwrap();
        drop(built);

        let reader = open(&config(&endpoint, kind, &bucket, b.path())).unwrap();
        assert_eq!(reader.len().unwrap(), 40, "{}", kind.name());
        let got = reader.get_indices(&[0, 17, -1]).unwrap();
        assert_eq!(got, vec![row(0), row(17), row(39)], "{}", kind.name());
    }
}

const HOLDER_ENV: &str = "CACHE_FACADE_REMOTE_HOLDER";

/// The other process of the test below (does nothing unless spawned by
/// it): opens the cache through the facade, says so, and keeps it open
/// until its stdin closes.
#[test]
fn holder_process_child() {
    let Some(fields) = test_support::s3::child_fields(HOLDER_ENV) else {
        return;
    };
    let (endpoint, bucket, tier) = (&*fields[0], &*fields[1], &*fields[2]);
    let config = config(
        endpoint,
        StoreKind::SegmentStore,
        bucket,
        std::path::Path::new(tier),
    );
    let cache = open(&config).unwrap();
    println!("opened {}", cache.len().unwrap());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest).unwrap();
    let (values, missing) = cache.get_batch(&["k1"]).unwrap();
    assert!(missing.is_empty() && values[0].as_ref() == Some(&row(1)));
}

#[test]
fn two_processes_open_one_url_on_one_tier_at_once() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = new_bucket(&endpoint, "two");
    let (a, shared) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = open(&config(
        &endpoint,
        StoreKind::SegmentStore,
        &bucket,
        a.path(),
    ))
    .unwrap();
    writer
        .put_batch((0..10).map(|i| (format!("k{i}"), row(i))).collect())
        .unwrap();
    writer.flush().unwrap();

    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "holder_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            HOLDER_ENV,
            test_support::s3::child_env(&endpoint, &bucket, shared.path(), &[]),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // The harness prints the test's name on the same line, before it.
    let mut line = String::new();
    while !line.contains("opened ") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "the other process ended before it opened the cache");
    }
    assert!(line.trim_end().ends_with("opened 10"), "{line}");

    // This process, same URL, same tier, while the other holds it open.
    let here = open(&config(
        &endpoint,
        StoreKind::SegmentStore,
        &bucket,
        shared.path(),
    ))
    .unwrap();
    assert_eq!(here.len().unwrap(), 10);
    let (values, missing) = here.get_batch(&["k3", "k9"]).unwrap();
    assert!(missing.is_empty());
    assert_eq!(values[0].as_ref().unwrap(), &row(3));
    assert_eq!(values[1].as_ref().unwrap(), &row(9));

    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(status.success(), "the other process failed: {status}");
    // One tier for both: the working directories sit side by side in it.
    let work: Vec<_> = std::fs::read_dir(shared.path().join("work"))
        .unwrap()
        .collect();
    assert_eq!(work.len(), 2, "{work:?}");
}
