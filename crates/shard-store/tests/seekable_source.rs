//! Seekable sources (`open_with_seekable_source`): the same answers as a
//! plain source, and a regenerated shard costs that shard, not a prefix.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use proptest::prelude::*;
use shard_store::{Bytes, Error, Options, ShardStore, chunk_shuffle_indices, inspect, verify};

fn item(i: u64) -> (u64, Bytes) {
    (
        i,
        Bytes((0..(i % 19)).map(|j| (i * 37 + j) as u8).collect()),
    )
}

/// What a seekable source was asked for and how much it yielded.
#[derive(Default)]
struct Pulls {
    starts: Mutex<Vec<u64>>,
    items: AtomicU64,
}

/// Opens `root` over items `0..n`, seekable, counting into `pulls`.
fn open_counted(
    root: &Path,
    n: u64,
    opts: Options,
    pulls: &Arc<Pulls>,
) -> ShardStore<(u64, Bytes)> {
    let pulls = Arc::clone(pulls);
    ShardStore::open_with_seekable_source(root, opts, move |start| {
        pulls.starts.lock().push(start);
        let pulls = Arc::clone(&pulls);
        (start..n).map(move |i| {
            pulls.items.fetch_add(1, Ordering::Relaxed);
            item(i)
        })
    })
    .unwrap()
}

/// Bytes on disk of the whole cache of `n` items in shards of `shard`.
fn full_cache_bytes(n: u64, shard: u64) -> u64 {
    let tmp = tempfile::tempdir().unwrap();
    let store = open_counted(
        tmp.path(),
        n,
        Options::default().shard_items(shard),
        &Arc::default(),
    );
    store.len().unwrap();
    inspect(tmp.path()).unwrap().bytes_on_disk
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_access_matches_vec(
        n in 0u64..300,
        shard in 1u64..40,
        reads in proptest::collection::vec(any::<u32>(), 0..60),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let pulls = Arc::new(Pulls::default());
        let store = open_counted(tmp.path(), n, Options::default().shard_items(shard), &pulls);
        for r in reads {
            // Indices a little past the end too: those are out of range.
            let i = r as u64 % (n + 5);
            match store.get(i as i64) {
                Ok(got) => prop_assert_eq!(&*got, &item(i)),
                Err(Error::IndexOutOfRange { .. }) => prop_assert!(i >= n),
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
        }
        prop_assert_eq!(store.len().unwrap(), n);
        let all: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(all, (0..n).map(item).collect::<Vec<_>>());
        for &s in pulls.starts.lock().iter() {
            prop_assert!(s <= n && s % shard == 0, "seek to {} (n {}, shard {})", s, n, shard);
        }
        let problems = verify(tmp.path());
        prop_assert!(problems.is_empty(), "{:?}", problems);
    }
}

#[test]
fn an_evicted_shard_is_regenerated_alone() {
    let (n, shard) = (400u64, 20u64);
    let full = full_cache_bytes(n, shard);
    let budget = full / 4;
    let tmp = tempfile::tempdir().unwrap();
    let pulls = Arc::new(Pulls::default());
    let store = open_counted(
        tmp.path(),
        n,
        Options {
            memory_limit: Some(budget),
            max_cache_size: 1,
            ..Options::default().shard_items(shard)
        },
        &pulls,
    );
    assert_eq!(store.len().unwrap(), n);
    let mut x = 12345u64;
    let mut regenerated = 0;
    for _ in 0..300 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (x >> 33) % n;
        let before = pulls.items.load(Ordering::Relaxed);
        assert_eq!(*store.get(i as i64).unwrap(), item(i));
        let pulled = pulls.items.load(Ordering::Relaxed) - before;
        // A miss replays its own shard and nothing before it.
        assert!(pulled == 0 || pulled == shard, "get({i}) pulled {pulled}");
        regenerated += usize::from(pulled > 0);
        let on_disk = inspect(tmp.path()).unwrap().bytes_on_disk;
        assert!(
            on_disk <= budget + full / 10,
            "{on_disk} bytes on disk, budget {budget}"
        );
    }
    assert!(regenerated > 100, "only {regenerated} regenerations");
    let seq: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(seq, (0..n).map(item).collect::<Vec<_>>());
    assert!(verify(tmp.path()).is_empty());
}

