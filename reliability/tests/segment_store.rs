//! segment-store under SIGKILL and injected I/O failures.

use std::path::Path;
use tensor_core::Value;

use reliability::{Fault, crash_loop, sweep};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;
use test_support::crash::{child_args, report_commit, report_error};

const ROWS: usize = 8;

fn key(b: usize, j: usize) -> String {
    format!("b{b:04}_r{j}")
}

fn value(seed: u64, b: usize, j: usize) -> Vec<f32> {
    let base = (seed % 1000) as f32 * 1e4 + (b * 10 + j) as f32;
    (0..16).map(|k| base + k as f32 * 0.5).collect()
}

fn batch(seed: u64, b: usize) -> Vec<(String, Value)> {
    (0..ROWS)
        .map(|j| {
            let t = Tensor::from_vec([16], value(seed, b, j)).expect("tensor");
            (key(b, j), Value::from(t))
        })
        .collect()
}

fn writer_opts() -> Options {
    Options {
        flush_every: 1 << 20,
        lru_bytes: 0,
        ..Options::default()
    }
}

/// The child: writes `batches` batches, one segment each, reporting each
/// batch once its flush returned.
fn write_stream(dir: &Path, seed: u64, batches: usize) {
    let store = match SegmentStore::open(dir, writer_opts()) {
        Ok(s) => s,
        Err(e) => return report_error(&e.to_string()),
    };
    for b in 0..batches {
        match store
            .put_batch(&batch(seed, b))
            .and_then(|()| store.flush())
        {
            Ok(()) => report_commit(&b.to_string()),
            Err(e) => return report_error(&e.to_string()),
        }
    }
}

#[test]
fn child_writer() {
    // Only does something when spawned by a parent test below.
    if let Some(args) = child_args() {
        let batches = if args.role == "long" { 400 } else { 4 };
        write_stream(&args.dir, args.seed, batches);
    }
}

/// Every committed batch is whole and exact; every other batch is whole or
/// absent; nothing else is there; the store takes new writes afterwards.
fn check_dir(dir: &Path, seed: u64, committed: &[String], max_batches: usize) {
    if !dir.exists() {
        assert!(committed.is_empty(), "{dir:?} vanished after commits");
        return;
    }
    let store = SegmentStore::open(dir, writer_opts())
        .unwrap_or_else(|e| panic!("reopen after crash: {e}"));
    let committed: Vec<usize> = committed
        .iter()
        .map(|c| c.parse().expect("batch number"))
        .collect();
    let mut present_total = 0;
    for b in 0..max_batches {
        let keys: Vec<String> = (0..ROWS).map(|j| key(b, j)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (values, missing) = store.get_batch(&refs).expect("get_batch after recovery");
        let present = ROWS - missing.len();
        assert!(
            present == 0 || present == ROWS,
            "batch {b} is torn: {present} of {ROWS} rows"
        );
        if committed.contains(&b) {
            assert_eq!(present, ROWS, "committed batch {b} lost");
        }
        for (j, v) in values.iter().enumerate() {
            if let Some(r) = v {
                let got = r
                    .as_tensor()
                    .expect("tensor record")
                    .view()
                    .as_slice::<f32>()
                    .expect("f32")
                    .to_vec();
                assert_eq!(got, value(seed, b, j), "batch {b} row {j} corrupt");
            }
        }
        present_total += present;
    }
    assert_eq!(
        store.len(),
        present_total,
        "keys that were never written appeared"
    );
    // The recovered store accepts new writes, durably.
    let extra = batch(seed, 9999);
    store.put_batch(&extra).expect("put after recovery");
    store.flush().expect("flush after recovery");
    drop(store);
    let store = SegmentStore::open(dir, writer_opts()).expect("reopen");
    let (_, missing) = store.get_batch(&[key(9999, 0).as_str()]).expect("get");
    assert!(missing.is_empty());
}

#[test]
fn sigkill_loop() {
    crash_loop("child_writer", "long", 50, |dir, seed, out| {
        check_dir(dir, seed, &out.committed, 400)
    });
}

#[test]
fn every_io_failure_point_eio() {
    sweep(
        "segment-store",
        "child_writer",
        "short",
        7,
        Fault::Eio,
        |dir, out| check_dir(dir, 7, &out.committed, 4),
    );
}

#[test]
fn every_io_failure_point_disk_full() {
    sweep(
        "segment-store",
        "child_writer",
        "short",
        8,
        Fault::DiskFull,
        |dir, out| check_dir(dir, 8, &out.committed, 4),
    );
}

/// Readers in another process than the writer: every read-only open while
/// the child appends sees whole batches with exact values, never a torn one.
#[test]
fn readers_in_another_process_see_whole_batches() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let mut opens = 0;
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            test_support::crash::child("child_writer", "long", &dir, 3)
                .kill_after(std::time::Duration::from_millis(600))
                .run()
        });
        while !writer.is_finished() {
            let opts = Options {
                read_only: true,
                lru_bytes: 0,
                ..Options::default()
            };
            // Before the writer created the directory there is nothing to read.
            let Ok(store) = SegmentStore::open(&dir, opts) else {
                continue;
            };
            opens += 1;
            let mut present_total = 0;
            for b in 0..400 {
                let keys: Vec<String> = (0..ROWS).map(|j| key(b, j)).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let (values, missing) = store.get_batch(&refs).expect("read-only get_batch");
                let present = ROWS - missing.len();
                assert!(present == 0 || present == ROWS, "reader saw batch {b} torn");
                for (j, v) in values.iter().enumerate().filter(|(_, v)| v.is_some()) {
                    let t = v
                        .as_ref()
                        .and_then(Value::as_tensor)
                        .expect("tensor")
                        .to_tensor();
                    assert_eq!(t.as_slice::<f32>().unwrap(), &value(3, b, j)[..]);
                }
                present_total += present;
            }
            assert_eq!(store.len(), present_total);
        }
        writer.join().unwrap();
    });
    assert!(opens > 0, "no reader ran while the writer wrote");
}

/// Two writer processes racing for one directory: one gets the lock, the
/// other a clean `Locked` error; the winner's commits are intact.
#[test]
fn two_writer_processes_race_for_the_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = std::thread::scope(|s| {
        let run = || {
            test_support::crash::child("child_writer", "long", &dir, 5)
                .kill_after(std::time::Duration::from_millis(400))
                .run()
        };
        let a = s.spawn(run);
        let b = s.spawn(run);
        (a.join().unwrap(), b.join().unwrap())
    });
    let locked = |o: &test_support::crash::Outcome| o.errors.iter().any(|e| e.contains("lock"));
    assert!(
        locked(&a) || locked(&b),
        "neither writer was refused: {:?} / {:?}",
        a.errors,
        b.errors
    );
    let winner = if locked(&a) { &b } else { &a };
    let loser = if locked(&a) { &a } else { &b };
    assert!(
        loser.committed.is_empty(),
        "the refused writer committed {:?}",
        loser.committed
    );
    check_dir(&dir, 5, &winner.committed, 400);
}
