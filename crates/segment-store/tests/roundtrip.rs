//! Round trips: every record shape and dtype, duplicates, reopen, LRU,
//! ranks, schema drift, compaction.

use proptest::prelude::*;
use segment_store::{Error, Options, SegmentStore, Structure};
use tensor_core::Value;
use tensor_core::{DType, Tensor};

fn opts() -> Options {
    Options {
        flush_every: 7,
        ..Options::default()
    }
}

fn tensor(dtype: DType, dims: &[usize], seed: u8) -> Tensor {
    let n: usize = dims.iter().product();
    let bytes: Vec<u8> = (0..n * dtype.size())
        .map(|i| {
            if dtype == DType::Bool {
                ((i + usize::from(seed)) % 2) as u8
            } else {
                (i as u8).wrapping_mul(31).wrapping_add(seed)
            }
        })
        .collect();
    Tensor::new(dtype, dims.to_vec(), &bytes).unwrap()
}

fn same(a: &Value, b: &Value) -> bool {
    // Compare through detached copies: dtype, shape and bytes.
    a.detach() == b.detach()
}

fn arb_dtype() -> impl Strategy<Value = DType> {
    (0..DType::ALL.len()).prop_map(|i| DType::ALL[i])
}

/// A record layout (structure + dtypes + ranks) and a generator of records.
#[derive(Debug, Clone)]
struct Layout {
    structure: Structure,
    parts: Vec<Option<(DType, usize)>>, // None = blob
}

fn arb_layout() -> impl Strategy<Value = Layout> {
    let part = prop_oneof![
        3 => (arb_dtype(), 0usize..4).prop_map(Some),
        1 => Just(None),
    ];
    prop_oneof![
        (arb_dtype(), 0usize..4).prop_map(|p| Layout {
            structure: Structure::Tensor,
            parts: vec![Some(p)]
        }),
        Just(Layout {
            structure: Structure::Blob,
            parts: vec![None]
        }),
        prop::collection::vec(part.clone(), 1..4).prop_map(|parts| Layout {
            structure: Structure::Dict,
            parts
        }),
        prop::collection::vec(part.clone(), 1..4).prop_map(|parts| Layout {
            structure: Structure::Tuple,
            parts
        }),
        prop::collection::vec(part, 1..4).prop_map(|parts| Layout {
            structure: Structure::List,
            parts
        }),
    ]
}

