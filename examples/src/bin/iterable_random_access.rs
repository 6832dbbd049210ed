//! `iterable_random_access`: random access to the items of a slow,
//! deterministic iterator with shard-store — loadit's job, in loadit's
//! on-disk format.
//!
//! Run: `cargo run -p examples --bin iterable_random_access -- [DIR]`
//!
//! The first touch shards the iterator to disk
//! (`shards/<start>.<end>.shard.pickle`); every later access, in this
//! process or another (or in Python with `loadit.LoadIt(root)`), reads the
//! shard instead. A disk budget evicts shards and regenerates them from the
//! source on demand, so the source must yield the same items every time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};
use shard_store::{
    Bytes, Concat, Interleave, Options, RandomAccess, Repeat, SequenceView, ShardStore,
    chunk_shuffle,
};

/// One record of the "expensive" iterator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    id: u64,
    label: String,
    /// Pickled as Python `bytes`.
    payload: Bytes,
}

fn record(id: u64) -> Record {
    Record {
        id,
        label: format!("item-{id}"),
        payload: Bytes((0..32).map(|k| (id as u8).wrapping_mul(k)).collect()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let root = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf())
        .join("records");
    let produced = Arc::new(AtomicUsize::new(0));
    let counter = produced.clone();
    let source = move || {
        let counter = counter.clone();
        (0..10_000u64).map(move |i| {
            counter.fetch_add(1, Ordering::Relaxed);
            record(i)
        })
    };

    let store = ShardStore::open_with_source(&root, Options::default().shard_items(1000), source)?;
    assert_eq!(store.get(4321)?.label, "item-4321");
    assert_eq!(store.get(-1)?.id, 9_999); // negative: from the end (drives the source)
    println!(
        "len {} after producing {} items",
        store.len()?,
        produced.load(Ordering::Relaxed)
    );
    let before = produced.load(Ordering::Relaxed);
    let many = store.get_many(&[5, 7000, 123, 9998])?;
    assert_eq!(
        many.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![5, 7000, 123, 9998]
    );
    assert_eq!(
        produced.load(Ordering::Relaxed),
        before,
        "cached reads run no source"
    );
    store.wait_until_all_cached()?;
    println!("all shards on disk: {}", store.all_cached_to_disk()?);

    // A second handle with no source reads the cache alone.
    let cached: ShardStore<Record> = ShardStore::open(&root, Options::default())?;
    assert_eq!(cached.get(2024)?.payload.0, record(2024).payload.0);

    // Lazy sequence utilities over anything with a length and random access.
    let evens = SequenceView::new(&cached, (0..10_000).step_by(2).collect::<Vec<_>>());
    let both = Concat::new(vec![
        SequenceView::new(&cached, vec![0, 1, 2]),
        SequenceView::new(&cached, vec![9_999]),
    ]);
    let mixed = Interleave::new(vec![
        SequenceView::new(&cached, vec![0, 2, 4]),
        SequenceView::new(&cached, vec![1, 3, 5]),
    ])?;
    let shuffled = chunk_shuffle(&cached, Some(100), None, 7)?;
    let epochs = Repeat::new(&shuffled, 3);
    println!(
        "views: evens {} (evens[10] = {}), concat {}, interleaved {:?}, 3 shuffled epochs {}",
        evens.length()?,
        evens.at(10)?.id,
        both.length()?,
        (0..6)
            .map(|k| mixed.at(k).map(|r| r.id))
            .collect::<Result<Vec<_>, _>>()?,
        epochs.length()?
    );
    assert_eq!(evens.at(10)?.id, 20);

    // A disk budget of a quarter of the cache: shards are evicted and
    // regenerated, and the answers stay right.
    let small_root = root.with_file_name("budget");
    let small = ShardStore::open_with_source(
        &small_root,
        Options {
            memory_limit: Some(120_000),
            ..Options::default().shard_items(1000)
        },
        || (0..10_000u64).map(record),
    )?;
    let sample: Vec<i64> = (0..10_000).step_by(997).collect();
    for &i in &sample {
        assert_eq!(*small.get(i)?, record(i as u64));
    }
    println!("under a disk budget: {} random reads checked", sample.len());
    println!(
        "\nread it from Python:  loadit.LoadIt(root={:?})[4321]",
        root.display().to_string()
    );
    Ok(())
}
