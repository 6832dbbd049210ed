//! CachedFn against a model: order, duplicates, misses, errors, threads.

use std::collections::HashSet;
use std::sync::Arc;

use cache_facade::{CacheBackend, CacheConfig, CachedFn, FacadeError, SegmentBackend, StoreKind};
use parking_lot::Mutex;
use proptest::prelude::*;
use tensor_core::{Tensor, Value};

fn value_of(i: u64) -> Value {
    Value::from(Tensor::from_vec([3], vec![i as f32, (i * 2) as f32, -(i as f32)]).unwrap())
}

fn as_vec(r: &Value) -> Vec<f32> {
    r.as_tensor()
        .unwrap()
        .view()
        .as_slice::<f32>()
        .unwrap()
        .to_vec()
}

fn config(root: &std::path::Path) -> CacheConfig {
    CacheConfig::new(StoreKind::SegmentStore, root, "model").option("flush_every", 7u64)
}

type Log = Arc<Mutex<Vec<Vec<u64>>>>;

fn logging_compute(log: Log) -> impl Fn(&[&u64]) -> Result<Vec<Value>, std::convert::Infallible> {
    move |inputs: &[&u64]| {
        log.lock().push(inputs.iter().map(|&&i| i).collect());
        Ok(inputs.iter().map(|&&i| value_of(i)).collect())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn matches_the_model(batches in prop::collection::vec(prop::collection::vec(0u64..40, 0..20), 1..8)) {
        let root = tempfile::tempdir().unwrap();
        let log: Log = Arc::default();
        let f = CachedFn::new(SegmentBackend::open(&config(root.path())).unwrap(), logging_compute(log.clone())).unwrap();
        let mut seen: HashSet<u64> = HashSet::new();
        for (b, batch) in batches.iter().enumerate() {
            let ids: Vec<String> = batch.iter().map(|i| format!("id{i}")).collect();
            let calls_before = log.lock().len();
            let out = f.call(batch, &ids).unwrap();
            // Outputs in the caller's order, duplicates included.
            prop_assert_eq!(out.len(), batch.len());
            for (i, r) in batch.iter().zip(&out) {
                prop_assert_eq!(as_vec(r), as_vec(&value_of(*i)));
            }
            // Exactly the unseen distinct ids were computed, in one call, once each.
            let mut expected: Vec<u64> = Vec::new();
            for i in batch {
                if !seen.contains(i) && !expected.contains(i) {
                    expected.push(*i);
                }
            }
            let log_now = log.lock().clone();
            if expected.is_empty() {
                prop_assert_eq!(log_now.len(), calls_before, "batch {} computed nothing new", b);
            } else {
                prop_assert_eq!(log_now.len(), calls_before + 1);
                prop_assert_eq!(log_now.last().unwrap(), &expected);
            }
            seen.extend(batch.iter().copied());
        }
        let stats = f.stats();
        prop_assert_eq!(stats.computed as usize, seen.len());
        let total: usize = batches.iter().map(Vec::len).sum();
        prop_assert_eq!((stats.hits + stats.computed + stats.deduplicated) as usize, total);
        prop_assert_eq!(f.backend().len().unwrap() as usize, seen.len());
    }
}

#[test]
fn cached_values_survive_a_reopen() {
    let root = tempfile::tempdir().unwrap();
    let log: Log = Arc::default();
    {
        let f = CachedFn::new(
            SegmentBackend::open(&config(root.path())).unwrap(),
            logging_compute(log.clone()),
        )
        .unwrap();
        let inputs: Vec<u64> = (0..30).collect();
        let ids: Vec<String> = inputs.iter().map(|i| format!("id{i}")).collect();
        f.call(&inputs, &ids).unwrap();
        f.flush().unwrap();
    }
    let f = CachedFn::new(
        SegmentBackend::open(&config(root.path())).unwrap(),
        logging_compute(log.clone()),
    )
    .unwrap();
    let inputs: Vec<u64> = (0..30).rev().collect();
    let ids: Vec<String> = inputs.iter().map(|i| format!("id{i}")).collect();
    let out = f.call(&inputs, &ids).unwrap();
    assert_eq!(log.lock().len(), 1, "nothing recomputed after reopen");
    assert_eq!(as_vec(&out[0]), as_vec(&value_of(29)));
    assert_eq!(f.stats().hits, 30);
    assert_eq!(f.backend().stats().hits, 30);
}

#[test]
fn inputs_without_stable_ids_are_errors() {
    let root = tempfile::tempdir().unwrap();
    let log: Log = Arc::default();
    let f = CachedFn::new(
        SegmentBackend::open(&config(root.path())).unwrap(),
        logging_compute(log.clone()),
    )
    .unwrap();
    let err = f.call(&[1u64, 2], &["a"]).unwrap_err();
    assert!(
        matches!(err, FacadeError::MissingIds { inputs: 2, ids: 1 }),
        "{err}"
    );
    let err = f.call(&[1u64, 2], &["a", ""]).unwrap_err();
    assert!(matches!(err, FacadeError::EmptyId { index: 1 }), "{err}");
    assert!(log.lock().is_empty(), "nothing computed for a refused call");
}

#[test]
fn compute_failures_are_returned_and_nothing_is_cached() {
    let root = tempfile::tempdir().unwrap();
    let failing = CachedFn::new(
        SegmentBackend::open(&config(root.path())).unwrap(),
        |_: &[&u64]| Err::<Vec<Value>, _>("extractor crashed"),
    )
    .unwrap();
    let err = failing.call(&[1u64], &["a"]).unwrap_err();
    assert!(err.to_string().contains("extractor crashed"), "{err}");
    assert_eq!(failing.backend().len().unwrap(), 0);

    let short = CachedFn::new(
        SegmentBackend::open(&config(&root.path().join("x")).create_root(true)).unwrap(),
        |_: &[&u64]| Ok::<_, std::convert::Infallible>(vec![value_of(0)]),
    )
    .unwrap();
    let err = short.call(&[1u64, 2], &["a", "b"]).unwrap_err();
    assert!(
        matches!(
            err,
            FacadeError::ComputeCount {
                expected: 2,
                got: 1
            }
        ),
        "{err}"
    );
    assert_eq!(short.backend().len().unwrap(), 0);
}

#[test]
fn many_threads_share_one_cached_fn() {
    let root = tempfile::tempdir().unwrap();
    let log: Log = Arc::default();
    let f = Arc::new(
        CachedFn::new(
            SegmentBackend::open(&config(root.path())).unwrap(),
            logging_compute(log.clone()),
        )
        .unwrap(),
    );
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let f = f.clone();
            s.spawn(move || {
                for round in 0..10u64 {
                    let inputs: Vec<u64> = (0..16).map(|k| (t * 7 + round * 3 + k) % 50).collect();
                    let ids: Vec<String> = inputs.iter().map(|i| format!("id{i}")).collect();
                    let out = f.call(&inputs, &ids).unwrap();
                    for (i, r) in inputs.iter().zip(&out) {
                        assert_eq!(as_vec(r), as_vec(&value_of(*i)));
                    }
                }
            });
        }
    });
    // Every id computed at least once, and far fewer computations than calls.
    let computed: usize = log.lock().iter().map(Vec::len).sum();
    assert!(computed >= f.backend().len().unwrap() as usize);
    assert!(f.backend().len().unwrap() as usize <= 50);
    f.flush().unwrap();
}
