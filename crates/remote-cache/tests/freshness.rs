//! A reader that refreshes while another process publishes sees whole
//! commits only, each record right, and in the end every commit.

//!
//! Also: an open finds what was published since with one GET per new
//! commit and one more (never a listing), and writers publishing at the
//! same time leave commits numbered without gaps, which is what lets one
//! GET answer that nothing newer exists.

mod common;

use std::sync::Arc;
use tensor_core::Value;

use common::{
    RequestLog, child_writer, keyed, new_bucket_url, s3_endpoint, s3_location, s3_options,
    small_tier, spawn_child_writer,
};
use remote_cache::commit_name;
use remote_cache::{RemoteDir, SegmentsAt};
use remote_tier::{RemoteTier, build_store};
use segment_store::Options;
use tensor_core::Tensor;
use test_support::intercept::Intercepted;

const CHILD_ENV: &str = "REMOTE_CACHE_PUBLISHER_CHILD";
const COMMITS: usize = 12;
const PER_COMMIT: usize = 20;

fn record(i: usize) -> Value {
    Value::from(Tensor::from_vec([16], vec![i as u16; 16]).unwrap())
}

/// The publisher process (does nothing unless spawned by the test below).
#[test]
fn publisher_child() {
    let Some(store) = child_writer(CHILD_ENV, 3) else {
        return;
    };
    for c in 0..COMMITS {
        // Two segments per commit: a reader must never see one alone.
        for half in 0..2 {
            let base = c * PER_COMMIT + half * PER_COMMIT / 2;
            store
                .put_batch(&keyed("k", base..base + PER_COMMIT / 2, record))
                .unwrap();
            store.flush().unwrap();
        }
        assert_eq!(store.publish().unwrap().seq, Some(c as u64 + 1));
    }
}

