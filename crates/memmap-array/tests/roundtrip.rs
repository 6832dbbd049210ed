//! Write -> finalize -> open round trips.

mod common;

use memmap_array::{Error, MemmapArray, NewRow, RowWriter, Schema, WriterOptions};
use proptest::prelude::*;
use tensor_core::{DType, Tensor};

#[test]
fn standard_schema_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 17);
    common::check_rows(&cache, 17);
    assert_eq!(cache.fingerprint(), &serde_json::json!("fp-1"));
    // Every .bin is exactly rows * row_bytes: numpy.memmap's shape works.
    for a in cache.schema().arrays() {
        assert_eq!(
            common::file_len(dir.path(), &memmap_array::bin_file(a.name())),
            17 * a.row_bytes() as u64
        );
    }
    assert!(!dir.path().join(memmap_array::MANIFEST_FILE).exists());
    assert!(dir.path().join(memmap_array::COMPLETE_FILE).exists());
}

#[test]
fn rows_are_found_by_source() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 25);
    for i in (0..25).rev() {
        assert_eq!(cache.find(&common::source(i)), Some(i as u64));
    }
    assert_eq!(cache.find("src/25.wav"), None);
    assert_eq!(cache.find(""), None);
}

#[test]
fn sidecar_values_are_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 30);
    // config(i) takes 3 distinct values.
    let values = cache.sidecar_values("config").unwrap();
    assert_eq!(values.len(), 3);
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 3);
}

#[test]
fn absent_nullable_array_is_zero_filled_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 4);
    drop(cache);
    let bytes = std::fs::read(dir.path().join("mask.bin")).unwrap();
    // Row 1 lacks mask: its 4 bytes are zero.
    assert_eq!(&bytes[4..8], &[0, 0, 0, 0]);
    assert_eq!(&bytes[8..12], common::mask(2).bytes());
}

#[test]
fn empty_cache_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 0);
    assert!(cache.is_empty());
    assert!(matches!(
        cache.row(0),
        Err(Error::RowOutOfRange { index: 0, rows: 0 })
    ));
}

#[test]
fn invalid_rows_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    common::write_row(&mut w, 0);
    let (d, m, s) = (common::data(1), common::mask(1), common::score(1));
    let wrong_dtype = Tensor::from_vec([2, 3], vec![0i32; 6]).unwrap();
    let wrong_shape = Tensor::from_vec([3, 2], vec![0i16; 6]).unwrap();
    let bad_rows = [
        // missing array
        NewRow::new("x").array("data", d.view()).null("mask"),
        // unknown array
        NewRow::new("x")
            .array("data", d.view())
            .null("mask")
            .array("score", s.view())
            .array("other", s.view()),
        // array twice
        NewRow::new("x")
            .array("data", d.view())
            .array("data", d.view())
            .null("mask")
            .array("score", s.view()),
        // wrong dtype
        NewRow::new("x")
            .array("data", wrong_dtype.view())
            .null("mask")
            .array("score", s.view()),
        // wrong shape
        NewRow::new("x")
            .array("data", wrong_shape.view())
            .null("mask")
            .array("score", s.view()),
        // null in a non-nullable array
        NewRow::new("x")
            .null("data")
            .array("mask", m.view())
            .array("score", s.view()),
        // unknown sidecar
        NewRow::new("x")
            .array("data", d.view())
            .null("mask")
            .array("score", s.view())
            .sidecar("nope", "v"),
        // metadata that is not JSON
        NewRow::new("x")
            .array("data", d.view())
            .null("mask")
            .array("score", s.view())
            .meta("{not json"),
    ];
    for row in &bad_rows {
        let e = w.write(row).unwrap_err();
        assert!(matches!(e, Error::InvalidRow { .. }), "{e}");
        assert!(e.to_string().contains("nothing was written"), "{e}");
    }
    assert_eq!(w.rows(), 1);
    for i in 1..4 {
        common::write_row(&mut w, i);
    }
    w.finalize().unwrap();
    common::check_rows(&MemmapArray::open(dir.path()).unwrap(), 4);
}

#[test]
fn invalid_schemas_are_refused() {
    let cases = [
        Schema::builder().build(),
        Schema::builder().array("", DType::U8, [1]).build(),
        Schema::builder().array("../x", DType::U8, [1]).build(),
        Schema::builder().array(".hidden", DType::U8, [1]).build(),
        Schema::builder()
            .array("a", DType::U8, [1])
            .array("a", DType::U8, [1])
            .build(),
        Schema::builder()
            .array("a", DType::U8, [1])
            .sidecar("a")
            .build(),
        Schema::builder()
            .array("a", DType::U8, [1])
            .sidecar("shapes")
            .build(),
        Schema::builder()
            .array("a", DType::U64, [usize::MAX, 2])
            .build(),
    ];
    for case in cases {
        assert!(matches!(case, Err(Error::InvalidSchema { .. })), "{case:?}");
    }
}

