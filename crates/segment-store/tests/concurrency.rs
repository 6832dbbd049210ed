//! One writer, many readers: the lock, readers during writes, the
//! background flush thread and its error surfacing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tensor_core::Value;

use segment_store::{Error, Options, SegmentStore};
use tensor_core::Tensor;

fn rec(i: usize) -> Value {
    Value::from(Tensor::from_vec([4], vec![i as u32, 1, 2, 3]).unwrap())
}

fn opts() -> Options {
    Options {
        flush_every: 8,
        lru_bytes: 0,
        ..Options::default()
    }
}

/// A writer in `dir` that makes a segment of every `flush_every` records.
fn writer(dir: &std::path::Path, flush_every: usize, async_write: bool) -> SegmentStore {
    let opts = Options {
        flush_every,
        async_write,
        queue_depth: 1,
        ..opts()
    };
    SegmentStore::open(dir, opts).unwrap()
}

/// A writer (segments of 4 records) that committed `k0..k4` as one.
fn one_segment_in(async_write: bool) -> (tempfile::TempDir, SegmentStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = writer(dir.path(), 4, async_write);
    store.put_batch(&keyed(0..4)).unwrap();
    store.flush().unwrap();
    (dir, store)
}

/// Records `k{i}` for `range`.
fn keyed(range: std::ops::Range<usize>) -> Vec<(String, Value)> {
    range.map(|i| (format!("k{i}"), rec(i))).collect()
}

#[test]
fn a_second_writer_is_refused_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let first = SegmentStore::open(dir.path(), opts()).unwrap();
    let err = SegmentStore::open(dir.path(), opts()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("segment-store.lock"));
    // Readers need no lock.
    let reader = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    assert!(!reader.is_writer());
    drop(first);
    // The lock goes with the writer.
    SegmentStore::open(dir.path(), opts()).unwrap();
}

#[test]
fn readers_see_every_committed_record_while_a_writer_writes() {
    for async_write in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SegmentStore::open(
                dir.path(),
                Options {
                    async_write,
                    queue_depth: 1,
                    ..opts()
                },
            )
            .unwrap(),
        );
        let written = Arc::new(AtomicUsize::new(0));
        const N: usize = 400;
        let readers: Vec<_> = (0..3)
            .map(|t| {
                let store = store.clone();
                let written = written.clone();
                std::thread::spawn(move || {
                    let mut checked = 0;
                    loop {
                        let done = written.load(Ordering::Acquire);
                        if done > 0 {
                            let keys: Vec<String> = (0..done)
                                .rev()
                                .step_by(3 + t)
                                .map(|i| format!("k{i}"))
                                .collect();
                            let (got, missing) = store.get_batch(&keys).unwrap();
                            assert!(missing.is_empty(), "missing {missing:?} of {done}");
                            for (k, g) in keys.iter().zip(&got) {
                                let i: usize = k[1..].parse().unwrap();
                                assert_eq!(g.as_ref().unwrap(), &rec(i));
                            }
                            checked += keys.len();
                        }
                        if done == N {
                            return checked;
                        }
                    }
                })
            })
            .collect();
        for start in (0..N).step_by(10) {
            let items: Vec<(String, Value)> = (start..start + 10)
                .map(|i| (format!("k{i}"), rec(i)))
                .collect();
            store.put_batch(&items).unwrap();
            written.store(start + 10, Ordering::Release);
        }
        store.flush().unwrap();
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(store.len(), N);
        // A separate read-only handle sees everything committed.
        let reader = SegmentStore::open(
            dir.path(),
            Options {
                read_only: true,
                ..opts()
            },
        )
        .unwrap();
        assert_eq!(reader.len(), N);
        assert!(reader.verify().is_empty());
    }
}

#[test]
fn a_reader_opened_earlier_keeps_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let writer = SegmentStore::open(dir.path(), opts()).unwrap();
    writer.put_batch(&[("a", rec(1))]).unwrap();
    writer.flush().unwrap();
    let reader = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    writer.put_batch(&[("a", rec(2)), ("b", rec(3))]).unwrap();
    writer.flush().unwrap();
    let (got, missing) = reader.get_batch(&["a", "b"]).unwrap();
    assert_eq!(got[0].as_ref().unwrap(), &rec(1));
    assert_eq!(missing, vec![1]);
}

#[test]
fn background_flush_errors_come_back_from_the_next_call() {
    let (dir, store) = one_segment_in(true);
    // Make the next segment impossible to create.
    let segs = dir.path().join("segments");
    std::fs::rename(&segs, dir.path().join("moved")).unwrap();
    std::fs::write(&segs, b"not a directory").unwrap();
    let items = keyed(4..8);
    store.put_batch(&items).unwrap();
    let err = store.flush().unwrap_err();
    match &err {
        Error::Background { records, source } => {
            assert_eq!(*records, 4);
            assert!(matches!(**source, Error::Io { .. }), "{source}");
        }
        other => panic!("expected a background error, got {other}"),
    }
    assert!(std::error::Error::source(&err).is_some());
    // Reported once; the store keeps working once the disk is back.
    std::fs::remove_file(&segs).unwrap();
    std::fs::rename(dir.path().join("moved"), &segs).unwrap();
    store.flush().unwrap();
    store.put_batch(&[("k9", rec(9))]).unwrap();
    store.flush().unwrap();
    let (_, missing) = store.get_batch(&["k0", "k9", "k5"]).unwrap();
    // k5 was in the failed flush: lost, and the error said so.
    assert_eq!(missing, vec![2]);
}

