//! Removals in commits: a compaction's old segments are published as
//! removed and leave every reader's working directory on refresh, values
//! still right; a store's local evictions (shard-store's disk budget) are
//! never published; a removal of a file a writer changed and did not
//! publish is a conflict, not lost work.

mod common;

use std::path::Path;

use common::{keyed, new_bucket_url, s3_endpoint, s3_location, s3_options, small_tier};
use remote_cache::{Error, RemoteDir, SegmentsAt, StoreFiles, StoreKind};
use remote_tier::RemoteTier;
use segment_store::Options;
use tensor_core::{Tensor, Value};

fn record(i: usize, round: usize) -> Value {
    let values: Vec<f32> = (0..64).map(|j| (i * 64 + j + round) as f32).collect();
    Value::from(Tensor::from_vec([8, 8], values).unwrap())
}

fn segments_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("segments"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn assert_values(store: &SegmentsAt, n: usize, round: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let (got, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in got.iter().enumerate() {
        assert!(r.as_ref() == Some(&record(i, round)), "k{i}");
    }
}

#[test]
fn a_compaction_published_removes_the_old_segments_from_readers() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "compacted");
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = SegmentsAt::open(
        &s3_location(&endpoint, &url, w.path()),
        Options {
            flush_every: 20,
            ..Options::default()
        },
    )
    .unwrap();
    // Every key written three times: two of every three rows are dead.
    for round in 0..3 {
        writer
            .put_batch(&keyed("k", 0..60, |i| record(i, round)))
            .unwrap();
        writer.publish().unwrap();
    }
    let reader = SegmentsAt::open(
        &s3_location(&endpoint, &url, r.path()),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let reader_dir = reader.remote().unwrap().dir().to_path_buf();
    let before = segments_in(&reader_dir);
    assert_eq!(before, segments_in(writer.remote().unwrap().dir()));
    assert_values(&reader, 60, 2);

    let report = writer.compact().unwrap();
    assert!(report.segments_after < report.segments_before, "{report:?}");
    let published = writer.publish().unwrap();
    let writer_dir = writer.remote().unwrap().dir().to_path_buf();
    let after = segments_in(&writer_dir);
    assert!(
        before.iter().all(|s| !after.contains(s)),
        "{before:?} {after:?}"
    );
    assert_eq!(published.removed, before.len() as u64, "{published:?}");

    let (refreshed, _) = reader.refresh().unwrap();
    assert_eq!(refreshed.removed, before.len() as u64, "{refreshed:?}");
    assert_eq!(segments_in(&reader_dir), after);
    assert_values(&reader, 60, 2);

    // A cold reader sees the compacted cache only.
    let cold = tempfile::tempdir().unwrap();
    let fresh = SegmentsAt::open(
        &s3_location(&endpoint, &url, cold.path()),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(segments_in(fresh.remote().unwrap().dir()), after);
    assert_values(&fresh, 60, 2);
    drop(reader);

    // The working directory records the removals: opened again, it is
    // where the refresh left it.
    let again = SegmentsAt::open(
        &s3_location(&endpoint, &url, r.path()),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(segments_in(again.remote().unwrap().dir()), after);
    assert_values(&again, 60, 2);
}

fn open_dir(endpoint: &str, url: &str, tier: &Path, work: &Path, kind: StoreKind) -> RemoteDir {
    let tier = RemoteTier::open_with_options(url, s3_options(endpoint), small_tier(tier, 1 << 30))
        .unwrap();
    RemoteDir::open(tier, work, StoreFiles::for_kind(kind)).unwrap()
}

#[test]
fn local_evictions_are_never_published_and_meant_removals_are() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "evicted");
    let (t, w) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = open_dir(&endpoint, &url, t.path(), w.path(), StoreKind::ShardStore);
    let shard = "shards/0.10.shard.pickle";
    std::fs::create_dir_all(w.path().join("shards")).unwrap();
    std::fs::write(w.path().join(shard), b"ten items").unwrap();
    std::fs::write(w.path().join("metadata.json"), b"{}").unwrap();
    std::fs::write(w.path().join("notes.txt"), b"gone soon").unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    // The disk budget evicts the shard here; notes.txt is deleted.
    std::fs::remove_file(w.path().join(shard)).unwrap();
    std::fs::remove_file(w.path().join("notes.txt")).unwrap();
    let published = writer.publish().unwrap();
    assert_eq!((published.seq, published.removed), (Some(2), 1));
    // The eviction alone publishes nothing.
    assert_eq!(writer.publish().unwrap().seq, None);

    let (t2, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let reader = open_dir(&endpoint, &url, t2.path(), r.path(), StoreKind::ShardStore);
    assert_eq!(reader.seq(), 2);
    assert_eq!(std::fs::read(r.path().join(shard)).unwrap(), b"ten items");
    assert!(r.path().join("metadata.json").exists());
    assert!(!r.path().join("notes.txt").exists());
}

#[test]
fn a_removal_of_a_file_changed_here_and_not_published_is_a_conflict() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "conflict");
    let (t1, w1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (t2, w2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = open_dir(
        &endpoint,
        &url,
        t1.path(),
        w1.path(),
        StoreKind::SegmentStore,
    );
    std::fs::write(w1.path().join("shared.json"), b"v1").unwrap();
    a.publish().unwrap();
    let b = open_dir(
        &endpoint,
        &url,
        t2.path(),
        w2.path(),
        StoreKind::SegmentStore,
    );
    assert_eq!(std::fs::read(w2.path().join("shared.json")).unwrap(), b"v1");

    // A removes the file and publishes; B has rewritten it meanwhile.
    std::fs::remove_file(w1.path().join("shared.json")).unwrap();
    assert_eq!(a.publish().unwrap().removed, 1);
    std::fs::write(w2.path().join("shared.json"), b"B's own, longer").unwrap();
    match b.refresh() {
        Err(Error::Conflict { path, seq, .. }) => {
            assert_eq!((path.as_str(), seq), ("shared.json", 2))
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        std::fs::read(w2.path().join("shared.json")).unwrap(),
        b"B's own, longer"
    );
}
