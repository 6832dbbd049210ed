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
    assert!(
        verify(root).unwrap().is_empty(),
        "{:?}",
        verify(root).unwrap()
    );
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
    let problems = verify(tmp.path()).unwrap();
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
