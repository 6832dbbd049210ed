//! What a store reports about itself (`shard_files`, `disk_bytes`,
//! `cached_shards`, `counters`, `cursors`, `preload`) and `finalize`:
//! the scenarios of loadit's own tests for the internals its users read.

use std::time::{Duration, Instant};

use shard_store::{Counters, CursorState, Options, Preload, ShardStore};

fn opts(shard: u64) -> Options {
    Options::default().shard_items(shard)
}

#[test]
fn shard_files_and_disk_bytes_describe_what_is_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Options {
        memory_limit: Some(1 << 30), // passed shards stay unwritten
        ..opts(10)
    };
    let store = ShardStore::open_with_source(tmp.path(), o, || 0..95u64).unwrap();
    assert!(store.shard_files().unwrap().is_empty());
    assert_eq!(store.disk_bytes().unwrap(), 0);
    for i in [42, 3, 94] {
        store.get(i).unwrap();
    }
    let files = store.shard_files().unwrap();
    let spans: Vec<_> = files.iter().map(|f| (f.name.start, f.name.end)).collect();
    assert_eq!(spans, [(0, 10), (40, 50), (90, 95)]);
    for f in &files {
        assert_eq!(
            f.path,
            tmp.path()
                .join("shards")
                .join(format!("{}.{}.shard.pickle", f.name.start, f.name.end))
        );
        assert_eq!(f.bytes, std::fs::metadata(&f.path).unwrap().len());
    }
    assert_eq!(
        store.disk_bytes().unwrap(),
        files.iter().map(|f| f.bytes).sum::<u64>()
    );
}

#[test]
fn the_memory_cache_is_bounded_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Options {
        max_cache_size: 3,
        ..opts(10)
    };
    let store = ShardStore::open_with_source(tmp.path(), o, || 0..100u64).unwrap();
    assert_eq!(store.cached_shards(), 0);
    for k in 0..6u64 {
        store.get((k * 10) as i64).unwrap();
        assert_eq!(store.cached_shards(), (k as usize + 1).min(3));
        assert!(store.is_cached(k * 10));
    }
    assert!(!store.is_cached(0) && store.is_cached(50));
}

/// loadit's `test_caching`: 21 shards read, a memory cache of 10, a disk
/// budget of 20 shards; then read again in reverse.
#[test]
fn miss_counters_follow_loadit_s_caching_test() {
    let tmp = tempfile::tempdir().unwrap();
    let item = |i: u64| format!("item-{i:06}");
    let probe = ShardStore::open_with_source(tmp.path().join("probe"), opts(16), move || {
        (0..16u64).map(item)
    })
    .unwrap();
    probe.get(0).unwrap();
    let shard_bytes = probe.disk_bytes().unwrap();
    let o = Options {
        max_cache_size: 10,
        max_workers: 5,
        memory_limit: Some(shard_bytes * 20 + shard_bytes / 2),
        preload: Some(Preload::None),
        ..opts(16)
    };
    let store =
        ShardStore::open_with_source(tmp.path().join("r"), o, move || (0..1600u64).map(item))
            .unwrap();
    let starts: Vec<i64> = (0..21).map(|k| k * 16).collect();
    for &s in &starts {
        store.get(s).unwrap();
    }
    let want = |memory_misses, disk_misses| Counters {
        memory_misses,
        disk_misses,
    };
    assert_eq!(store.counters(), want(21, 21));
    for &s in starts.iter().rev() {
        store.get(s).unwrap();
    }
    // The 10 newest were in memory; of the other 11 only shard 0 had left the disk.
    assert_eq!(store.counters(), want(32, 22));
    assert!(store.disk_bytes().unwrap() <= shard_bytes * 20 + shard_bytes / 2);
}

/// loadit's `test_uses_multiple_writers`: a read behind the first replay
/// of the source starts a second one.
#[test]
fn cursors_show_how_far_each_replay_got() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Options {
        max_workers: 5,
        memory_limit: Some(1 << 30),
        preload: Some(Preload::None),
        ..opts(16)
    };
    let store = ShardStore::open_with_source(tmp.path(), o, || 0..1600u64).unwrap();
    assert_eq!(store.cursors(), vec![None; 5]);
    store.get(11 * 16).unwrap();
    let at = |pos| Some(CursorState { pos, done: false });
    assert_eq!(store.cursors()[..2], [at(12 * 16), None]);
    store.get(16).unwrap();
    assert_eq!(store.cursors()[..2], [at(12 * 16), at(2 * 16)]);
    store.get(-1).unwrap();
    assert!(store.cursors().contains(&Some(CursorState {
        pos: 1600,
        done: true
    })));
}

#[test]
fn set_preload_changes_what_the_workers_load_ahead() {
    let tmp = tempfile::tempdir().unwrap();
    let o = Options {
        max_workers: 4,
        ..opts(10)
    };
    let store = ShardStore::open_with_source(tmp.path(), o, || 0..1000u64).unwrap();
    assert_eq!(store.preload(), Preload::NextShards(2));
    store.set_preload(Preload::NextShards(3));
    store.get(0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(1..=3).all(|k| store.is_cached(k * 10)) {
        assert!(Instant::now() < deadline, "the preload never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    store.set_preload(Preload::None);
    assert_eq!(store.preload(), Preload::None);
    let before = store.counters().memory_misses;
    for k in 50..55 {
        store.get(k * 10).unwrap();
    }
    assert_eq!(store.counters().memory_misses, before + 5);
    assert!(!store.is_cached(550));
}

/// loadit's `test_set_length_from_shards`: the shards on disk become the
/// whole length.
#[test]
fn finalize_makes_the_shards_on_disk_the_length() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), opts(16), || 0..1600u64).unwrap();
    store.get(20).unwrap();
    assert_eq!(store.known_len(), None);
    assert_eq!(store.finalize().unwrap(), 32);
    assert_eq!(store.known_len(), Some(32));
    let reader: ShardStore<u64> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(reader.len().unwrap(), 32);
    assert!(tmp.path().join("completed").exists());
    // A final length is kept.
    assert_eq!(store.finalize().unwrap(), 32);
}

#[test]
fn finalize_keeps_the_length_the_source_gave() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), opts(16), || 0..50u64).unwrap();
    assert_eq!(store.len().unwrap(), 50);
    assert_eq!(store.finalize().unwrap(), 50);
}

/// The last handle may be dropped on one of the store's own worker threads
/// (in Python, a garbage collection running there): that drop must not
/// panic joining the thread itself.
#[test]
fn the_last_handle_dropped_by_a_worker_does_not_panic() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let tmp = tempfile::tempdir().unwrap();
    let slot: Arc<Mutex<Option<ShardStore<u64>>>> = Arc::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let (taken, done) = (Arc::clone(&slot), Arc::clone(&dropped));
    let o = Options {
        max_workers: 2,
        ..opts(10)
    };
    // The source, run by the worker, drops the store's only handle.
    let store = ShardStore::open_with_source(tmp.path(), o, move || {
        let last = taken.lock().unwrap().take();
        if last.is_some() {
            drop(last);
            done.store(true, Ordering::SeqCst);
        }
        0..100u64
    })
    .unwrap();
    *slot.lock().unwrap() = Some(store);
    if let Some(store) = slot.lock().unwrap().as_ref() {
        store.load_async(&[50]);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the drop on the worker never returned"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(slot.lock().unwrap().is_none());
}
