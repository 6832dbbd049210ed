//! gc's promises one at a time, on S3: pieces uploaded before their
//! commit survive a gc within the grace period; a reader behind the
//! window whose next commit lost its objects moves to the checkpoint; a
//! cold open costs the same few requests on the commit log after forty
//! commits as after four.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{
    RefuseCreates, Requests, keyed, new_bucket_url, s3_endpoint, s3_location, s3_options,
    small_tier, tier,
};
use remote_cache::{GcOptions, du, gc};
use remote_cache::{RemoteDir, SegmentsAt, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, build_store};
use segment_store::{Options, SegmentStore};
use tensor_core::{Tensor, Value};
use test_support::intercept::Intercepted;

fn record(i: usize, round: usize) -> Value {
    let values: Vec<f32> = (0..256).map(|j| (i * 256 + j + round) as f32).collect();
    Value::from(Tensor::from_vec([16, 16], values).unwrap())
}

fn assert_values(store: &SegmentStore, keys: std::ops::Range<usize>, round: usize) {
    let names: Vec<String> = keys.clone().map(|i| format!("k{i}")).collect();
    let (got, missing) = store.get_batch(&names).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in keys.zip(got) {
        assert!(r.as_ref() == Some(&record(i, round)), "k{i}");
    }
}

fn read_only() -> Options {
    Options {
        read_only: true,
        ..Options::default()
    }
}

/// No window, no grace: everything not in the last state goes.
const NOW: GcOptions = GcOptions {
    keep: Duration::ZERO,
    grace: Duration::ZERO,
};

#[test]
fn pieces_uploaded_before_their_commit_survive_a_gc_in_the_grace_period() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "grace");
    let (t, w) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let refuse = Arc::new(RefuseCreates::default());
    let wrapped = Arc::new(Intercepted::new(store, Arc::clone(&refuse)));
    let refusing =
        RemoteTier::with_store(wrapped, prefix, &url, small_tier(t.path(), 1 << 30)).unwrap();
    let dir = RemoteDir::open(refusing, w.path(), StoreFiles::PLAIN).unwrap();
    let writer = SegmentStore::open(dir.dir(), Options::default()).unwrap();
    writer
        .put_batch(&keyed("k", 0..40, |i| record(i, 0)))
        .unwrap();
    writer.flush().unwrap();
    assert_eq!(dir.publish().unwrap().seq, Some(1));

    // The next publish uploads its pieces, then its commit fails.
    writer
        .put_batch(&keyed("k", 40..80, |i| record(i, 0)))
        .unwrap();
    writer.flush().unwrap();
    refuse.0.store(1_000, Ordering::SeqCst);
    assert!(dir.publish().is_err());
    let g = tempfile::tempdir().unwrap();
    let gc_tier = tier(&endpoint, &url, g.path());
    let before = du(&gc_tier, Duration::ZERO).unwrap();
    assert!(
        before.garbage_objects > 0,
        "the pieces not committed: {before:?}"
    );

    // gc in the default grace period: nothing uploaded is deleted.
    std::thread::sleep(Duration::from_secs(2));
    let report = gc(
        &gc_tier,
        GcOptions {
            keep: Duration::ZERO,
            ..GcOptions::default()
        },
    )
    .unwrap();
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    assert_eq!(report.young_objects, before.garbage_objects, "{report:?}");

    // The publish resumes: its pieces are there, only the commit is new.
    refuse.0.store(0, Ordering::SeqCst);
    let again = dir.publish().unwrap();
    assert_eq!((again.seq, again.uploaded), (Some(2), 0), "{again:?}");
    let r = tempfile::tempdir().unwrap();
    let reader = SegmentsAt::open(&s3_location(&endpoint, &url, r.path()), read_only()).unwrap();
    assert_eq!(reader.len(), 80);
    assert_values(&reader, 0..80, 0);
}

#[test]
fn a_reader_behind_the_window_whose_next_commit_lost_its_objects_moves_to_the_checkpoint() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "behind");
    let (w, r, g) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
    writer
        .put_batch(&keyed("k", 0..50, |i| record(i, 0)))
        .unwrap();
    writer.publish().unwrap();
    let behind = SegmentsAt::open(&s3_location(&endpoint, &url, r.path()), read_only()).unwrap();
    assert_eq!(behind.remote().unwrap().seq(), 1);
    for round in 1..3 {
        writer
            .put_batch(&keyed("k", 0..50, |i| record(i, round)))
            .unwrap();
        writer.publish().unwrap();
    }
    writer.compact().unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(4));
    std::thread::sleep(Duration::from_secs(2));
    let report = gc(&tier(&endpoint, &url, g.path()), NOW).unwrap();
    assert_eq!(report.checkpoint, Some(4), "{report:?}");
    assert!(report.deleted_objects > 0, "{report:?}");

    // Commit 2's segment is gone from the store: the reader cannot apply
    // it, and applies checkpoint 4 instead (old segments removed here).
    let (refreshed, _) = behind.refresh().unwrap();
    assert_eq!(
        (refreshed.seq, refreshed.checkpoints, refreshed.commits),
        (4, 1, 0),
        "{refreshed:?}"
    );
    assert!(refreshed.removed > 0, "{refreshed:?}");
    assert_values(&behind, 0..50, 2);
    let theirs = segments(behind.remote().unwrap().dir());
    assert_eq!(theirs, segments(writer.remote().unwrap().dir()));

    // And the log goes on from there.
    writer
        .put_batch(&keyed("k", 50..60, |i| record(i, 0)))
        .unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(5));
    let (next, _) = behind.refresh().unwrap();
    assert_eq!((next.seq, next.commits), (5, 1));
    assert_values(&behind, 50..60, 0);
}

