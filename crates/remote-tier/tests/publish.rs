//! A segment-store cache published to S3 and read back through a cold
//! local tier (segments materialised locally, then opened as any cache);
//! two publishers at once; a publish that dies before its commit.

mod common;

use std::sync::atomic::Ordering;
use tensor_core::Value;

use common::{faulty_tier, s3_endpoint, s3_store, s3_tier, small_config};
use remote_tier::snapshot::{latest_manifest, pull_dir, push_dir};
use remote_tier::{Error, build_store};
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
    let first = push_dir(&publisher, local.path()).unwrap();
    assert_eq!(first.seq, 1);
    assert_eq!(first.uploaded, first.files);

    // A cold reader: empty local tier, a small budget, a fresh directory.
    let tier_dir = tempfile::tempdir().unwrap();
    let reader = s3_tier(&endpoint, &url, small_config(tier_dir.path(), 256 << 10));
    let dest = tempfile::tempdir().unwrap();
    let pulled = pull_dir(&reader, dest.path()).unwrap().unwrap();
    assert_eq!((pulled.seq, pulled.written), (1, first.files));
    assert_cache(dest.path(), 0..200);

    // More records, published again: only changed files travel; a second
    // pull brings the new ones and keeps what was right.
    write_cache(local.path(), 200..260);
    let second = push_dir(&publisher, local.path()).unwrap();
    assert_eq!(second.seq, 2);
    assert!(second.uploaded < second.files, "{second:?}");
    let pulled = pull_dir(&reader, dest.path()).unwrap().unwrap();
    assert_eq!(pulled.seq, 2);
    assert!(pulled.written < pulled.files, "{pulled:?}");
    assert_cache(dest.path(), 0..260);
}

#[test]
fn two_publishers_at_once_both_land_under_distinct_sequence_numbers() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "c");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_cache(a.path(), 0..50);
    write_cache(b.path(), 1000..1050);
    let t = tempfile::tempdir().unwrap();
    let reports = std::thread::scope(|s| {
        let ha = s.spawn(|| {
            push_dir(
                &s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30)),
                a.path(),
            )
        });
        let hb = s.spawn(|| {
            push_dir(
                &s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30)),
                b.path(),
            )
        });
        [ha.join().unwrap().unwrap(), hb.join().unwrap().unwrap()]
    });
    let mut seqs = [reports[0].seq, reports[1].seq];
    seqs.sort();
    assert_eq!(seqs, [1, 2], "{reports:?}");
    // The later snapshot is whole: the cache of whoever committed second.
    let dest = tempfile::tempdir().unwrap();
    let reader = s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30));
    pull_dir(&reader, dest.path()).unwrap().unwrap();
    if reports[0].seq == 2 {
        assert_cache(dest.path(), 0..50);
    } else {
        assert_cache(dest.path(), 1000..1050);
    }
}

#[test]
fn a_publish_that_dies_before_its_commit_leaves_the_last_snapshot() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (store, prefix, url) = s3_store(&endpoint, "c");
    let local = tempfile::tempdir().unwrap();
    write_cache(local.path(), 0..50);
    let t = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30));
    push_dir(&tier, local.path()).unwrap();

    // The second publish uploads its files, then every commit attempt fails.
    write_cache(local.path(), 50..100);
    let (faulty, faults) = faulty_tier(store, prefix, &url, small_config(t.path(), 1 << 30));
    faults.fail_creates.store(1_000, Ordering::SeqCst);
    let err = push_dir(&faulty, local.path()).unwrap_err();
    assert!(matches!(err, Error::Remote { op: "commit", .. }), "{err}");
    assert_eq!(latest_manifest(&tier).unwrap().unwrap().seq, 1);
    let dest = tempfile::tempdir().unwrap();
    pull_dir(&tier, dest.path()).unwrap().unwrap();
    assert_cache(dest.path(), 0..50);
    let store = SegmentStore::open(dest.path(), Options::default()).unwrap();
    assert_eq!(
        store.len(),
        50,
        "none of the unpublished records is visible"
    );

    // Run again, it resumes: the files are there already, only the commit is new.
    let again = push_dir(&tier, local.path()).unwrap();
    assert_eq!((again.seq, again.uploaded), (2, 0));
    let _ = build_store("memory:///", Vec::<(String, String)>::new()).unwrap();
}

#[test]
fn a_stray_manifest_named_u64_max_breaks_no_pull_and_no_push() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "stray");
    let local = tempfile::tempdir().unwrap();
    write_cache(local.path(), 0..30);
    let t = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(t.path(), 1 << 30));
    assert_eq!(push_dir(&tier, local.path()).unwrap().seq, 1);
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
    let pushed = push_dir(&tier, local.path()).unwrap();
    assert_eq!(pushed.seq, 2, "the number after the last readable one");
    assert_eq!(latest_manifest(&tier).unwrap().unwrap().seq, 2);
    let pulled = pull_dir(&tier, dest.path()).unwrap().unwrap();
    assert_eq!(pulled.seq, 2);
    assert_cache(dest.path(), 0..60);
}
