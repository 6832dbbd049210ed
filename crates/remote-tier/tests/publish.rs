//! A segment-store cache pushed to S3 in the older snapshot layout
//! (`manifests/`, written here as an older `cachex push` wrote it) reads
//! back through a cold local tier (segments materialised locally, then
//! opened as any cache); a stray manifest breaks no pull. Publishing
//! itself is remote-cache's commit log now (its tests: push, migrate).

mod common;

use tensor_core::Value;

use common::{s3_endpoint, s3_store, s3_tier, small_config, write_snapshot};
use remote_tier::legacy_manifest::{latest_manifest, pull_dir};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

fn record(i: usize) -> Value {
    let values: Vec<f32> = (0..64).map(|j| (i * 64 + j) as f32).collect();
    Value::from(Tensor::from_vec([8, 8], values).unwrap())
}

/// Writes records `range` into the segment store at `dir`, one segment per
/// 25 records.
fn write_cache(dir: &std::path::Path, range: std::ops::Range<usize>) {
    let store = SegmentStore::open(dir, Options::default()).unwrap();
    let keys: Vec<String> = range.clone().map(|i| format!("sample_{i}")).collect();
    for chunk in keys.chunks(25) {
        let items: Vec<(&str, Value)> = chunk
            .iter()
            .map(|k| (k.as_str(), record(k["sample_".len()..].parse().unwrap())))
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
}

/// Every record of `range` reads back right from the cache at `dir`.
fn assert_cache(dir: &std::path::Path, range: std::ops::Range<usize>) {
    let store = SegmentStore::open(dir, Options::default()).unwrap();
    let keys: Vec<String> = range.clone().map(|i| format!("sample_{i}")).collect();
    let (records, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in range.zip(records) {
        assert!(r.as_ref() == Some(&record(i)), "sample_{i}");
    }
}

#[test]
fn a_segment_store_cache_published_to_s3_reads_back_through_a_cold_tier() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "caches/segments");
    let local = tempfile::tempdir().unwrap();
    write_cache(local.path(), 0..200);
    let up = tempfile::tempdir().unwrap();
    let publisher = s3_tier(&endpoint, &url, small_config(up.path(), 1 << 30));
    let first = write_snapshot(&publisher, local.path(), 1).unwrap();

    // A cold reader: empty local tier, a small budget, a fresh directory.
    let tier_dir = tempfile::tempdir().unwrap();
    let reader = s3_tier(&endpoint, &url, small_config(tier_dir.path(), 256 << 10));
    let dest = tempfile::tempdir().unwrap();
    let pulled = pull_dir(&reader, dest.path()).unwrap().unwrap();
    assert_eq!((pulled.seq, pulled.written), (1, first.files.len() as u64));
    assert_cache(dest.path(), 0..200);

    // More records, published again: only changed files travel; a second
    // pull brings the new ones and keeps what was right.
    write_cache(local.path(), 200..260);
    write_snapshot(&publisher, local.path(), 2).unwrap();
    let pulled = pull_dir(&reader, dest.path()).unwrap().unwrap();
    assert_eq!(pulled.seq, 2);
    assert!(pulled.written < pulled.files, "{pulled:?}");
    assert_cache(dest.path(), 0..260);
}

#[test]
fn a_stray_manifest_named_u64_max_breaks_no_pull() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "stray");
    let local = tempfile::tempdir().unwrap();
    write_cache(local.path(), 0..30);
    let t = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30));
    write_snapshot(&tier, local.path(), 1).unwrap();
    // Junk under the highest well-formed name, and names that are not
    // manifest names at all (too many digits, too few).
    tier.put_bytes("manifests/18446744073709551615.json", "not a manifest")
        .unwrap();
    tier.put_bytes("manifests/99999999999999999999.json", "junk")
        .unwrap();
    tier.put_bytes("manifests/3.json", "junk").unwrap();

    let dest = tempfile::tempdir().unwrap();
    let pulled = pull_dir(&tier, dest.path()).unwrap().unwrap();
    assert_eq!(pulled.seq, 1, "the last readable snapshot");
    assert_cache(dest.path(), 0..30);

    write_cache(local.path(), 30..60);
    write_snapshot(&tier, local.path(), 2).unwrap();
    assert_eq!(latest_manifest(&tier).unwrap().unwrap().seq, 2);
    let pulled = pull_dir(&tier, dest.path()).unwrap().unwrap();
    assert_eq!(pulled.seq, 2);
    assert_cache(dest.path(), 0..60);
}
