//! Every store through `open(config)`: round trips, keys and indices, views
//! into the store's files, and the typed "cannot do that" errors.

use cache_facade::{
    CacheBackend, CacheConfig, CachedFn, Dataset, FacadeError, Operation, Source, StoreKind, open,
    open_with_source,
};
use tensor_core::{Tensor, Value};

/// Members in name order: shard-store pickles dicts, which keep their
/// members sorted by name.
fn row(i: u32) -> Value {
    Value::dict([
        (
            "label",
            Value::from(Tensor::from_vec([1], vec![i as i64 % 3]).unwrap()),
        ),
        (
            "x",
            Value::from(Tensor::from_vec([3], vec![i as f32, 1.0, -(i as f32)]).unwrap()),
        ),
    ])
}

fn x_of(v: &Value) -> Vec<f32> {
    v.get("x")
        .unwrap()
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec()
}

fn json_config(backend: &str, root: &std::path::Path, name: &str) -> CacheConfig {
    CacheConfig::from_json(&format!(
        r#"{{"backend": "{backend}", "root": {root:?}, "name": "{name}", "options": {{"dataset": "toy"}}}}"#
    ))
    .unwrap()
}

fn assert_unsupported(err: FacadeError, op: &str) {
    match &err {
        FacadeError::Unsupported { op: got, .. } => assert_eq!(*got, op, "{err}"),
        other => panic!("expected Unsupported({op}), got {other}"),
    }
}

#[test]
fn segment_store_round_trips_every_value_shape_by_string_id() {
    let root = tempfile::tempdir().unwrap();
    let config = CacheConfig::new(StoreKind::SegmentStore, root.path(), "outputs");
    let cache = open(&config).unwrap();
    assert!(cache.supports(Operation::GetByKey) && cache.supports(Operation::Put));
    cache
        .put_batch(vec![("a".into(), row(1)), ("b".into(), row(2))])
        .unwrap();
    cache.flush().unwrap();
    drop(cache);

    let cache = open(&config).unwrap();
    let (values, missing) = cache.get_batch(&["b", "zzz", "a"]).unwrap();
    assert_eq!(missing, vec![1]);
    assert_eq!(x_of(values[0].as_ref().unwrap()), vec![2.0, 1.0, -2.0]);
    assert_eq!(values[2].as_ref().unwrap(), &row(1));
    assert_eq!(cache.len().unwrap(), 2);
    assert_eq!(cache.stats().hits, 2);
    assert_eq!(cache.stats().misses, 1);

    let tuples = open(&CacheConfig::new(
        StoreKind::SegmentStore,
        root.path(),
        "tuples",
    ))
    .unwrap();
    let t = Value::Tuple(vec![
        Value::from(Tensor::from_vec([2], vec![1u8, 2]).unwrap()),
        Value::blob(b"meta".to_vec()),
    ]);
    tuples.put_batch(vec![("t".into(), t.clone())]).unwrap();
    tuples.flush().unwrap();
    assert_eq!(tuples.get("t").unwrap(), Some(t));

    assert_unsupported(cache.get_indices(&[0]).unwrap_err(), "get by index");
    assert_unsupported(Dataset::new(cache).err().unwrap(), "get by index");

    let nested = Value::Tuple(vec![Value::Tuple(vec![])]);
    let err = tuples.put_batch(vec![("n".into(), nested)]).unwrap_err();
    assert!(matches!(err, FacadeError::BadValue { .. }), "{err}");
    assert!(err.to_string().contains("one level deep"), "{err}");
}

#[test]
fn a_read_only_config_opens_beside_the_writer_and_refuses_puts() {
    let root = tempfile::tempdir().unwrap();
    let config = CacheConfig::new(StoreKind::SegmentStore, root.path(), "ro");
    let writer = open(&config).unwrap();
    writer.put_batch(vec![("a".into(), row(1))]).unwrap();
    writer.flush().unwrap();
    let reader = open(&config.clone().read_only(true)).unwrap();
    assert_eq!(reader.get("a").unwrap(), Some(row(1)));
    assert!(reader.put_batch(vec![("b".into(), row(2))]).is_err());
    // Not part of the key: the same directory.
    assert_eq!(
        config.clone().read_only(true).cache_dir().unwrap(),
        config.cache_dir().unwrap()
    );
}

