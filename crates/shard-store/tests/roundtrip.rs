//! Round trips of the store against a plain `Vec` model.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use shard_store::{
    Bytes, Compression, Error, Options, PickleValue, ShardLength, ShardStore, inspect, verify,
};

fn item(i: u64) -> (u64, Bytes) {
    (
        i,
        Bytes((0..(i % 17)).map(|j| (i * 31 + j) as u8).collect()),
    )
}

fn model(n: u64) -> Vec<(u64, Bytes)> {
    (0..n).map(item).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_access_matches_vec(
        n in 0u64..300,
        shard in 1u64..40,
        zstd in any::<bool>(),
        reads in proptest::collection::vec(any::<u32>(), 0..60),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let opts = Options {
            compression: if zstd { Compression::Zstd } else { Compression::None },
            max_cache_size: 3,
            ..Options::default().shard_items(shard)
        };
        let store = ShardStore::open_with_source(tmp.path(), opts.clone(), move || (0..n).map(item)).unwrap();
        let want = model(n);
        for r in &reads {
            if n == 0 {
                break;
            }
            let i = *r as u64 % n;
            prop_assert_eq!(&*store.get(i as i64).unwrap(), &want[i as usize]);
        }
        prop_assert_eq!(store.len().unwrap(), n);
        let seq: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&seq, &want);
        // Reopened without a source, from disk only.
        drop(store);
        let cached: ShardStore<(u64, Bytes)> = ShardStore::open(tmp.path(), opts).unwrap();
        prop_assert_eq!(cached.len().unwrap(), n);
        let seq: Vec<_> = cached.iter().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&seq, &want);
        prop_assert!(cached.all_cached_to_disk().unwrap());
        prop_assert!(verify(tmp.path()).is_empty());
        let past_end = matches!(cached.get(n as i64), Err(Error::IndexOutOfRange { .. }));
        prop_assert!(past_end);
    }

    #[test]
    fn get_many_matches_vec(
        n in 1u64..200,
        shard in 1u64..30,
        picks in proptest::collection::vec(any::<i32>(), 0..80),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let store = ShardStore::open_with_source(
            tmp.path(),
            Options { max_cache_size: 2, ..Options::default().shard_items(shard) },
            move || (0..n).map(item),
        ).unwrap();
        let want = model(n);
        let idx: Vec<i64> = picks.iter().map(|&p| (p as i64).rem_euclid(2 * n as i64) - n as i64).collect();
        let got = store.get_many(&idx).unwrap();
        for (k, &i) in idx.iter().enumerate() {
            let j = if i < 0 { (n as i64 + i) as usize } else { i as usize };
            prop_assert_eq!(&got[k], &want[j]);
        }
    }
}

#[test]
fn negative_indices_count_from_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), Options::default().shard_items(7), || {
        (0..50u64).map(item)
    })
    .unwrap();
    assert_eq!(store.known_len(), None);
    assert_eq!(*store.get(-1).unwrap(), item(49));
    assert_eq!(store.known_len(), Some(50));
    assert_eq!(*store.get(-50).unwrap(), item(0));
    assert!(matches!(
        store.get(-51),
        Err(Error::IndexOutOfRange {
            index: -51,
            len: 50
        })
    ));
    assert!(matches!(store.get(50), Err(Error::IndexOutOfRange { .. })));
}

#[test]
fn unknown_length_is_found_by_driving_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let store =
        ShardStore::open_with_source(tmp.path(), Options::default().shard_items(10), move || {
            c.fetch_add(1, Ordering::SeqCst);
            (0..40u64).map(item)
        })
        .unwrap();
    // A length that is a multiple of the shard length: no short last shard.
    assert_eq!(store.len().unwrap(), 40);
    let meta = inspect(tmp.path()).unwrap();
    assert_eq!(meta.length, Some(40));
    assert!(meta.complete, "len() wrote the shards it passed");
    // Reading is now from disk: the source is not called again.
    let before = calls.load(Ordering::SeqCst);
    for i in 0..40 {
        assert_eq!(*store.get(i).unwrap(), item(i as u64));
    }
    assert_eq!(calls.load(Ordering::SeqCst), before);
    // Past the end without knowing the length first.
    let tmp2 = tempfile::tempdir().unwrap();
    let store2 =
        ShardStore::open_with_source(tmp2.path(), Options::default().shard_items(10), || {
            (0..40u64).map(item)
        })
        .unwrap();
    assert!(matches!(store2.get(45), Err(Error::IndexOutOfRange { .. })));
    assert_eq!(store2.known_len(), Some(40));
    let tmp3 = tempfile::tempdir().unwrap();
    let empty =
        ShardStore::open_with_source(tmp3.path(), Options::default().shard_items(10), || {
            (0..0u64).map(item)
        })
        .unwrap();
    assert_eq!(empty.len().unwrap(), 0);
    assert!(empty.is_empty().unwrap());
}

