//! Sequence utilities against plain `Vec` models.

use proptest::prelude::*;
use shard_store::{
    Concat, Error, Interleave, Options, RandomAccess, Repeat, SequenceView, ShardStore,
    block_shuffle_indices, chunk_shuffle, chunk_shuffle_indices,
};

fn collect<S: RandomAccess>(s: &S) -> Vec<S::Item> {
    (0..s.length().unwrap()).map(|i| s.at(i).unwrap()).collect()
}

/// loadit's interleave order, written the obvious way: round robin over
/// the parts that still have items.
fn interleave_model(parts: &[Vec<u32>]) -> Vec<u32> {
    let mut out = Vec::new();
    let longest = parts.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..longest {
        for p in parts {
            if let Some(x) = p.get(k) {
                out.push(*x);
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn views_match_index_lists(data in proptest::collection::vec(any::<u32>(), 1..50), picks in proptest::collection::vec(any::<prop::sample::Index>(), 0..40), picks2 in proptest::collection::vec(any::<prop::sample::Index>(), 1..20)) {
        let idx: Vec<usize> = picks.iter().map(|p| p.index(data.len())).collect();
        let view = SequenceView::new(data.clone(), idx.clone());
        let want: Vec<u32> = idx.iter().map(|&i| data[i]).collect();
        prop_assert_eq!(collect(&view), want.clone());
        if !want.is_empty() {
            let idx2: Vec<usize> = picks2.iter().map(|p| p.index(want.len())).collect();
            let vv = view.view(idx2.clone());
            prop_assert_eq!(collect(&vv), idx2.iter().map(|&i| want[i]).collect::<Vec<_>>());
        }
        let past = matches!(SequenceView::new(data.clone(), idx.clone()).at(idx.len()), Err(Error::IndexOutOfRange { .. }));
        prop_assert!(past);
    }

    #[test]
    fn slices_match_python_slicing(data in proptest::collection::vec(any::<u8>(), 0..40), a in 0usize..45, b in 0usize..45, step in 1usize..5) {
        let v = SequenceView::slice(data.clone(), a..b, step).unwrap();
        let want: Vec<u8> = data.iter().copied().enumerate().filter(|(i, _)| *i >= a && *i < b && (i - a) % step == 0).map(|(_, x)| x).collect();
        prop_assert_eq!(collect(&v), want);
    }

    #[test]
    fn concat_matches_vec_concat(parts in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..10), 0..5)) {
        let c = Concat::new(parts.clone());
        let want: Vec<u32> = parts.concat();
        prop_assert_eq!(c.length().unwrap(), want.len());
        // Item access before any length is known.
        let fresh = Concat::new(parts.clone());
        for (i, w) in want.iter().enumerate() {
            prop_assert_eq!(fresh.at(i).unwrap(), *w);
        }
        prop_assert!(fresh.at(want.len()).is_err());
    }

    #[test]
    fn interleave_is_round_robin(parts in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..10), 0..5)) {
        let il = Interleave::new(parts.clone()).unwrap();
        prop_assert_eq!(collect(&il), interleave_model(&parts));
    }

    #[test]
    fn repeat_matches_cycle(data in proptest::collection::vec(any::<u16>(), 1..10), times in 0usize..4) {
        let r = Repeat::new(data.clone(), times);
        let want: Vec<u16> = data.iter().copied().cycle().take(data.len() * times).collect();
        prop_assert_eq!(collect(&r), want);
        let f = Repeat::forever(data.clone());
        prop_assert_eq!(f.at(1000 * data.len() + 1).unwrap(), data[1 % data.len()]);
        prop_assert!(matches!(f.length(), Err(Error::Unbounded)));
    }

    #[test]
    fn chunk_shuffle_permutes_within_chunks(len in 0usize..200, chunk in 1usize..50, seed in any::<u64>()) {
        let p = chunk_shuffle_indices(chunk, len, seed);
        prop_assert_eq!(p.len(), len);
        for (i, &j) in p.iter().enumerate() {
            prop_assert_eq!(i / chunk, j / chunk, "index {} left its chunk", j);
        }
        let mut sorted = p.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..len).collect::<Vec<_>>());
        prop_assert_eq!(chunk_shuffle_indices(chunk, len, seed), p, "deterministic");
    }

    #[test]
    fn block_shuffle_keeps_each_block_together(blocks in proptest::collection::vec(0usize..40, 0..30), seed in any::<u64>()) {
        let p = block_shuffle_indices(&blocks, seed);
        let total: usize = blocks.iter().sum();
        prop_assert_eq!(p.len(), total);
        let mut sorted = p.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..total).collect::<Vec<_>>(), "every index once");
        // The block of each index; the output visits each block in one run.
        let block_of: Vec<usize> = blocks
            .iter()
            .enumerate()
            .flat_map(|(b, &n)| std::iter::repeat_n(b, n))
            .collect();
        let runs = p.windows(2).filter(|w| block_of[w[0]] != block_of[w[1]]).count();
        let non_empty = blocks.iter().filter(|&&n| n > 0).count();
        prop_assert_eq!(runs + usize::from(total > 0), non_empty, "one run per block");
        prop_assert_eq!(block_shuffle_indices(&blocks, seed), p, "deterministic");
    }
}

