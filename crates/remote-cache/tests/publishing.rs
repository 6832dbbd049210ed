//! Writers that never call `publish`: what a segment or shard writer on a
//! URL persisted reaches the bucket when the handle is dropped, and what
//! it flushed reaches it within a publish interval while it lives — read
//! each time by a reader on a tier of its own (another machine).

mod common;

use std::time::{Duration, Instant};

use common::{new_bucket_url, s3_endpoint, s3_location};
use remote_cache::{DEFAULT_PUBLISH_INTERVAL, Publish, Publisher};
use remote_cache::{SegmentsAt, ShardsAt};
use tensor_core::{Tensor, Value};

fn record(i: u32) -> Value {
    Value::from(Tensor::from_vec([2], vec![i as f32, -(i as f32)]).unwrap())
}

fn keys(n: u32) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

fn writer_options(flush_every: usize) -> segment_store::Options {
    segment_store::Options {
        flush_every,
        ..segment_store::Options::default()
    }
}

fn reader_options() -> segment_store::Options {
    segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    }
}

/// Polls `check` until it holds, for a minute at most (a bound on a hang,
/// not a timing assertion): whether it held.
fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60) + DEFAULT_PUBLISH_INTERVAL;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

#[test]
fn a_segment_writer_dropped_without_publish_publishes_what_it_held() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "dropped-segments");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, a.path()), writer_options(64)).unwrap();
    // Three segments flushed by the store on its own, and 8 records pending.
    let items: Vec<(String, Value)> = keys(200)
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k, record(i as u32)))
        .collect();
    writer.put_batch(&items).unwrap();
    drop(writer);

    let reader =
        SegmentsAt::open(&s3_location(&endpoint, &url, b.path()), reader_options()).unwrap();
    assert_eq!(reader.len(), 200);
    let (got, missing) = reader.get_batch(&keys(200)).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    for (i, value) in got.iter().enumerate() {
        assert_eq!(value.as_ref(), Some(&record(i as u32)));
    }
}

#[test]
fn a_flushed_segment_reaches_the_bucket_while_its_writer_lives() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "live-segments");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, a.path()), writer_options(16)).unwrap();
    let items: Vec<(String, Value)> = keys(40)
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k, record(i as u32)))
        .collect();
    // 32 records in two segments the store flushed itself; 8 pending.
    writer.put_batch(&items).unwrap();
    let mut reader = None;
    let seen = eventually(|| {
        if reader.is_none() {
            reader =
                SegmentsAt::open(&s3_location(&endpoint, &url, b.path()), reader_options()).ok();
        }
        reader.as_ref().is_some_and(|r| {
            r.refresh().is_ok() && r.get_batch(&["k0", "k31"]).unwrap().1.is_empty()
        })
    });
    assert!(seen, "the flushed segments never reached the bucket");
    // Only what the store persisted: the pending records wait for a flush.
    let (_, missing) = reader.as_ref().unwrap().get_batch(&["k39"]).unwrap();
    assert_eq!(missing, vec![0]);
    assert!(writer.remote().unwrap().seq() >= 1);
    drop(writer);
    let reader = reader.unwrap();
    reader.refresh().unwrap();
    assert_eq!(reader.get_batch(&keys(40)).unwrap().1, Vec::<usize>::new());
}

#[test]
fn a_shard_writer_dropped_without_publish_publishes_every_shard() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "dropped-shards");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let options = || shard_store::Options::default().shard_items(50);
    let writer =
        ShardsAt::open_with_source(&s3_location(&endpoint, &url, a.path()), options(), || {
            (0..420u64).map(|i| (i, format!("item {i}")))
        })
        .unwrap();
    assert_eq!(writer.len().unwrap(), 420);
    writer.wait_until_all_cached().unwrap();
    drop(writer);

    let reader: ShardsAt<(u64, String)> =
        ShardsAt::open(&s3_location(&endpoint, &url, b.path()), options()).unwrap();
    assert_eq!(reader.len().unwrap(), 420);
    for i in 0..420 {
        assert_eq!(reader.get(i).unwrap(), (i as u64, format!("item {i}")));
    }
}

#[test]
fn a_publisher_publishes_on_its_period_and_once_more_when_dropped() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    let (ticks, lasts) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let (t, l) = (Arc::clone(&ticks), Arc::clone(&lasts));
    let publisher = Publisher::start(
        "test".into(),
        Some(Duration::from_millis(10)),
        move |step| {
            match step {
                Publish::Tick => t.fetch_add(1, Ordering::SeqCst),
                Publish::Last => l.fetch_add(1, Ordering::SeqCst),
            };
            Err("the server is away".into())
        },
    );
    assert!(eventually(|| ticks.load(Ordering::SeqCst) >= 3));
    assert!(
        publisher
            .last_error()
            .unwrap()
            .contains("the server is away")
    );
    drop(publisher);
    // The drop waited for the last publish (which failed: reported, not raised).
    assert_eq!(lasts.load(Ordering::SeqCst), 1);
}