#[test]
fn get_many_under_a_budget_is_right() {
    let (n, shard) = (500u64, 25u64);
    let budget = full_cache_bytes(n, shard) / 4;
    let tmp = tempfile::tempdir().unwrap();
    let pulls = Arc::new(Pulls::default());
    let store = open_counted(
        tmp.path(),
        n,
        Options {
            memory_limit: Some(budget),
            max_cache_size: 2,
            ..Options::default().shard_items(shard)
        },
        &pulls,
    );
    let ask: Vec<i64> = chunk_shuffle_indices(n as usize, n as usize, 9)
        .into_iter()
        .map(|i| i as i64)
        .chain([-1, -(n as i64)])
        .collect();
    let got = store.get_many(&ask).unwrap();
    for (k, &i) in ask.iter().enumerate() {
        let i = if i < 0 { n as i64 + i } else { i } as u64;
        assert_eq!(got[k], item(i), "index {i}");
    }
}

#[test]
fn threads_under_a_disk_budget_get_every_answer_right() {
    let (n, shard) = (600u64, 16u64);
    let budget = full_cache_bytes(n, shard) / 4;
    let tmp = tempfile::tempdir().unwrap();
    let pulls = Arc::new(Pulls::default());
    let store = open_counted(
        tmp.path(),
        n,
        Options {
            memory_limit: Some(budget),
            max_cache_size: 2,
            max_workers: 3,
            ..Options::default().shard_items(shard)
        },
        &pulls,
    );
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = store.clone();
            s.spawn(move || {
                for i in chunk_shuffle_indices(n as usize, n as usize, 300 + t)
                    .into_iter()
                    .take(200)
                {
                    assert_eq!(*store.get(i as i64).unwrap(), item(i as u64), "item {i}");
                }
            });
        }
    });
    drop(store);
    let problems = verify(tmp.path());
    assert!(problems.is_empty(), "{problems:?}");
    for &s in pulls.starts.lock().iter() {
        assert!(s <= n && s % shard == 0, "seek to {s}");
    }
}

#[test]
fn threads_with_their_own_handles_fill_one_root() {
    let (n, shard) = (600u64, 16u64);
    let tmp = tempfile::tempdir().unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let root = tmp.path();
            s.spawn(move || {
                let store = open_counted(
                    root,
                    n,
                    Options::default().shard_items(shard),
                    &Arc::default(),
                );
                for i in chunk_shuffle_indices(n as usize, n as usize, t) {
                    assert_eq!(*store.get(i as i64).unwrap(), item(i as u64), "item {i}");
                }
            });
        }
    });
    let summary = inspect(tmp.path()).unwrap();
    assert_eq!(summary.length, Some(n));
    assert!(summary.complete);
    assert_eq!(summary.scratch_files, 0);
    assert!(verify(tmp.path()).is_empty());
}

#[test]
fn the_length_is_found_by_a_seek_to_the_end_of_the_shards_on_disk() {
    // 40 items in shards of 10: the last shard is full, so reading item 35
    // leaves the length unknown (the source has not ended yet).
    let tmp = tempfile::tempdir().unwrap();
    let opts = Options::default().shard_items(10);
    let first = open_counted(tmp.path(), 40, opts.clone(), &Arc::default());
    assert_eq!(*first.get(35).unwrap(), item(35));
    assert_eq!(first.known_len(), None);
    drop(first);
    let pulls = Arc::new(Pulls::default());
    let second = open_counted(tmp.path(), 40, opts, &pulls);
    assert!(matches!(second.get(40), Err(Error::IndexOutOfRange { .. })));
    assert_eq!(second.known_len(), Some(40));
    assert_eq!(*pulls.starts.lock(), vec![40], "one seek, to the end");
    assert_eq!(pulls.items.load(Ordering::Relaxed), 0);
    assert!(inspect(tmp.path()).unwrap().complete);
}

#[test]
fn a_seekable_source_that_ends_early_is_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let opts = Options::default().shard_items(10);
    let store = open_counted(tmp.path(), 100, opts.clone(), &Arc::default());
    assert_eq!(store.len().unwrap(), 100);
    drop(store);
    std::fs::remove_file(tmp.path().join("shards/60.70.shard.pickle")).unwrap();
    let short = open_counted(tmp.path(), 50, opts, &Arc::default());
    assert!(matches!(
        short.get(65),
        Err(Error::NondeterministicSource { .. })
    ));
}
