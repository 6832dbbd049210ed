//! gc on S3: run while a publisher commits and with a reader opened
//! before it, nothing either needs is deleted; a reader on the commit
//! that was current at the window's start keeps what it reads, however
//! long before that commit was written; after compaction and gc
//! every value reads right and the bucket holds at most 1.1 times the
//! live bytes; a cold open then starts from the checkpoint; du reports
//! what gc would keep and delete.
//!
//! The window and the grace period are set from the test's own clock
//! (`keep` / `grace` = time since a mark), with pauses of a few seconds so
//! that the whole-second last-modified times of the listing fall on the
//! right side of the mark.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{build_arrays, keyed, new_bucket_url, s3_endpoint, s3_location, tier};
use remote_cache::push_dir;
use remote_cache::{ArraysAt, RemoteDir, SegmentsAt, StoreFiles};
use remote_cache::{GcOptions, du, gc};
use remote_tier::RemoteTier;
use segment_store::Options;
use tensor_core::{Tensor, Value};

/// 4 KiB a record, so that segments, not records, make the bucket.
fn record(i: usize, round: usize) -> Value {
    let values: Vec<f32> = (0..1024).map(|j| (i * 1024 + j + round) as f32).collect();
    Value::from(Tensor::from_vec([32, 32], values).unwrap())
}

fn assert_values(store: &SegmentsAt, keys: std::ops::Range<usize>, round: usize) {
    let names: Vec<String> = keys.clone().map(|i| format!("k{i}")).collect();
    let (got, missing) = store.get_batch(&names).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in keys.zip(got) {
        assert!(r.as_ref() == Some(&record(i, round)), "k{i}");
    }
}

fn reader(endpoint: &str, url: &str, dir: &Path) -> SegmentsAt {
    SegmentsAt::open(
        &s3_location(endpoint, url, dir),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Every byte under the URL.
fn bucket_bytes(tier: &RemoteTier) -> u64 {
    tier.list("").unwrap().iter().map(|o| o.size).sum()
}

#[test]
fn gc_with_a_publisher_and_a_reader_then_the_bucket_holds_the_live_bytes() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "gc");
    let (w, r, g) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let writer = SegmentsAt::open(
        &s3_location(&endpoint, &url, w.path()),
        Options {
            flush_every: 25,
            ..Options::default()
        },
    )
    .unwrap();
    // Every key written three times: two of every three rows are dead.
    for round in 0..3 {
        writer
            .put_batch(&keyed("k", 0..100, |i| record(i, round)))
            .unwrap();
        writer.publish().unwrap();
    }
    writer.compact().unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(4));
    std::thread::sleep(Duration::from_secs(3));
    // Commit 4 is current at the window's start; objects written from
    // here on are inside the grace period.
    let mark = Instant::now();
    let opened_before = reader(&endpoint, &url, r.path());
    assert_eq!(opened_before.remote().unwrap().seq(), 4);
    assert_values(&opened_before, 0..100, 2);

    let gc_tier = tier(&endpoint, &url, g.path());
    let before = du(&gc_tier, mark.elapsed()).unwrap();
    println!("before gc: {before:?}");
    assert_eq!((before.seq, before.window_start), (4, 4));
    assert!(before.garbage_bytes > before.live_bytes, "{before:?}");

    // A publisher commits before, during and after the gc.
    let (started, go) = std::sync::mpsc::channel();
    let report = std::thread::scope(|s| {
        let publisher = s.spawn(|| {
            for c in 0..4 {
                let keys = 100 + c * 25..125 + c * 25;
                writer
                    .put_batch(&keyed("k", keys, |i| record(i, 0)))
                    .unwrap();
                writer.publish().unwrap();
                if c == 0 {
                    started.send(()).unwrap();
                }
            }
        });
        go.recv().unwrap();
        let options = GcOptions {
            keep: mark.elapsed(),
            grace: mark.elapsed(),
        };
        let report = gc(&gc_tier, options).unwrap();
        publisher.join().unwrap();
        report
    });
    println!("gc during publishing: {report:?}");
    assert_eq!(report.checkpoint, Some(4), "{report:?}");
    assert!(report.deleted_objects > 0, "{report:?}");

    // The reader opened before gc refreshes onto every commit; the
    // publisher's last commit is there whole.
    let (refreshed, _) = opened_before.refresh().unwrap();
    assert_eq!(refreshed.seq, 8, "{refreshed:?}");
    assert_values(&opened_before, 0..100, 2);
    assert_values(&opened_before, 100..200, 0);

    // Everything before the mark is long past the grace period now: a gc
    // with no window keeps the live bytes only.
    std::thread::sleep(Duration::from_secs(2));
    let options = GcOptions {
        keep: Duration::ZERO,
        grace: Duration::ZERO,
    };
    let second = gc(&gc_tier, options).unwrap();
    println!("gc with no window: {second:?}");
    assert_eq!(second.checkpoint, Some(8), "{second:?}");
    assert_eq!(second.folded, 1, "the index log: {second:?}");
    assert_eq!(second.deleted_checkpoints, 1, "{second:?}");
    let after = du(&gc_tier, Duration::ZERO).unwrap();
    let bucket = bucket_bytes(&gc_tier);
    let ratio = bucket as f64 / after.file_bytes as f64;
    println!(
        "after compaction and gc: bucket {bucket} bytes, live {} bytes ({} files), ratio {ratio:.4}; {after:?}",
        after.file_bytes, after.files
    );
    assert_eq!(after.garbage_bytes, 0, "{after:?}");
    assert!(
        ratio <= 1.1,
        "bucket {bucket} > 1.1 x live {}",
        after.file_bytes
    );

    // Every value reads right: the reader opened before, refreshed; and a
    // cold open, which starts from the checkpoint.
    opened_before.refresh().unwrap();
    assert_values(&opened_before, 0..100, 2);
    assert_values(&opened_before, 100..200, 0);
    let cold = tempfile::tempdir().unwrap();
    let dir = RemoteDir::open_unapplied(
        tier(&endpoint, &url, &cold.path().join("tier")),
        &cold.path().join("work"),
        StoreFiles::PLAIN,
    )
    .unwrap();
    let opened = dir.refresh().unwrap();
    assert_eq!((opened.seq, opened.checkpoints, opened.commits), (8, 1, 0));
    let store = SegmentsAt::with_remote(
        dir,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_values(&store, 0..100, 2);
    assert_values(&store, 100..200, 0);

    // The writer publishes on after gc, and a reader follows.
    writer
        .put_batch(&keyed("k", 200..210, |i| record(i, 0)))
        .unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(9));
    opened_before.refresh().unwrap();
    assert_values(&opened_before, 200..210, 0);
}