#[test]
fn segment_store_multi_writer_ranks_write_their_own_logs() {
    let root = tempfile::tempdir().unwrap();
    let config = CacheConfig::new(StoreKind::SegmentStore, root.path(), "ranks")
        .option("multi_writer", true);
    let rank = segment_store::Options::default().current_rank;
    let cache = cache_facade::SegmentBackend::open(&config).unwrap();
    cache.put_batch(vec![("a".into(), row(1))]).unwrap();
    cache.flush().unwrap();
    let dir = cache.store().dir().to_path_buf();
    let log = dir
        .join(segment_store::format::WRITERS_DIR)
        .join(segment_store::format::writer_log_name(rank));
    assert!(log.is_file(), "{log:?}");
    // The same rank started twice is refused, with the lock it wants.
    let Err(err) = cache_facade::SegmentBackend::open(&config) else {
        panic!("the same rank opened twice");
    };
    assert!(err.to_string().contains("lock"), "{err}");
    drop(cache);
    let cache = open(&config).unwrap();
    assert_eq!(cache.get("a").unwrap(), Some(row(1)));
    assert_eq!(
        cache_facade::detect(&dir),
        Some(cache_facade::Detected::own(
            cache_facade::StoreKind::SegmentStore
        ))
    );
}

#[test]
fn segment_values_are_views_into_the_mapped_segment() {
    let root = tempfile::tempdir().unwrap();
    let config = CacheConfig::new(StoreKind::SegmentStore, root.path(), "v");
    let cache = cache_facade::SegmentBackend::open(&config).unwrap();
    cache.put_batch(vec![("k".into(), row(5))]).unwrap();
    cache.flush().unwrap();
    drop(cache);
    let cache = cache_facade::SegmentBackend::open(&config).unwrap();
    let value = cache.get("k").unwrap().unwrap();
    let (records, _) = cache.store().get_batch(&["k"]).unwrap();
    let record = records[0].as_ref().unwrap();
    let part = record.get("x").unwrap().as_tensor().unwrap();
    // Both read the same bytes of the same map.
    assert_eq!(
        value
            .get("x")
            .unwrap()
            .as_tensor()
            .unwrap()
            .bytes()
            .as_ptr(),
        part.bytes().as_ptr()
    );
}

#[test]
fn memmap_array_is_built_from_a_source_and_read_by_id_or_index() {
    let root = tempfile::tempdir().unwrap();
    let config = json_config("memmap-array", root.path(), "rows");
    let err = open(&config).err().unwrap();
    assert!(matches!(err, FacadeError::NotBuilt { .. }), "{err}");

    let ids: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    let source = Source::keyed(ids, |id: &str| -> Result<Value, std::num::ParseIntError> {
        Ok(row(id[1..].parse()?))
    });
    let built = open_with_source(&config, source).unwrap();
    assert_eq!(built.len().unwrap(), 20);
    drop(built);

    let cache = open(&config).unwrap();
    let (values, missing) = cache.get_batch(&["s7", "nope"]).unwrap();
    assert_eq!(missing, vec![1]);
    assert_eq!(values[0].as_ref().unwrap(), &row(7));
    let by_index = cache.get_indices(&[3, -1]).unwrap();
    assert_eq!(by_index[0], row(3));
    assert_eq!(by_index[1], row(19));
    let err = cache.get_indices(&[20]).unwrap_err();
    assert!(
        matches!(
            err,
            FacadeError::IndexOutOfRange {
                index: 20,
                len: 20,
                ..
            }
        ),
        "{err}"
    );
    assert_unsupported(
        cache.put_batch(vec![("s0".into(), row(0))]).unwrap_err(),
        "put",
    );

    // Views into the mapped .bin file: the pointer lies inside the memmap's row.
    let memmap = cache_facade::MemmapBackend::open(&config).unwrap();
    let v = memmap.get_index(4).unwrap();
    let direct = memmap.cache().array(4, "x").unwrap().unwrap();
    assert_eq!(
        v.get("x").unwrap().as_tensor().unwrap().bytes().as_ptr(),
        direct.bytes().as_ptr()
    );

    let data = Dataset::new(memmap).unwrap();
    assert_eq!(data.get(-20).unwrap(), row(0));
}

#[test]
fn memmap_array_rows_must_be_dicts_of_tensors() {
    let root = tempfile::tempdir().unwrap();
    let config = CacheConfig::new(StoreKind::MemmapArray, root.path(), "bad");
    let source = Source::items(|| [Value::blob(b"x".to_vec())]);
    let err = open_with_source(&config, source).err().unwrap();
    assert!(matches!(err, FacadeError::BadValue { .. }), "{err}");
    assert!(err.to_string().contains("dicts of named arrays"), "{err}");
}