fn make(layout: &Layout, seed: u8) -> Value {
    let dim = usize::from(seed % 3) + 1;
    let part = |p: &Option<(DType, usize)>| match p {
        Some((d, rank)) => Value::from(tensor(*d, &vec![dim; *rank], seed)),
        None => Value::Blob(vec![seed; usize::from(seed % 5)].into()),
    };
    match layout.structure {
        // A tensor part is a tensor record (both are values).
        Structure::Tensor => part(&layout.parts[0]),
        Structure::Blob => Value::blob(vec![seed, 1, 2]),
        Structure::Dict => Value::Dict(
            layout
                .parts
                .iter()
                .enumerate()
                .map(|(i, p)| (format!("f{i}").into(), part(p)))
                .collect(),
        ),
        Structure::Tuple => Value::Tuple(layout.parts.iter().map(part).collect()),
        Structure::List => Value::List(layout.parts.iter().map(part).collect()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn every_shape_and_dtype_round_trips(layout in arb_layout(), n in 1usize..20, lru in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let o = Options { lru_bytes: if lru { 1 << 20 } else { 0 }, ..opts() };
        let records: Vec<(String, Value)> = (0..n).map(|i| (format!("k{i}"), make(&layout, i as u8))).collect();
        {
            let store = SegmentStore::open(dir.path(), o.clone()).unwrap();
            store.put_batch(&records).unwrap();
            // Readable before the flush, from pending records or segments.
            let keys: Vec<&str> = records.iter().map(|(k, _)| k.as_str()).collect();
            let (got, missing) = store.get_batch(&keys).unwrap();
            prop_assert!(missing.is_empty());
            for ((_, want), got) in records.iter().zip(&got) {
                prop_assert!(same(want, got.as_ref().unwrap()));
            }
            store.flush().unwrap();
        }
        let store = SegmentStore::open(dir.path(), o).unwrap();
        prop_assert_eq!(store.len(), n);
        let keys: Vec<&str> = records.iter().map(|(k, _)| k.as_str()).rev().collect();
        let (got, missing) = store.get_batch(&keys).unwrap();
        prop_assert!(missing.is_empty());
        for ((_, want), got) in records.iter().rev().zip(&got) {
            prop_assert!(same(want, got.as_ref().unwrap()), "{:?} vs {:?}", want, got);
        }
        prop_assert!(store.verify().is_empty(), "{:?}", store.verify());
    }
}

#[test]
fn duplicate_keys_last_write_wins_before_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let a = Value::from(tensor(DType::F32, &[2], 1));
    let b = Value::from(tensor(DType::F32, &[2], 2));
    let c = Value::from(tensor(DType::F32, &[2], 3));
    {
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        store
            .put_batch(&[("x", a.clone()), ("y", a.clone())])
            .unwrap();
        store.flush().unwrap();
        // Twice in one batch, and once more in a later segment.
        store
            .put_batch(&[("x", b.clone()), ("x", c.clone())])
            .unwrap();
        assert!(same(
            &store.get_batch(&["x"]).unwrap().0[0].clone().unwrap(),
            &c
        ));
        store.flush().unwrap();
        store.put_batch(&[("y", b.clone())]).unwrap();
        store.flush().unwrap();
        assert_eq!(store.len(), 2);
    }
    for lru in [0, 1 << 20] {
        let store = SegmentStore::open(
            dir.path(),
            Options {
                lru_bytes: lru,
                ..opts()
            },
        )
        .unwrap();
        let (got, _) = store.get_batch(&["x", "y"]).unwrap();
        assert!(same(got[0].as_ref().unwrap(), &c));
        assert!(same(got[1].as_ref().unwrap(), &b));
        assert_eq!(store.len(), 2);
    }
}

#[test]
fn views_borrow_the_mapped_segment_and_detach_copies() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(
        dir.path(),
        Options {
            lru_bytes: 0,
            ..opts()
        },
    )
    .unwrap();
    let t = Tensor::from_vec([4], vec![1.0f64, 2.0, 3.0, 4.0]).unwrap();
    store.put_batch(&[("k", Value::from(t))]).unwrap();
    store.flush().unwrap();
    let (got, _) = store.get_batch(&["k"]).unwrap();
    let rec = got[0].clone().unwrap();
    let view = rec.as_tensor().unwrap().view();
    assert_eq!(view.as_slice::<f64>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    let owned = rec.as_tensor().unwrap().to_tensor();
    assert_eq!(owned.as_slice::<f64>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);
    assert_ne!(
        rec.detach().as_tensor().unwrap().bytes().as_ptr(),
        view.bytes().as_ptr()
    );
    // The store can go away; the record keeps its map alive.
    drop(store);
    assert_eq!(view.to_f64_vec().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn schema_drift_is_refused_and_nothing_of_the_batch_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let good = Value::dict([("a", Value::from(tensor(DType::F32, &[2, 2], 0)))]);
    store.put_batch(&[("k0", good.clone())]).unwrap();
    let cases = [
        (
            Value::dict([("b", Value::from(tensor(DType::F32, &[2, 2], 0)))]),
            "b",
        ),
        (
            Value::dict([("a", Value::from(tensor(DType::F64, &[2, 2], 0)))]),
            "a_data",
        ),
        (
            Value::dict([("a", Value::from(tensor(DType::F32, &[4], 0)))]),
            "a_data",
        ),
        (Value::dict([("a", Value::Blob(vec![1].into()))]), "a_data"),
        (
            Value::from(tensor(DType::F32, &[2, 2], 0)),
            "output_structure",
        ),
    ];
    for (bad, field) in cases {
        let err = store
            .put_batch(&[("k1", good.clone()), ("k2", bad)])
            .unwrap_err();
        match &err {
            Error::SchemaMismatch { field: f, key, .. } => {
                assert_eq!(f, field);
                assert_eq!(key, "k2");
            }
            other => panic!("expected a schema mismatch, got {other}"),
        }
        assert!(err.to_string().contains(field));
    }
    assert_eq!(store.len(), 1);
    store.flush().unwrap();
    drop(store);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(store.get_batch(&["k1", "k2"]).unwrap().1, vec![0, 1]);
    // The schema survives a reopen.
    let err = store
        .put_batch(&[("k3", Value::from(tensor(DType::I8, &[1], 0)))])
        .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }));
}

