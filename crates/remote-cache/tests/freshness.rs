//! A reader that refreshes while another process publishes sees whole
//! commits only, each record right, and in the end every commit.

mod common;

use common::{child_writer, new_bucket_url, s3_endpoint, s3_location, spawn_child_writer};
use remote_cache::RemoteSegments;
use segment_store::{Options, Record};
use tensor_core::Tensor;

const CHILD_ENV: &str = "REMOTE_CACHE_PUBLISHER_CHILD";
const COMMITS: usize = 12;
const PER_COMMIT: usize = 20;

fn record(i: usize) -> Record {
    Record::from(Tensor::from_vec([16], vec![i as u16; 16]).unwrap())
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
            let keys: Vec<String> = (base..base + PER_COMMIT / 2)
                .map(|i| format!("k{i}"))
                .collect();
            let items: Vec<(&str, Record)> = keys
                .iter()
                .enumerate()
                .map(|(j, k)| (k.as_str(), record(base + j)))
                .collect();
            store.put_batch(&items).unwrap();
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
    let reader = RemoteSegments::open(
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
        RemoteSegments::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
    let reader = std::sync::Arc::new(
        RemoteSegments::open(
            &s3_location(&endpoint, &url, r.path()),
            Options {
                read_only: true,
                ..Options::default()
            },
        )
        .unwrap(),
    );
    let refresher = RemoteSegments::refresh_every(&reader, std::time::Duration::from_millis(20));
    let items: Vec<(String, Record)> = (0..10).map(|i| (format!("k{i}"), record(i))).collect();
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