/// A reader on the latest commit, written before the retention window
/// starts (days before, with the default window), still reads every row
/// after the next commit replaced the file it reads by blocks and a gc
/// ran: the window keeps the commit current at its start, not only those
/// written within it.
#[test]
fn gc_keeps_the_commit_that_was_current_when_the_window_starts() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "current");
    let (w, r, g) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let rows = 600u64; // 2.4 MB of `data.bin`, read in 64 KiB blocks
    let row = |version: i32| move |i: u64| vec![i as i32 * 3 + version; 1024];
    let pusher = tier(&endpoint, &url, w.path());
    let first = build_arrays(rows, row(1));
    assert_eq!(
        push_dir(&pusher, first.path(), &mut |_, _| {}).unwrap().seq,
        Some(1)
    );
    // Current, and reading by blocks: it fetches rows as it reads them.
    let current = ArraysAt::open(&s3_location(&endpoint, &url, r.path())).unwrap();
    assert_eq!(current.remote().unwrap().seq(), 1);
    let read_row = |i: u64| {
        let view = current.array(i, "data").unwrap().unwrap();
        view.as_slice::<i32>().unwrap().to_vec()
    };
    assert_eq!(read_row(0), row(1)(0));
    std::thread::sleep(Duration::from_secs(3));
    // The window's start: commit 1 is current, and stays so for 2 s.
    let mark = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    // Commit 2 replaces every file commit 1 reads from.
    let second = build_arrays(rows, row(2));
    assert_eq!(
        push_dir(&pusher, second.path(), &mut |_, _| {})
            .unwrap()
            .seq,
        Some(2)
    );

    let gc_tier = tier(&endpoint, &url, g.path());
    let keep = mark.elapsed();
    let usage = du(&gc_tier, keep).unwrap();
    assert_eq!((usage.seq, usage.window_start), (2, 1), "{usage:?}");
    // Every object is older than the grace period.
    let report = gc(
        &gc_tier,
        GcOptions {
            keep,
            grace: Duration::ZERO,
        },
    )
    .unwrap();
    println!("gc with commit 1 current at the window's start: {report:?}");
    assert_eq!(
        (report.checkpoint, report.deleted_objects),
        (Some(1), 0),
        "{report:?}"
    );
    for i in 0..rows {
        assert_eq!(read_row(i), row(1)(i), "row {i}");
    }
    // A cold open reads commit 2.
    let cold = tempfile::tempdir().unwrap();
    let latest = ArraysAt::open(&s3_location(&endpoint, &url, cold.path())).unwrap();
    latest.ensure_rows(0..rows).unwrap();
    for i in 0..rows {
        let view = latest.cache().array(i, "data").unwrap().unwrap();
        assert_eq!(view.as_slice::<i32>().unwrap(), &row(2)(i)[..], "row {i}");
    }
}