#[test]
fn lru_disabled_and_enabled_give_the_same_answers() {
    for lru in [0usize, 64, 1 << 20] {
        let dir = tempfile::tempdir().unwrap();
        let store = SegmentStore::open(
            dir.path(),
            Options {
                lru_bytes: lru,
                ..opts()
            },
        )
        .unwrap();
        let recs: Vec<(String, Value)> = (0..30)
            .map(|i| {
                (
                    format!("k{i}"),
                    Value::from(tensor(DType::I32, &[3], i as u8)),
                )
            })
            .collect();
        store.put_batch(&recs).unwrap();
        store.flush().unwrap();
        for _ in 0..2 {
            let keys: Vec<&str> = recs.iter().map(|(k, _)| k.as_str()).collect();
            let (got, missing) = store.get_batch(&keys).unwrap();
            assert!(missing.is_empty());
            for ((_, w), g) in recs.iter().zip(&got) {
                assert!(same(w, g.as_ref().unwrap()));
            }
        }
        let stats = store.stats();
        assert!(stats.lru_bytes <= lru, "{stats:?}");
        if lru == 0 {
            assert_eq!(stats.lru_hits, 0);
        } else if lru == 1 << 20 {
            assert!(stats.lru_hits >= 30);
        }
    }
}

#[test]
fn a_value_read_into_the_lru_is_never_served_after_a_put_replaced_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(
        dir.path(),
        Options {
            lru_bytes: 1 << 20,
            ..opts()
        },
    )
    .unwrap();
    let old = Value::from(tensor(DType::I32, &[3], 1));
    let new = Value::from(tensor(DType::I32, &[3], 2));
    store.put_batch(&[("k", old.clone())]).unwrap();
    // The writer's puts do not fill the LRU; a read from a segment does.
    assert_eq!(store.stats().lru_entries, 0);
    store.flush().unwrap();
    let (got, _) = store.get_batch(&["k"]).unwrap();
    assert!(same(got[0].as_ref().unwrap(), &old));
    assert_eq!(store.stats().lru_entries, 1);
    store.put_batch(&[("k", new.clone())]).unwrap();
    assert_eq!(store.stats().lru_entries, 0);
    for flushed in [false, true] {
        if flushed {
            store.flush().unwrap();
        }
        let (got, _) = store.get_batch(&["k"]).unwrap();
        assert!(same(got[0].as_ref().unwrap(), &new), "flushed: {flushed}");
    }
}

#[test]
fn only_the_writer_rank_persists() {
    let dir = tempfile::tempdir().unwrap();
    let rec = Value::from(tensor(DType::U8, &[2], 5));
    {
        let other = SegmentStore::open(
            dir.path(),
            Options {
                writer_rank: 0,
                current_rank: 1,
                ..opts()
            },
        )
        .unwrap();
        assert!(!other.is_writer());
        other.put_batch(&[("k", rec.clone())]).unwrap();
        // Its LRU answers.
        assert!(other.get_batch(&["k"]).unwrap().1.is_empty());
        other.flush().unwrap();
    }
    assert!(!dir.path().join("segments").exists());
    let writer = SegmentStore::open(
        dir.path(),
        Options {
            writer_rank: 1,
            current_rank: 1,
            ..opts()
        },
    )
    .unwrap();
    assert!(writer.is_writer());
    assert_eq!(writer.get_batch(&["k"]).unwrap().1, vec![0]);
    writer.put_batch(&[("k", rec)]).unwrap();
    writer.flush().unwrap();
    drop(writer);
    let reader = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    assert!(reader.get_batch(&["k"]).unwrap().1.is_empty());
    assert!(matches!(
        reader.put_batch(&[("z", Value::from(tensor(DType::U8, &[2], 1)))]),
        Err(Error::ReadOnly { .. })
    ));
}

