//! A config whose root is an S3 URL, for every backend: built or written
//! by one process (its own local tier), read by another with an empty one.

use cache_facade::{BackendKind, CacheConfig, RemoteConfig, Source, open, open_with_source};
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
fn config(endpoint: &str, kind: BackendKind, bucket: &str, tier: &std::path::Path) -> CacheConfig {
    let options = [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("aws_region", "us-east-1"),
        ("aws_access_key_id", "cachex-test"),
        ("aws_secret_access_key", "cachex-test"),
    ];
    let config = CacheConfig::new(kind, format!("s3://{bucket}/caches"), "toy");
    let config = match kind {
        BackendKind::SegmentStore => config,
        _ => config.option("dataset", "toy"),
    };
    config.remote(RemoteConfig {
        tier_dir: Some(tier.to_path_buf()),
        tier_budget: Some(1 << 30),
        options: options
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
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

#[test]
fn segment_store_with_a_url_root_publishes_on_flush() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = new_bucket(&endpoint, "seg");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = open(&config(
        &endpoint,
        BackendKind::SegmentStore,
        &bucket,
        a.path(),
    ))
    .unwrap();
    writer
        .put_batch((0..30).map(|i| (format!("k{i}"), row(i))).collect())
        .unwrap();
    writer.flush().unwrap();
    let reader = open(&config(
        &endpoint,
        BackendKind::SegmentStore,
        &bucket,
        b.path(),
    ))
    .unwrap();
    assert_eq!(reader.len().unwrap(), 30);
    let (values, missing) = reader.get_batch(&["k3", "k29", "nope"]).unwrap();
    assert_eq!(missing, vec![2]);
    assert_eq!(values[0].as_ref().unwrap(), &row(3));
    assert_eq!(values[1].as_ref().unwrap(), &row(29));
}

#[test]
fn built_backends_with_a_url_root_are_built_once_and_read_elsewhere() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    for kind in [
        BackendKind::MemmapArray,
        BackendKind::PageAlloc,
        BackendKind::ShardStore,
    ] {
        let bucket = new_bucket(&endpoint, kind.name());
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let built_config = config(&endpoint, kind, &bucket, a.path());
        let source = match kind {
            BackendKind::MemmapArray => Source::keyed(
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