#[test]
fn load_in_memory_matches_and_ram_guard_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut cache = common::build(dir.path(), 9);
    let e = cache.load_in_memory_with(0.0).unwrap_err();
    assert!(matches!(e, Error::TooLargeForRam { .. }), "{e}");
    assert!(e.to_string().contains("physical RAM"), "{e}");
    cache.load_in_memory().unwrap();
    common::check_rows(&cache, 9);
    // Heap copies are 8-byte aligned: typed access always works.
    let row = cache.row(3).unwrap();
    assert_eq!(
        row.get("data").unwrap().unwrap().as_slice::<i16>().unwrap(),
        common::data(3).as_slice::<i16>().unwrap()
    );
}

#[test]
fn unknown_names_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cache = common::build(dir.path(), 2);
    assert!(matches!(
        cache.array(0, "nope"),
        Err(Error::UnknownName { kind: "array", .. })
    ));
    assert!(matches!(
        cache.sidecar("nope", 0),
        Err(Error::UnknownName {
            kind: "sidecar",
            ..
        })
    ));
    assert!(matches!(
        cache.array(2, "data"),
        Err(Error::RowOutOfRange { .. })
    ));
}

/// Every dtype numpy can memmap (all but bf16).
fn numpy_dtypes() -> Vec<DType> {
    DType::ALL
        .into_iter()
        .filter(|d| d.numpy_str().is_ok())
        .collect()
}

#[derive(Debug, Clone)]
struct Spec {
    dtype: DType,
    shape: Vec<usize>,
    nullable: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        proptest::sample::select(numpy_dtypes()),
        proptest::collection::vec(0usize..4, 0..3),
        any::<bool>(),
    )
        .prop_map(|(dtype, shape, nullable)| Spec {
            dtype,
            shape,
            nullable,
        })
}

/// Bytes of row `i` of array `k`: valid for every dtype (bools 0/1).
fn row_bytes(spec: &Spec, k: usize, i: usize) -> Vec<u8> {
    let len = spec.shape.iter().product::<usize>() * spec.dtype.size();
    (0..len)
        .map(|b| {
            let v = (i * 31 + k * 7 + b) as u8;
            if spec.dtype == DType::Bool { v & 1 } else { v }
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_schemas_round_trip(
        specs in proptest::collection::vec(spec(), 1..4),
        n in 0usize..12,
        sidecar_pool in proptest::collection::vec("[a-z\"{}]{0,12}", 1..4),
        nulls in proptest::collection::vec(any::<bool>(), 12),
        sync_every in 0usize..4,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut builder = Schema::builder();
        for (k, s) in specs.iter().enumerate() {
            let name = format!("a{k}");
            builder = if s.nullable {
                builder.nullable_array(&name, s.dtype, s.shape.clone())
            } else {
                builder.array(&name, s.dtype, s.shape.clone())
            };
        }
        let schema = builder.sidecar("side").build().unwrap();
        let mut w = RowWriter::create_or_resume_with(
            dir.path(), &schema, serde_json::json!({"n": n}), WriterOptions { sync_every },
        ).unwrap();
        let names: Vec<String> = (0..specs.len()).map(|k| format!("a{k}")).collect();
        let tensors: Vec<Vec<Tensor>> = (0..n)
            .map(|i| specs.iter().enumerate()
                .map(|(k, s)| Tensor::new(s.dtype, s.shape.clone(), &row_bytes(s, k, i)).unwrap())
                .collect())
            .collect();
        let absent = |i: usize, k: usize| specs[k].nullable && nulls[(i + k) % nulls.len()];
        for i in 0..n {
            let source = format!("s{i}");
            let mut row = NewRow::new(&source);
            for (k, name) in names.iter().enumerate() {
                row = if absent(i, k) { row.null(name) } else { row.array(name, tensors[i][k].view()) };
            }
            if !i.is_multiple_of(3) {
                row = row.sidecar("side", &sidecar_pool[i % sidecar_pool.len()]);
            }
            w.write(&row).unwrap();
        }
        prop_assert_eq!(w.finalize().unwrap(), n as u64);
        let cache = MemmapArray::open(dir.path()).unwrap();
        prop_assert_eq!(cache.len(), n as u64);
        for i in 0..n {
            let row = cache.row(i as u64).unwrap();
            prop_assert_eq!(row.source(), format!("s{i}"));
            for (k, spec) in specs.iter().enumerate() {
                match &row.arrays()[k] {
                    None => prop_assert!(absent(i, k)),
                    Some(v) => {
                        prop_assert!(!absent(i, k));
                        prop_assert_eq!(v.dtype(), spec.dtype);
                        prop_assert_eq!(v.shape().dims(), &spec.shape[..]);
                        prop_assert_eq!(v.bytes(), &row_bytes(spec, k, i)[..]);
                    }
                }
            }
            let expected = (!i.is_multiple_of(3)).then(|| sidecar_pool[i % sidecar_pool.len()].as_str());
            prop_assert_eq!(row.sidecar("side").unwrap(), expected);
        }
        let mut distinct: Vec<&String> = (0..n).filter(|i| !i.is_multiple_of(3))
            .map(|i| &sidecar_pool[i % sidecar_pool.len()]).collect();
        distinct.sort();
        distinct.dedup();
        prop_assert_eq!(cache.sidecar_values("side").unwrap().len(), distinct.len());
    }
}