#[test]
fn a_refreshing_reader_sees_whole_commits_from_another_process() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "fresh");
    let (pub_dir, read_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut child = spawn_child_writer(
        "publisher_child",
        CHILD_ENV,
        (&endpoint, &url, pub_dir.path()),
        std::process::Stdio::piped(),
    );
    let reader = SegmentsAt::open(
        &s3_location(&endpoint, &url, read_dir.path()),
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let mut seen = Vec::new();
    loop {
        let done = child.try_wait().unwrap().is_some();
        let (log, _) = reader.refresh().unwrap();
        let n = reader.len();
        assert_eq!(n, log.seq as usize * PER_COMMIT, "whole commits only");
        let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
        let (got, missing) = reader.get_batch(&keys).unwrap();
        assert!(missing.is_empty());
        for (i, r) in got.iter().enumerate() {
            assert!(r.as_ref() == Some(&record(i)), "k{i}");
        }
        if seen.last() != Some(&log.seq) {
            seen.push(log.seq);
        }
        if done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "publisher failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (log, _) = reader.refresh().unwrap();
    assert_eq!(log.seq, COMMITS as u64);
    assert_eq!(reader.len(), COMMITS * PER_COMMIT);
    eprintln!("sequence numbers seen while publishing: {seen:?}");
}

#[test]
fn a_periodic_refresher_brings_new_commits_without_a_call() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "periodic");
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
    let reader = std::sync::Arc::new(
        SegmentsAt::open(
            &s3_location(&endpoint, &url, r.path()),
            Options {
                read_only: true,
                ..Options::default()
            },
        )
        .unwrap(),
    );
    let refresher = SegmentsAt::refresh_every(&reader, std::time::Duration::from_millis(20));
    let items = keyed("k", 0..10, record);
    writer.put_batch(&items).unwrap();
    writer.publish().unwrap();
    // A liveness bound, not a timing check: the refresher must get there.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while reader.len() < 10 {
        assert!(
            std::time::Instant::now() < give_up,
            "never refreshed: {:?}",
            refresher.last_error()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(refresher.last_error().is_none());
    let (got, _) = reader.get_batch(&["k9"]).unwrap();
    assert!(got[0].as_ref() == Some(&record(9)));
    drop(refresher);
}

/// A read-only segment store at `url` whose requests are recorded in the
/// returned log, with its tier and working directory under `dir`: opened
/// as `SegmentsAt::open` does, so a warm open asks for the next
/// commit while the store opens.
fn recorded_reader(endpoint: &str, url: &str, dir: &std::path::Path) -> (SegmentsAt, RequestLog) {
    let (inner, prefix) = build_store(url, s3_options(endpoint)).unwrap();
    let log = RequestLog::default();
    let store = Arc::new(Intercepted::new(inner, Arc::clone(&log)));
    let tier =
        RemoteTier::with_store(store, prefix, url, small_tier(&dir.join("tier"), 1 << 30)).unwrap();
    let remote =
        RemoteDir::open_unapplied(tier, &dir.join("work"), remote_cache::StoreFiles::PLAIN)
            .unwrap();
    let options = Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    (SegmentsAt::with_unapplied(remote, options).unwrap(), log)
}

fn publish_range(writer: &SegmentsAt, range: std::ops::Range<usize>) -> Option<u64> {
    writer.put_batch(&keyed("k", range, record)).unwrap();
    writer.publish().unwrap().seq
}

/// The commit records a request log asked for, in order.
fn commits_asked(log: &RequestLog) -> Vec<(&'static str, String)> {
    log.all()
        .into_iter()
        .filter(|(_, path)| path.contains("/commits/"))
        .collect()
}

#[test]
fn an_open_finds_new_commits_with_one_get_each_and_one_more() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "probe");
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
    assert_eq!(publish_range(&writer, 0..10), Some(1));
    let (reader, _) = recorded_reader(&endpoint, &url, r.path());
    assert_eq!((reader.remote().unwrap().seq(), reader.len()), (1, 10));
    drop(reader);

    // Published while no reader was open: the next open finds both (the
    // store opened on the first commit, then refreshed onto the others).
    assert_eq!(publish_range(&writer, 10..20), Some(2));
    assert_eq!(publish_range(&writer, 20..30), Some(3));
    let (reader, log) = recorded_reader(&endpoint, &url, r.path());
    assert_eq!((reader.remote().unwrap().seq(), reader.len()), (3, 30));
    let keys: Vec<String> = (0..30).map(|i| format!("k{i}")).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty());
    for (i, rec) in got.iter().enumerate() {
        assert!(rec.as_ref() == Some(&record(i)), "k{i}");
    }
    let asked = commits_asked(&log);
    let names: Vec<&str> = asked.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(names.len(), 3, "{asked:?}");
    for (name, seq) in names.iter().zip(2u64..) {
        assert!(name.ends_with(&commit_name(seq)), "{asked:?}");
    }
    assert!(asked.iter().all(|(op, _)| *op == "get"), "{asked:?}");
    assert!(!log.all().iter().any(|(op, _)| *op == "list"));
    drop(reader);

    // Warm, nothing new: two requests sent at once, for the commit after
    // the last and for the log's identity (`log.json`).
    let (reader, log) = recorded_reader(&endpoint, &url, r.path());
    assert_eq!(reader.len(), 30);
    let mut all = log.all();
    all.sort();
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        all[0].0 == "get" && all[0].1.ends_with(&commit_name(4)),
        "{all:?}"
    );
    assert!(
        all[1].0 == "get" && all[1].1.ends_with(remote_cache::LOG_OBJECT),
        "{all:?}"
    );

    // And a refresh after another publish brings it (with the same probe).
    assert_eq!(publish_range(&writer, 30..40), Some(4));
    let (report, _) = reader.refresh().unwrap();
    assert_eq!((report.seq, report.commits, reader.len()), (4, 1, 40));
}

#[test]
fn writers_publishing_at_once_leave_commits_without_gaps() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    const WRITERS: usize = 3;
    const ROUNDS: usize = 4;
    const PER: usize = 5;
    let url = new_bucket_url(&endpoint, "racing");
    let dirs: Vec<_> = (0..=WRITERS)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let reader = SegmentsAt::open(
        &s3_location(&endpoint, &url, dirs[WRITERS].path()),
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for (w, dir) in dirs.iter().take(WRITERS).enumerate() {
            let (endpoint, url, done) = (&endpoint, &url, &done);
            scope.spawn(move || {
                let options = Options {
                    writer_id: Some(w as u32 + 1),
                    ..Options::default()
                };
                let writer =
                    SegmentsAt::open(&s3_location(endpoint, url, dir.path()), options).unwrap();
                for round in 0..ROUNDS {
                    let base = (w * ROUNDS + round) * PER;
                    assert!(publish_range(&writer, base..base + PER).is_some());
                }
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        // Meanwhile: every state the reader finds is whole commits.
        let mut last = 0;
        while done.load(std::sync::atomic::Ordering::SeqCst) < WRITERS {
            let (report, _) = reader.refresh().unwrap();
            assert!(report.seq >= last);
            last = report.seq;
            assert_eq!(reader.len(), report.seq as usize * PER);
        }
    });
    let total = WRITERS * ROUNDS;
    let (report, _) = reader.refresh().unwrap();
    assert_eq!((report.seq, reader.len()), (total as u64, total * PER));
    let names: Vec<String> = reader
        .remote()
        .unwrap()
        .tier()
        .list("commits")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    let want: Vec<String> = (1..=total as u64).map(commit_name).collect();
    assert_eq!(names, want);
}