#[test]
fn compaction_drops_dead_rows_and_keeps_every_live_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(
        dir.path(),
        Options {
            flush_every: 4,
            ..opts()
        },
    )
    .unwrap();
    let mut latest = std::collections::BTreeMap::new();
    for round in 0..3u8 {
        for i in 0..10u8 {
            let r = Value::from(tensor(DType::I16, &[2], i.wrapping_add(round * 50)));
            store.put_batch(&[(format!("k{i}"), r.clone())]).unwrap();
            latest.insert(format!("k{i}"), r);
            // Small flushes make small segments.
            if i % 3 == 0 {
                store.flush().unwrap();
            }
        }
    }
    store.flush().unwrap();
    // A reader opened before compaction keeps working afterwards.
    let before = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            lru_bytes: 0,
            ..opts()
        },
    )
    .unwrap();
    let n_before = store.stats().segments;
    let report = store.compact().unwrap();
    assert_eq!(report.segments_before, n_before);
    assert_eq!(report.live_rows, 10);
    assert_eq!(report.dropped_rows, 20);
    assert_eq!(report.segments_after, 3);
    assert!(store.verify().is_empty(), "{:?}", store.verify());
    let check = |s: &SegmentStore| {
        let keys: Vec<&str> = latest.keys().map(String::as_str).collect();
        let (got, missing) = s.get_batch(&keys).unwrap();
        assert!(missing.is_empty());
        for ((_, w), g) in latest.iter().zip(&got) {
            assert!(same(w, g.as_ref().unwrap()));
        }
    };
    check(&store);
    check(&before);
    drop(store);
    let reopened = SegmentStore::open(dir.path(), opts()).unwrap();
    check(&reopened);
    assert_eq!(reopened.len(), 10);
    assert_eq!(
        std::fs::read_dir(dir.path().join("segments"))
            .unwrap()
            .count(),
        3
    );
}

#[test]
fn inspect_reports_entries_and_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let recs: Vec<(String, Value)> = (0..10)
        .map(|i| {
            (
                format!("k{i}"),
                Value::from(tensor(DType::F16, &[2], i as u8)),
            )
        })
        .collect();
    store.put_batch(&recs).unwrap();
    store.flush().unwrap();
    let ins = store.inspect();
    assert_eq!(ins.entries, 10);
    assert_eq!(ins.structure, Some(Structure::Tensor));
    assert_eq!(ins.segments.iter().map(|s| s.live_rows).sum::<usize>(), 10);
    assert!(ins.to_string().contains("segment_000000.arrow"));
    assert!(ins.index_bytes_per_entry > 0.0);
}

#[test]
fn lookups_agree_however_far_apart_the_segment_ids_are() {
    // One record per segment, then compaction: the live segment ids start
    // far from 0 and the ids a batch touches are sparse or dense relative
    // to its size, which `get_batch` resolves in two different ways.
    // No LRU: every read goes to the segments.
    let opts = || Options {
        lru_bytes: 0,
        ..opts()
    };
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let mut want = Vec::new();
    for i in 0..40u8 {
        let r = Value::from(tensor(DType::U16, &[3], i));
        store.put_batch(&[(format!("k{i}"), r.clone())]).unwrap();
        store.flush().unwrap();
        want.push((format!("k{i}"), r));
    }
    assert_eq!(store.stats().segments, 40);
    let all = |s: &SegmentStore| {
        let mut keys: Vec<&str> = want.iter().map(|(k, _)| k.as_str()).collect();
        keys.push("absent");
        let (got, missing) = s.get_batch(&keys).unwrap();
        assert_eq!(missing, vec![40]);
        for ((_, w), g) in want.iter().zip(&got) {
            assert!(same(w, g.as_ref().unwrap()));
        }
        // One key at a time: ids span far more than the batch.
        for (k, w) in &want {
            let (got, missing) = s.get_batch(&[k]).unwrap();
            assert!(missing.is_empty(), "{k}");
            assert!(same(w, got[0].as_ref().unwrap()), "{k}");
        }
        let (got, missing) = s.get_batch(&["absent"]).unwrap();
        assert!(got[0].is_none() && missing == vec![0]);
    };
    all(&store);
    let before = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    store.compact().unwrap();
    all(&store);
    all(&before);
    drop(store);
    all(&SegmentStore::open(dir.path(), opts()).unwrap());
}