#[test]
fn shard_store_serves_a_source_by_index_and_reopens_without_it() {
    let root = tempfile::tempdir().unwrap();
    let config = json_config("shard-store", root.path(), "stream").option("max_shard_length", 4);
    let err = open(&config).err().unwrap();
    assert!(matches!(err, FacadeError::NotBuilt { .. }), "{err}");

    let source = Source::items(|| (0..10).map(row));
    let cache = open_with_source(&config, source).unwrap();
    assert_eq!(cache.get_index(6).unwrap(), row(6));
    assert_eq!(cache.len().unwrap(), 10);
    let many = cache.get_indices(&[9, 0, -2]).unwrap();
    assert_eq!(many, vec![row(9), row(0), row(8)]);
    assert_unsupported(cache.get_batch(&["6"]).unwrap_err(), "get by string key");
    assert_unsupported(cache.put_batch(vec![]).unwrap_err(), "put");
    drop(cache);

    // Every item is on disk now: a handle without the source reads them.
    let cache = open(&config).unwrap();
    assert_eq!(cache.get_index(3).unwrap(), row(3));

    let keyed = Source::keyed(["a"], |_: &str| Ok::<_, std::convert::Infallible>(row(0)));
    let err = open_with_source(&config, keyed).err().unwrap();
    assert_unsupported(err, "build from a keyed source");
}

#[test]
fn page_alloc_is_built_once_then_read_zero_copy() {
    let root = tempfile::tempdir().unwrap();
    let config = json_config("page-alloc", root.path(), "train").option("page_size", 4096);
    let err = open(&config).err().unwrap();
    assert!(matches!(err, FacadeError::NotBuilt { .. }), "{err}");

    let source = Source::items(|| {
        (0..50u32).map(|i| {
            Value::dict([
                (
                    "x",
                    Value::from(Tensor::from_vec([3], vec![i as f32, 1.0, -(i as f32)]).unwrap()),
                ),
                ("jpeg", Value::blob(vec![i as u8; i as usize])),
            ])
        })
    });
    drop(open_with_source(&config, source).unwrap());

    let page = cache_facade::PageBackend::open(&config).unwrap();
    let v = page.get_index(-1).unwrap();
    assert_eq!(x_of(&v), vec![49.0, 1.0, -49.0]);
    assert_eq!(
        v.get("jpeg").and_then(Value::as_blob),
        Some(&[49u8; 49][..])
    );
    // The tensor's bytes lie inside the mapped page file.
    let file = page.reader().bytes().as_ptr_range();
    let at = v.get("x").unwrap().as_tensor().unwrap().bytes().as_ptr();
    assert!(file.contains(&at));
    assert_unsupported(
        page.put_batch(vec![("0".into(), v.clone())]).unwrap_err(),
        "put",
    );
    assert_unsupported(page.get_batch(&["0"]).unwrap_err(), "get by string key");
    let err = page.get_indices(&[50]).unwrap_err();
    assert!(matches!(err, FacadeError::IndexOutOfRange { .. }), "{err}");

    let loader = Dataset::new(open(&config).unwrap()).unwrap();
    assert_eq!(loader.len().unwrap(), 50);
    assert_eq!(x_of(&loader.get(10).unwrap()), vec![10.0, 1.0, -10.0]);
    assert_eq!(loader.stats().hits, 1);
}

#[test]
fn cached_fn_needs_keys_and_a_built_memmap_serves_its_hits() {
    let root = tempfile::tempdir().unwrap();
    let pages = CacheConfig::new(StoreKind::PageAlloc, root.path(), "p");
    let built = open_with_source(&pages, Source::items(|| (0..2).map(row))).unwrap();
    let compute =
        |xs: &[&u32]| Ok::<_, std::convert::Infallible>(xs.iter().map(|&&x| row(x)).collect());
    assert_unsupported(
        CachedFn::new(built, compute).err().unwrap(),
        "get by string key",
    );

    let rows = CacheConfig::new(StoreKind::MemmapArray, root.path(), "m");
    let ids: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    let built = open_with_source(
        &rows,
        Source::keyed(ids, |id: &str| {
            Ok::<_, std::convert::Infallible>(row(id[1..].parse().unwrap_or(0)))
        }),
    )
    .unwrap();
    let f = CachedFn::new(built, compute).unwrap();
    let out = f.call(&[2, 4], &["r2", "r4"]).unwrap();
    assert_eq!(out, vec![row(2), row(4)]);
    assert_eq!(f.stats().hits, 2);
    // A miss is computed, but a built memmap cannot store it: typed error.
    assert_unsupported(f.call(&[9], &["r9"]).unwrap_err(), "put");
}