#[test]
fn manual_length_is_used_before_the_true_one_is_known() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            length: Some(30),
            ..Options::default().shard_items(10)
        },
        || (0..30u64).map(item),
    )
    .unwrap();
    assert_eq!(store.len().unwrap(), 30);
    assert_eq!(*store.get(-30).unwrap(), item(0));
}

#[test]
fn eviction_under_a_small_budget_keeps_answers_right() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 400u64;
    // Find the size of one shard first.
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = ShardStore::open_with_source(
        probe_dir.path(),
        Options::default().shard_items(20),
        move || (0..n).map(item),
    )
    .unwrap();
    probe.len().unwrap();
    let full = inspect(probe_dir.path()).unwrap().bytes_on_disk;
    let budget = full / 4;
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            memory_limit: Some(budget),
            max_cache_size: 1,
            ..Options::default().shard_items(20)
        },
        move || (0..n).map(item),
    )
    .unwrap();
    let want = model(n);
    let mut x = 12345u64;
    for _ in 0..300 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (x >> 33) % n;
        assert_eq!(*store.get(i as i64).unwrap(), want[i as usize]);
        let on_disk = inspect(tmp.path()).unwrap().bytes_on_disk;
        // One shard may be over (the one in use is never evicted).
        assert!(
            on_disk <= budget + full / 10,
            "{on_disk} bytes on disk, budget {budget}"
        );
    }
    let seq: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(seq, want);
    assert!(!store.all_cached_to_disk().unwrap());
}

#[test]
fn info_round_trips_and_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), Options::default().shard_items(5), || {
        (0..12u64).map(item)
    })
    .unwrap();
    assert_eq!(store.info().unwrap(), serde_json::Value::Null);
    store
        .set_info(serde_json::json!({"epoch": 3, "name": "x"}))
        .unwrap();
    drop(store);
    let again: ShardStore<(u64, Bytes)> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(again.info().unwrap()["epoch"], 3);
}

#[test]
fn byte_target_estimates_the_shard_length_and_is_adopted_on_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let src = || (0..5000u64).map(|i| (i, Bytes(vec![7u8; 1000])));
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            max_shard_length: "1mb".parse().unwrap(),
            ..Options::default()
        },
        src,
    )
    .unwrap();
    let l = store.max_shard_length();
    assert!(
        (900..=1100).contains(&l),
        "estimated {l} items per MiB of ~1 KiB items"
    );
    drop(store);
    // A byte target on an existing root adopts the stored length.
    let again = ShardStore::open_with_source(tmp.path(), Options::default(), src).unwrap();
    assert_eq!(again.max_shard_length(), l);
    assert_eq!(again.get(4999).unwrap().0, 4999);
}

#[test]
fn option_mismatch_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    ShardStore::open_with_source(tmp.path(), Options::default().shard_items(8), || {
        (0..10u64).map(item)
    })
    .unwrap();
    let err = ShardStore::open_with_source(tmp.path(), Options::default().shard_items(9), || {
        (0..10u64).map(item)
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OptionMismatch {
                option: "max_shard_length",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("metadata.json"), "{err}");
    let err = ShardStore::open_with_source(
        tmp.path(),
        Options {
            compression: Compression::Zstd,
            ..Options::default().shard_items(8)
        },
        || (0..10u64).map(item),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OptionMismatch {
                option: "compression",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn shard_length_parses_counts_and_megabytes() {
    assert_eq!(
        "64mb".parse::<ShardLength>().unwrap(),
        ShardLength::Bytes(64 << 20)
    );
    assert_eq!(
        "64MB".parse::<ShardLength>().unwrap(),
        ShardLength::Bytes(64 << 20)
    );
    assert_eq!(
        "4096".parse::<ShardLength>().unwrap(),
        ShardLength::Items(4096)
    );
    assert!("0".parse::<ShardLength>().is_err());
    assert!("64gb".parse::<ShardLength>().is_err());
    assert!("-3".parse::<ShardLength>().is_err());
}

#[test]
fn background_workers_preload_and_fill_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            max_workers: 3,
            preload_all_async: true,
            ..Options::default().shard_items(16)
        },
        || (0..500u64).map(item),
    )
    .unwrap();
    store.wait_until_all_cached().unwrap();
    assert!(store.all_cached_to_disk().unwrap());
    let seq: Vec<_> = store.iter().collect::<Result<_, _>>().unwrap();
    assert_eq!(seq, model(500));
    // Preloading the next shards on access gives the same answers.
    let tmp2 = tempfile::tempdir().unwrap();
    let store2 = ShardStore::open_with_source(
        tmp2.path(),
        Options {
            max_workers: 4,
            ..Options::default().shard_items(16)
        },
        || (0..500u64).map(item),
    )
    .unwrap();
    for i in (0..500).step_by(7) {
        assert_eq!(*store2.get(i).unwrap(), item(i as u64));
    }
}

#[test]
fn generic_values_round_trip_through_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), Options::default().shard_items(4), || {
        (0..9u64).map(|i| {
            let mut m = std::collections::BTreeMap::new();
            m.insert("i".to_string(), vec![i, i + 1]);
            m
        })
    })
    .unwrap();
    store.len().unwrap();
    let reader: ShardStore<PickleValue> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    let mut want = std::collections::BTreeMap::new();
    want.insert(
        serde_pickle::HashableValue::String("i".into()),
        serde_pickle::Value::List(vec![
            serde_pickle::Value::I64(8),
            serde_pickle::Value::I64(9),
        ]),
    );
    assert_eq!(reader.get(-1).unwrap().0, serde_pickle::Value::Dict(want));
}