#[test]
fn block_shuffle_moves_blocks_and_samples() {
    // 100 blocks of 100: some block leaves its place, some sample its slot.
    let p = block_shuffle_indices(&[100; 100], 7);
    let visited: Vec<usize> = p.chunks(100).map(|run| run[0] / 100).collect();
    assert_ne!(visited, (0..100).collect::<Vec<_>>());
    assert!(p.iter().enumerate().any(|(i, &j)| i % 100 != j % 100));
}

#[test]
fn negative_indices_through_the_trait() {
    let v = vec![1, 2, 3];
    assert_eq!(v.at_signed(-1).unwrap(), 3);
    assert_eq!(v.at_signed(-3).unwrap(), 1);
    assert!(matches!(
        v.at_signed(-4),
        Err(Error::IndexOutOfRange { index: -4, len: 3 })
    ));
    let s: &[i32] = &v;
    assert_eq!(RandomAccess::at(s, 1).unwrap(), 2);
}

#[test]
fn utilities_compose_over_a_store() {
    let tmp = tempfile::tempdir().unwrap();
    let store =
        ShardStore::open_with_source(tmp.path(), Options::default().shard_items(8), || 0..50u64)
            .unwrap();
    let shuffled = chunk_shuffle(&store, Some(10), None, 3).unwrap();
    let mut seen: Vec<u64> = (0..50).map(|i| *shuffled.at(i).unwrap()).collect();
    for (i, x) in seen.iter().enumerate() {
        assert_eq!(i / 10, *x as usize / 10);
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..50).collect::<Vec<_>>());
    let both = Concat::new(vec![
        SequenceView::slice(&store, 0..5, 1).unwrap(),
        SequenceView::slice(&store, 45..50, 1).unwrap(),
    ]);
    let got: Vec<u64> = (0..10).map(|i| *both.at(i).unwrap()).collect();
    assert_eq!(got, vec![0, 1, 2, 3, 4, 45, 46, 47, 48, 49]);
    let by_fn = SequenceView::from_fn(&store, 25, |i| 2 * i);
    assert_eq!(*by_fn.at(24).unwrap(), 48);
    let tail = Repeat::new(SequenceView::slice(&store, 48..50, 1).unwrap(), 2);
    assert_eq!(
        collect(&tail).iter().map(|x| **x).collect::<Vec<_>>(),
        vec![48, 49, 48, 49]
    );
}

#[test]
fn store_views_and_slices_follow_python_indexing() {
    let tmp = tempfile::tempdir().unwrap();
    let store =
        ShardStore::open_with_source(tmp.path(), Options::default().shard_items(6), || 0..20u64)
            .unwrap();
    let v = store.view(vec![19, 0, 7]);
    assert_eq!(
        collect(&v).iter().map(|x| **x).collect::<Vec<_>>(),
        vec![19, 0, 7]
    );
    let s = store.slice(-5, None, 2).unwrap();
    assert_eq!(
        collect(&s).iter().map(|x| **x).collect::<Vec<_>>(),
        vec![15, 17, 19]
    );
    let s = store.slice(2, Some(-15), 1).unwrap();
    assert_eq!(
        collect(&s).iter().map(|x| **x).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
}

/// The index arithmetic the Python binding calls places items exactly as
/// the Rust combinators do.
#[test]
fn shared_index_arithmetic_matches_the_combinators() {
    use shard_store::{ConcatStep, InterleaveIndex, concat_locate, repeat_index};
    let parts = vec![vec![0u32, 1], vec![10, 11, 12, 13], vec![20]];
    let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
    let idx = InterleaveIndex::new(&lens);
    let il = Interleave::new(parts.clone()).unwrap();
    assert_eq!(idx.len(), 7);
    for i in 0..idx.len() {
        let (p, o) = idx.locate(i).unwrap();
        assert_eq!(parts[p][o], il.at(i).unwrap());
    }
    assert_eq!(idx.locate(7), None);
    assert_eq!(collect(&il), vec![0, 10, 20, 1, 11, 12, 13]);

    assert_eq!(
        concat_locate(3, |_| None, 5),
        ConcatStep::Probe { part: 0, offset: 5 }
    );
    assert_eq!(
        concat_locate(3, |k| Some(lens[k]), 5),
        ConcatStep::At { part: 1, offset: 3 }
    );
    assert_eq!(
        concat_locate(3, |k| Some(lens[k]), 7),
        ConcatStep::OutOfRange
    );

    assert_eq!(repeat_index(7, 3, Some(3)), Some(1));
    assert_eq!(repeat_index(9, 3, Some(3)), None);
    assert_eq!(repeat_index(1 << 40, 3, None), Some((1 << 40) % 3));
    assert_eq!(repeat_index(0, 0, None), None);
}

/// The shuffle is pinned: `cachex.loadit.chunk_shuffle_idx(4, 10, 42)`
/// (crates/cachex-py/tests/test_loadit_util.py) pins the same order.
#[test]
fn chunk_shuffle_order_is_pinned_for_rust_and_python() {
    assert_eq!(
        chunk_shuffle_indices(4, 10, 42),
        vec![2, 0, 3, 1, 6, 7, 5, 4, 8, 9]
    );
}
