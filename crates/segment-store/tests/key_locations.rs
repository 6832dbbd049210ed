//! `SegmentStore::key_locations`: torchcachex's `{key: (segment, row)}`
//! index, answered from the store's own index.

use segment_store::{Options, SegmentStore};
use tensor_core::{Tensor, Value};

fn opts() -> Options {
    Options {
        flush_every: 4,
        lru_bytes: 0,
        async_write: false,
        ..Options::default()
    }
}

fn rec(i: usize) -> Value {
    Value::from(Tensor::from_vec([2], vec![i as f32, 0.5]).unwrap())
}

fn put(store: &SegmentStore, keys: impl IntoIterator<Item = usize>) {
    let items: Vec<(String, Value)> = keys
        .into_iter()
        .map(|i| (format!("k{i}"), rec(i)))
        .collect();
    store.put_batch(&items).unwrap();
}

#[test]
fn every_flushed_key_with_its_segment_and_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(tmp.path(), opts()).unwrap();
    assert!(store.key_locations().unwrap().is_empty());
    put(&store, 0..2);
    // Pending values are not listed until a flush writes them.
    assert!(store.key_locations().unwrap().is_empty());
    store.flush().unwrap();
    assert_eq!(
        store.key_locations().unwrap(),
        [("k0".to_owned(), 0, 0), ("k1".to_owned(), 0, 1)]
    );
    put(&store, 2..10);
    store.flush().unwrap();
    // By segment and row: k2..k5 in segment 1, k6..k9 in segment 2.
    let want: Vec<(String, u32, u32)> = (0..10)
        .map(|i: usize| {
            let (seg, row) = if i < 2 {
                (0, i)
            } else {
                (1 + (i - 2) / 4, (i - 2) % 4)
            };
            (format!("k{i}"), seg as u32, row as u32)
        })
        .collect();
    assert_eq!(store.key_locations().unwrap(), want);
}

#[test]
fn a_key_written_again_is_listed_once_at_its_newest_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(tmp.path(), opts()).unwrap();
    put(&store, 0..4);
    put(&store, [2]);
    store.flush().unwrap();
    let locs = store.key_locations().unwrap();
    assert_eq!(locs.len(), 4);
    assert!(locs.contains(&("k2".to_owned(), 1, 0)));
    assert!(!locs.contains(&("k2".to_owned(), 0, 2)));
    // A reopened reader sees the same index.
    drop(store);
    let reader = SegmentStore::open(
        tmp.path(),
        Options {
            current_rank: 1,
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(reader.key_locations().unwrap(), locs);
}