#[test]
fn a_zstd_root_reads_without_naming_its_options() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            compression: Compression::Zstd,
            ..Options::default().shard_items(4)
        },
        || (0..10u64).map(item),
    )
    .unwrap();
    store.len().unwrap();
    assert!(tmp.path().join("shards/0.4.shard.pickle.zstd").exists());
    let reader: ShardStore<(u64, Bytes)> =
        ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(*reader.get(9).unwrap(), item(9));
    let generic: ShardStore<PickleValue> =
        ShardStore::open(tmp.path(), Options::default()).unwrap();
    let item = generic.get(9).unwrap();
    let (serde_pickle::Value::Tuple(pair) | serde_pickle::Value::List(pair)) = &item.0 else {
        panic!("item 9 is not a pair: {:?}", item.0)
    };
    assert_eq!(pair[0], serde_pickle::Value::I64(9));
}

#[test]
fn preloading_does_not_chain_through_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            max_workers: 2,
            memory_limit: Some(1 << 30),
            ..Options::default().shard_items(10)
        },
        || (0..1000u64).map(item),
    )
    .unwrap();
    assert_eq!(*store.get(0).unwrap(), item(0));
    // Give a runaway preloader time to show itself, then join the workers.
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(store);
    let shards = inspect(tmp.path()).unwrap().shards;
    assert!(
        shards <= 2,
        "{shards} shards written after one access with one shard of preload"
    );
}

/// Regression: with a source and no background worker, waiting used to spin
/// forever because nobody filled the store.
#[test]
fn wait_until_all_cached_fills_the_store_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(tmp.path(), Options::default().shard_items(4), || {
        (0..10u32).map(|i| (i, i * 2))
    })
    .unwrap();
    store.wait_until_all_cached().unwrap();
    assert!(store.all_cached_to_disk().unwrap());
    let cached: ShardStore<(u32, u32)> = ShardStore::open(tmp.path(), Options::default()).unwrap();
    assert_eq!(cached.get(9).unwrap().1, 18);
    // A shard still in memory but gone from disk (another process's
    // eviction) is written again, not waited for forever.
    std::fs::remove_file(tmp.path().join("shards/0.4.shard.pickle")).unwrap();
    assert!(!store.all_cached_to_disk().unwrap());
    store.wait_until_all_cached().unwrap();
    assert!(store.all_cached_to_disk().unwrap());
}

#[test]
fn load_async_generates_the_shards_asked_for_in_the_background() {
    let shard_files = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("shards"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    // Without workers it does nothing (as loadit).
    let tmp = tempfile::tempdir().unwrap();
    let store =
        ShardStore::open_with_source(tmp.path(), Options::default().shard_items(16), || {
            (0..100u64).map(item)
        })
        .unwrap();
    store.load_async(&[0, 40]);
    assert!(shard_files(tmp.path()).is_empty());

    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            max_workers: 2,
            preload: Some(shard_store::Preload::None),
            ..Options::default().shard_items(16)
        },
        || (0..100u64).map(item),
    )
    .unwrap();
    store.load_async(&[40, 33, 90]);
    // The worker owes us these two shards (and writes the full shards its
    // cursor passes on the way); wait for them (bounded).
    let want = ["32.48.shard.pickle", "80.96.shard.pickle"];
    let mut waited = 0;
    while !want
        .iter()
        .all(|w| shard_files(tmp.path()).iter().any(|f| f == w))
    {
        assert!(
            waited < 2000,
            "load_async wrote {:?}",
            shard_files(tmp.path())
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        waited += 1;
    }
    assert_eq!(*store.get(45).unwrap(), item(45));
}

#[test]
fn get_cached_serves_only_shards_in_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let store = ShardStore::open_with_source(
        tmp.path(),
        Options {
            max_cache_size: 1,
            ..Options::default().shard_items(16)
        },
        || (0..40u64).map(item),
    )
    .unwrap();
    assert!(store.get_cached(3).is_none());
    assert_eq!(*store.get(3).unwrap(), item(3));
    assert_eq!(*store.get_cached(15).unwrap(), item(15));
    assert!(store.get_cached(16).is_none());
    assert_eq!(*store.get(39).unwrap(), item(39)); // evicts shard 0 from memory
    assert!(store.get_cached(3).is_none() && store.get_cached(40).is_none());
    assert_eq!(*store.get_cached(33).unwrap(), item(33));
}
