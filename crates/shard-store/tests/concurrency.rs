//! Several threads and several processes reading and filling one root.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use shard_store::{Bytes, Options, ShardStore, chunk_shuffle_indices, inspect, verify};

const N: u64 = 600;
const SHARD: u64 = 16;
const CHILD_ENV: &str = "SHARD_STORE_TEST_CHILD_ROOT";

fn item(i: u64) -> (u64, Bytes) {
    (i, Bytes(vec![(i % 251) as u8; (i % 23) as usize]))
}

fn open(root: &Path, opts: Options) -> ShardStore<(u64, Bytes)> {
    ShardStore::open_with_source(root, opts, || (0..N).map(item)).unwrap()
}

/// Reads every item in a seed-dependent order and checks it.
fn read_all(store: &ShardStore<(u64, Bytes)>, seed: u64) {
    read_some(store, seed, N as usize);
}

/// Reads `count` items in a seed-dependent order and checks them.
fn read_some(store: &ShardStore<(u64, Bytes)>, seed: u64, count: usize) {
    for i in chunk_shuffle_indices(N as usize, N as usize, seed)
        .into_iter()
        .take(count)
    {
        let got = store.get(i as i64).unwrap();
        assert_eq!(*got, item(i as u64), "item {i}");
    }
}

fn assert_consistent(root: &Path) {
    assert!(verify(root).is_empty(), "{:?}", verify(root));
    let s = inspect(root).unwrap();
    assert_eq!(s.length, Some(N));
    assert!(s.complete);
    assert_eq!(s.scratch_files, 0);
    assert_eq!(s.shards as u64, N.div_ceil(SHARD));
}

#[test]
fn threads_sharing_one_handle() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(
        tmp.path(),
        Options {
            max_workers: 3,
            max_cache_size: 4,
            ..Options::default().shard_items(SHARD)
        },
    );
    std::thread::scope(|s| {
        for t in 0..6 {
            let store = store.clone();
            s.spawn(move || read_all(&store, t));
        }
    });
    assert_eq!(store.len().unwrap(), N);
    drop(store);
    assert_consistent(tmp.path());
}

#[test]
fn threads_with_their_own_handles() {
    let tmp = tempfile::tempdir().unwrap();
    let root = Arc::new(tmp.path().to_path_buf());
    std::thread::scope(|s| {
        for t in 0..6 {
            let root = Arc::clone(&root);
            s.spawn(move || {
                let store = open(
                    &root,
                    Options {
                        max_cache_size: 2,
                        ..Options::default().shard_items(SHARD)
                    },
                );
                read_all(&store, 100 + t);
            });
        }
    });
    assert_consistent(tmp.path());
}

#[test]
fn threads_under_a_disk_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let store = open(
        tmp.path(),
        Options {
            memory_limit: Some(4_000),
            max_cache_size: 2,
            max_workers: 2,
            ..Options::default().shard_items(SHARD)
        },
    );
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = store.clone();
            s.spawn(move || read_some(&store, 200 + t, 120));
        }
    });
    // Dropping the last handle joins the preload workers.
    drop(store);
    let problems = verify(tmp.path());
    assert!(problems.is_empty(), "{problems:?}");
}

/// In the parent: spawns this very test three times as child processes
/// (with `CHILD_ENV` naming the root) while reading the root itself.
/// In a child: reads every item of the root and exits.
#[test]
fn processes_fill_one_root() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        let seed: u64 = std::env::var("SHARD_STORE_TEST_SEED")
            .unwrap()
            .parse()
            .unwrap();
        let store = open(
            Path::new(&root),
            Options {
                max_cache_size: 3,
                ..Options::default().shard_items(SHARD)
            },
        );
        read_all(&store, seed);
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|k| {
            Command::new(&exe)
                .args([
                    "processes_fill_one_root",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, tmp.path())
                .env("SHARD_STORE_TEST_SEED", (300 + k).to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let store = open(
        tmp.path(),
        Options {
            max_cache_size: 3,
            ..Options::default().shard_items(SHARD)
        },
    );
    read_all(&store, 299);
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }
    assert_consistent(tmp.path());
}

#[test]
fn a_shard_is_generated_once_across_threads() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(std::sync::Barrier::new(8));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (calls, barrier, root) = (Arc::clone(&calls), Arc::clone(&barrier), tmp.path());
            s.spawn(move || {
                let store = ShardStore::open_with_source(
                    root,
                    Options::default().shard_items(SHARD),
                    move || {
                        calls.fetch_add(1, Ordering::SeqCst);
                        (0..N).map(item)
                    },
                )
                .unwrap();
                barrier.wait();
                assert_eq!(*store.get(5).unwrap(), item(5));
            });
        }
    });
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the source was started more than once"
    );
}

const ONCE_ENV: &str = "SHARD_STORE_TEST_ONCE_ROOT";

/// Opens `root` with a source that logs each start to `calls.log` beside
/// it, waits for the `go` file, and reads item 5.
fn once_role(root: &Path) {
    let log = root.with_extension("calls.log");
    let store =
        ShardStore::open_with_source(root, Options::default().shard_items(SHARD), move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            f.write_all(b"start\n").unwrap();
            (0..N).map(item)
        })
        .unwrap();
    let go = root.with_extension("go");
    while !go.exists() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(*store.get(5).unwrap(), item(5));
}

/// Parent: three child processes (this test, with `ONCE_ENV` set) and the
/// parent itself ask for the same missing shard at once; the source must
/// be started once in all.
#[test]
fn a_shard_is_generated_once_across_processes() {
    if let Some(root) = std::env::var_os(ONCE_ENV) {
        once_role(Path::new(&root));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    // Create the root first so that no process needs the source to open it.
    drop(open(&root, Options::default().shard_items(SHARD)));
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "a_shard_is_generated_once_across_processes",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ONCE_ENV, &root)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(root.with_extension("go"), b"").unwrap();
    once_role(&root);
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "child failed: {status}");
    }
    let log = std::fs::read_to_string(root.with_extension("calls.log")).unwrap();
    assert_eq!(
        log.lines().count(),
        1,
        "the source was started {} times",
        log.lines().count()
    );
}
