//! shard-store under SIGKILL and injected I/O failures: every shard a get
//! wrote survives, no partial shard is ever read, and a reopen with the
//! source completes the store.

use std::path::Path;

use reliability::{Fault, crash_loop, sweep};
use shard_store::{Options, ShardStore};
use test_support::crash::{child_args, report_commit, report_error};

const SHARD: u64 = 50;

fn item(i: u64) -> (u64, String) {
    (
        i * 3,
        format!("payload-{i}-{}", "x".repeat((i % 17) as usize)),
    )
}

fn open(dir: &Path, n: u64) -> shard_store::Result<ShardStore<(u64, String)>> {
    ShardStore::open_with_source(dir, Options::default().shard_items(SHARD), move || {
        (0..n).map(item)
    })
}

fn run_child(dir: &Path, n: u64) -> shard_store::Result<()> {
    let store = open(dir, n)?;
    for start in (0..n).step_by(SHARD as usize) {
        let got = store.get(start as i64)?;
        assert_eq!(*got, item(start));
        // Written to scratch, fsynced, renamed into shards/ before get returned.
        report_commit(&start.to_string());
    }
    Ok(())
}

#[test]
fn child_writer() {
    if let Some(args) = child_args() {
        let n = if args.role == "long" { 3_000 } else { 200 };
        if let Err(e) = run_child(&args.dir, n) {
            report_error(&e.to_string());
        }
    }
}

fn check(dir: &Path, committed: &[String], n: u64) {
    if !dir.join(shard_store::format::METADATA_FILE).exists() {
        assert!(
            committed.is_empty(),
            "commits reported but no metadata.json"
        );
        return;
    }
    // Without a source, only what is on disk can be read: every reported
    // shard must be there, whole.
    let cached: ShardStore<(u64, String)> = ShardStore::open(dir, Options::default())
        .unwrap_or_else(|e| panic!("open after crash: {e}"));
    for c in committed {
        let start: u64 = c.parse().expect("shard start");
        for i in start..(start + SHARD).min(n) {
            let got = cached
                .get(i as i64)
                .unwrap_or_else(|e| panic!("committed item {i} unreadable: {e}"));
            assert_eq!(*got, item(i), "item {i}");
        }
    }
    drop(cached);
    // With the source, the whole store completes and reads right.
    let store = open(dir, n).expect("reopen with source");
    assert_eq!(store.len().expect("len"), n);
    for i in (0..n).step_by(7) {
        assert_eq!(*store.get(i as i64).expect("get"), item(i), "item {i}");
    }
    store.wait_until_all_cached().expect("fill");
    let problems = shard_store::verify(dir);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn sigkill_loop() {
    crash_loop("child_writer", "long", 50, |dir, _, out| {
        check(dir, &out.committed, 3_000)
    });
}

#[test]
fn every_io_failure_point_eio() {
    sweep(
        "shard-store",
        "child_writer",
        "short",
        1,
        Fault::Eio,
        |dir, out| check(dir, &out.committed, 200),
    );
}

#[test]
fn every_io_failure_point_disk_full() {
    sweep(
        "shard-store",
        "child_writer",
        "short",
        2,
        Fault::DiskFull,
        |dir, out| check(dir, &out.committed, 200),
    );
}