fn segments(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The requests a cold open of the log at `url` sends for its records
/// (commits and checkpoints), and the commit it lands on.
fn cold_open_requests(endpoint: &str, url: &str) -> (u64, Vec<(&'static str, String)>) {
    let scratch = tempfile::tempdir().unwrap();
    let (store, prefix) = build_store(url, s3_options(endpoint)).unwrap();
    let log = Arc::new(Requests::default());
    let recorded = Arc::new(Intercepted::new(store, Arc::clone(&log)));
    let tier = RemoteTier::with_store(
        recorded,
        prefix,
        url,
        small_tier(&scratch.path().join("tier"), 1 << 30),
    )
    .unwrap();
    let dir = RemoteDir::open(tier, &scratch.path().join("work"), StoreFiles::PLAIN).unwrap();
    let asked = log
        .all()
        .iter()
        .filter(|(_, p)| p.contains("/commits") || p.contains("/checkpoints"))
        .map(|(op, p)| (*op, p.rsplit('/').next().unwrap_or_default().to_string()))
        .collect();
    (dir.seq(), asked)
}

#[test]
fn a_cold_open_after_gc_costs_the_same_few_requests_after_forty_commits_as_after_four() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let mut seen = Vec::new();
    for commits in [4usize, 40] {
        let url = new_bucket_url(&endpoint, "cold");
        let w = tempfile::tempdir().unwrap();
        let writer =
            SegmentsAt::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
        for c in 0..commits {
            writer
                .put_batch(&keyed("k", c..c + 1, |i| record(i, 0)))
                .unwrap();
            writer.publish().unwrap();
        }
        let (_, before) = cold_open_requests(&endpoint, &url);
        assert_eq!(before.len(), commits + 2, "{before:?}");
        std::thread::sleep(Duration::from_secs(2));
        let g = tempfile::tempdir().unwrap();
        gc(&tier(&endpoint, &url, g.path()), NOW).unwrap();
        let (seq, after) = cold_open_requests(&endpoint, &url);
        println!("cold open after {commits} commits and gc: {after:?}");
        assert_eq!(seq, commits as u64);
        seen.push(after.iter().map(|(op, _)| *op).collect::<Vec<_>>());
        // The checkpoint's listing, the checkpoint, the commit after it.
        assert_eq!(after.len(), 3, "{after:?}");
        let c = format!("{commits:020}.json");
        let n = format!("{:020}.json", commits + 1);
        assert_eq!(after[0].0, "list", "{after:?}");
        assert_eq!(after[1], ("get", c), "{after:?}");
        assert_eq!(after[2], ("get", n), "{after:?}");
        let r = tempfile::tempdir().unwrap();
        let reader =
            SegmentsAt::open(&s3_location(&endpoint, &url, r.path()), read_only()).unwrap();
        assert_values(&reader, 0..commits, 0);

        // A window reaching below the checkpoint moves nothing.
        writer
            .put_batch(&keyed("k", commits..commits + 1, |i| record(i, 0)))
            .unwrap();
        writer.publish().unwrap();
        let again = gc(&tier(&endpoint, &url, g.path()), GcOptions::default()).unwrap();
        assert_eq!(
            (again.checkpoint, again.deleted_objects, again.seq),
            (None, 0, commits as u64 + 1),
            "{again:?}"
        );
    }
    assert_eq!(seen[0], seen[1]);
}

fn open_dir(endpoint: &str, url: &str, tier_dir: &Path, work: &Path, kind: StoreKind) -> RemoteDir {
    RemoteDir::open(
        tier(endpoint, url, tier_dir),
        work,
        StoreFiles::for_kind(kind),
    )
    .unwrap()
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn a_working_directory_whose_linked_file_lost_its_object_reopens_onto_the_checkpoint() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "relinked");
    let (wt, w) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer = open_dir(&endpoint, &url, wt.path(), w.path(), StoreKind::MemmapArray);
    // Larger than the tier fetches whole: readers link it, read by blocks.
    let first = bytes(300_000, 1);
    std::fs::write(w.path().join("data.bin"), &first).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    let (rt, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let reader = open_dir(&endpoint, &url, rt.path(), r.path(), StoreKind::MemmapArray);
    assert!(reader.is_by_blocks("data.bin"));
    reader.ensure("data.bin", 0..first.len() as u64).unwrap();
    assert_eq!(std::fs::read(r.path().join("data.bin")).unwrap(), first);
    drop(reader);

    // The file is rewritten and published; gc deletes the old object; the
    // reader's tier loses its copy too.
    let second = bytes(300_000, 2);
    let tmp = w.path().join("data.bin.new");
    std::fs::write(&tmp, &second).unwrap();
    std::fs::rename(&tmp, w.path().join("data.bin")).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(2));
    std::thread::sleep(Duration::from_secs(2));
    let g = tempfile::tempdir().unwrap();
    let report = gc(&tier(&endpoint, &url, g.path()), NOW).unwrap();
    assert!(report.deleted_objects > 0, "{report:?}");
    std::fs::remove_dir_all(rt.path().join("objects")).unwrap();

    // Reopened, the working directory cannot link its file again, and
    // moves to the checkpoint of commit 2.
    let reader = open_dir(&endpoint, &url, rt.path(), r.path(), StoreKind::MemmapArray);
    assert_eq!(reader.seq(), 2);
    reader.ensure("data.bin", 0..second.len() as u64).unwrap();
    assert_eq!(std::fs::read(r.path().join("data.bin")).unwrap(), second);
}