#[test]
fn commit_errors_of_the_default_mode_come_back_from_the_next_call() {
    // By default the call that fills a segment writes it, and the flush
    // thread commits it: a commit that fails (here the rename, onto a
    // directory that took the segment's name) is the next call's error.
    let (dir, store) = one_segment_in(false);
    let taken = dir.path().join("segments").join("segment_000001.arrow");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("occupied"), b"x").unwrap();
    let items = keyed(4..8);
    // Written by this call; the failure is the commit's.
    store.put_batch(&items).unwrap();
    let err = store.flush().unwrap_err();
    match &err {
        Error::Background { records, source } => {
            assert_eq!(*records, 4);
            assert!(
                source.to_string().contains("segment_000001.arrow"),
                "{source}"
            );
        }
        other => panic!("expected the commit's error, got {other}"),
    }
    // Reported once; nothing of the failed segment stays behind, and the
    // store keeps working (the next segment takes the next id).
    store.flush().unwrap();
    let leftovers: Vec<String> = std::fs::read_dir(dir.path().join("segments"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    store.put_batch(&items).unwrap();
    store.flush().unwrap();
    drop(store);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
    let (records, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.as_ref().unwrap(), &rec(i), "k{i}");
    }
}

#[test]
fn synchronous_flush_errors_are_returned_directly() {
    let dir = tempfile::tempdir().unwrap();
    let store = writer(dir.path(), 2, false);
    store.put_batch(&[("a", rec(0))]).unwrap();
    let segs = dir.path().join("segments");
    std::fs::remove_dir(&segs).unwrap();
    std::fs::write(&segs, b"x").unwrap();
    let err = store.put_batch(&[("b", rec(1))]).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
}

/// Set in the child process that [`a_reader_opened_during_flushes_keeps_every_committed_segment`]
/// starts: the cache directory it writes into, one record per flush.
const FLUSH_LOOP_DIR: &str = "SEGMENT_STORE_TEST_FLUSH_LOOP_DIR";

/// The child: flushes `k0`, `k1`, ... one segment each, in order, until
/// the file `stop` appears in its directory.
fn flush_loop(dir: &std::path::Path) {
    let store = writer(dir, 1 << 20, false);
    for i in 0.. {
        store.put_batch(&keyed(i..i + 1)).unwrap();
        store.flush().unwrap();
        if i % 16 == 0 && dir.join("stop").exists() {
            return;
        }
    }
}

/// Keys `k0..` are committed in order, so what a reader sees of them must
/// be a prefix: a key missing below one it sees is a lost segment.
fn assert_a_prefix(reader: &SegmentStore, when: &str) -> usize {
    let upto = reader.len() + 256;
    let keys: Vec<String> = (0..upto).map(|i| format!("k{i}")).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    let seen = got.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
    let lost: Vec<usize> = missing.into_iter().filter(|&i| i < seen).collect();
    assert!(
        lost.is_empty(),
        "{when}: keys {lost:?} are missing below k{} (problems: {:?})",
        seen - 1,
        reader.problems()
    );
    for (i, g) in got.iter().enumerate().take(seen) {
        assert_eq!(g.as_ref().unwrap(), &rec(i), "k{i}");
    }
    seen
}

#[test]
fn a_reader_opened_during_flushes_keeps_every_committed_segment() {
    if let Some(dir) = std::env::var_os(FLUSH_LOOP_DIR) {
        flush_loop(std::path::Path::new(&dir));
        return;
    }
    // Recovery lists `segments/` and then reads the index logs: a segment
    // renamed and logged in between was once reported missing, and no
    // refresh found it again. The writer is another process, as beside
    // `cachex verify`.
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_reader_opened_during_flushes_keeps_every_committed_segment",
            "--nocapture",
        ])
        .env(FLUSH_LOOP_DIR, dir.path())
        .spawn()
        .unwrap();
    let read_only = || {
        SegmentStore::open(
            dir.path(),
            Options {
                read_only: true,
                ..opts()
            },
        )
        .unwrap()
    };
    let mut outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // Enough segments that listing and opening them leaves the writer
        // time to commit the next ones meanwhile.
        let watch = read_only();
        while watch.len() < 300 {
            assert!(child.try_wait().unwrap().is_none(), "the writer stopped");
            std::thread::sleep(std::time::Duration::from_millis(20));
            watch.refresh().unwrap();
            let on_disk = std::fs::read_dir(dir.path().join("segments")).map_or(0, |d| d.count());
            assert!(
                on_disk < 3000,
                "refreshes found {} of {on_disk} segments",
                watch.len()
            );
        }
        for round in 0..40 {
            let reader = read_only();
            let before = assert_a_prefix(&reader, &format!("round {round}, opened"));
            reader.refresh().unwrap();
            let after = assert_a_prefix(&reader, &format!("round {round}, refreshed"));
            assert!(after >= before);
            if round % 8 == 0 {
                let missing: Vec<_> = segment_store::verify(dir.path())
                    .into_iter()
                    .filter(|p| p.kind == cache_check::ProblemKind::Missing)
                    .collect();
                assert!(missing.is_empty(), "verify beside a writer: {missing:?}");
            }
        }
    }));
    std::fs::write(dir.path().join("stop"), b"").unwrap();
    let status = child.wait().unwrap();
    if outcome.is_ok() && !status.success() {
        outcome = Err(Box::new(format!("the writer failed: {status}")));
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}
