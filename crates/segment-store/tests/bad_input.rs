//! Untrusted input: damaged segments, index logs and schemas, and bad
//! arguments give typed errors or exclusions — never a panic.

use std::path::Path;
use std::sync::Arc;
use tensor_core::Value;

use arrow_array::builder::{Float32Builder, Int64Builder, ListBuilder};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_ipc::writer::FileWriter;
use cache_check::ProblemKind;
use proptest::prelude::*;
use segment_store::format::{INDEX_FILE, SCHEMA_FILE, segment_path};
use segment_store::{Error, Options, SegmentStore};
use tensor_core::Tensor;

fn opts() -> Options {
    Options {
        flush_every: 4,
        lru_bytes: 0,
        ..Options::default()
    }
}

fn rec(i: usize) -> Value {
    Value::from(Tensor::from_vec([2, 2], vec![i as f32; 4]).unwrap())
}

fn build(dir: &Path, n: usize) {
    let store = SegmentStore::open(dir, opts()).unwrap();
    let items: Vec<(String, Value)> = (0..n).map(|i| (format!("k{i}"), rec(i))).collect();
    store.put_batch(&items).unwrap();
    store.flush().unwrap();
}

/// Every answer is either the right value or missing (for damage outside
/// tensor data).
fn answers_are_right_or_missing(store: &SegmentStore, n: usize) {
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let (got, missing) = store.get_batch(&keys).unwrap();
    for (i, g) in got.iter().enumerate() {
        match g {
            Some(r) => assert_eq!(r, &rec(i)),
            None => assert!(missing.contains(&i)),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn flipped_bytes_in_a_segment_never_panic(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8),
        no_index in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), 8);
        let path = segment_path(dir.path(), 0);
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, x) in &flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        std::fs::write(&path, &bytes).unwrap();
        if no_index {
            std::fs::remove_file(dir.path().join(INDEX_FILE)).unwrap();
        }
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        // Arrow IPC has no checksum: a flip inside tensor data may read
        // back as another value, but then `verify` (which checks the
        // segment's content hash, or its rows when there is no index)
        // must report the damage.
        let keys: Vec<String> = (0..8).map(|i| format!("k{i}")).collect();
        let (got, _) = store.get_batch(&keys).unwrap();
        let wrong = got.iter().enumerate().any(|(i, g)| g.as_ref().is_some_and(|r| r != &rec(i)));
        let problems = store.verify();
        if !no_index {
            prop_assert!(!wrong || !problems.is_empty());
        }
        let _ = store.inspect();
    }

    #[test]
    fn random_index_log_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..200), keep in 0usize..200) {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), 8);
        let index = dir.path().join(INDEX_FILE);
        let mut bytes = std::fs::read(&index).unwrap();
        bytes.truncate(keep.min(bytes.len()));
        bytes.extend_from_slice(&tail);
        std::fs::write(&index, &bytes).unwrap();
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        // Whatever the log says, segments are re-indexed or checked by key.
        answers_are_right_or_missing(&store, 8);
        let (_, missing) = store.get_batch(&["k0", "k7"]).unwrap();
        prop_assert!(missing.is_empty(), "{:?}", store.problems());
    }

    #[test]
    fn random_schema_json_never_panics(text in ".{0,120}") {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path(), 4);
        std::fs::write(dir.path().join(SCHEMA_FILE), text.as_bytes()).unwrap();
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        answers_are_right_or_missing(&store, 4);
    }
}

fn write_ipc(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let f = std::fs::File::create(path).unwrap();
    let mut w = FileWriter::try_new(f, &batch.schema()).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
}

fn f32_lists(rows: &[&[f32]]) -> ArrayRef {
    let mut b = ListBuilder::new(Float32Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

fn i64_lists(rows: &[&[i64]]) -> ArrayRef {
    let mut b = ListBuilder::new(Int64Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

#[test]
fn foreign_segment_with_bad_shapes_reads_as_missing_per_row() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("segments")).unwrap();
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["good", "negative", "short", "huge"]));
    let data = f32_lists(&[&[1.0, 2.0], &[1.0], &[1.0, 2.0, 3.0], &[1.0]]);
    let shape = i64_lists(&[&[2], &[-1], &[2], &[i64::MAX, i64::MAX]]);
    write_ipc(
        &segment_path(dir.path(), 0),
        vec![("key", keys), ("data", data), ("shape", shape)],
    );
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let (got, missing) = store
        .get_batch(&["good", "negative", "short", "huge"])
        .unwrap();
    assert_eq!(missing, vec![1, 2, 3]);
    let t = got[0].as_ref().unwrap().as_tensor().unwrap();
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[1.0, 2.0]);
    let problems = store.problems();
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems.iter().all(|p| p.kind == ProblemKind::Structure));
    assert_eq!(store.verify().len(), 3);
}

#[test]
fn foreign_segment_with_the_wrong_columns_is_excluded() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("segments")).unwrap();
    // `key` is not utf8.
    let keys: ArrayRef = Arc::new(Int64Array::from(vec![1, 2]));
    write_ipc(
        &segment_path(dir.path(), 0),
        vec![
            ("key", keys),
            ("data", f32_lists(&[&[1.0], &[2.0]])),
            ("shape", i64_lists(&[&[1], &[1]])),
        ],
    );
    // `data` holds strings.
    let keys: ArrayRef = Arc::new(StringArray::from(vec!["a"]));
    let data: ArrayRef = Arc::new(StringArray::from(vec!["x"]));
    write_ipc(
        &segment_path(dir.path(), 1),
        vec![("key", keys), ("data", data), ("shape", i64_lists(&[&[1]]))],
    );
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let p = store.problems();
    assert_eq!(p.len(), 2, "{p:?}");
    assert!(p.iter().all(|p| p.kind == ProblemKind::Structure));
    assert!(store.is_empty());
    assert!(store.schema().is_none());
}

#[test]
fn unknown_type_in_schema_json_is_a_bad_schema() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 4);
    let text = r#"{"fields":[{"name":"key","type":"string"},{"name":"data","type":"list<decimal128(3, 2)>"}],"metadata":{},"output_structure":"tensor"}"#;
    std::fs::write(dir.path().join(SCHEMA_FILE), text).unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let p = store.problems();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].kind, ProblemKind::Structure);
    assert!(p[0].to_string().contains("schema.json"));
    answers_are_right_or_missing(&store, 4);
}

#[test]
fn bad_arguments_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = SegmentStore::open(
        dir.path(),
        Options {
            flush_every: 0,
            ..opts()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)));
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    store.put_batch::<&str>(&[]).unwrap();
    let (got, missing) = store.get_batch::<&str>(&[]).unwrap();
    assert!(got.is_empty() && missing.is_empty());
    // A dict naming one part twice.
    let t = || Value::from(Tensor::from_vec([1], vec![1u8]).unwrap());
    let err = store
        .put_batch(&[("k", Value::dict([("a", t()), ("a", t())]))])
        .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert!(store.is_empty());
}

#[test]
fn a_file_where_the_cache_directory_should_be_is_an_io_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cache");
    std::fs::write(&file, b"x").unwrap();
    let err = SegmentStore::open(&file, opts()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err}");
    assert!(err.to_string().contains("cache"));
}

/// Found by the `segment_parsers` fuzzer: a field node claiming i64::MAX
/// rows made the layout check compute the size of its offsets with an
/// overflowing multiply (a wrap in release builds, passing the check and
/// leaving Arrow to assert). The segment is now refused by the check.
#[test]
fn field_node_of_i64_max_rows_is_refused_by_the_layout_check() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 4);
    std::fs::remove_file(dir.path().join(INDEX_FILE)).unwrap();
    let path = segment_path(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    // The record batch's field nodes: a u32 count (key, data list and
    // values, shape list and values), then (length, null_count) pairs; the
    // first is the `key` column of 4 rows.
    let mut nodes = 5u32.to_le_bytes().to_vec();
    nodes.extend(4i64.to_le_bytes());
    nodes.extend(0i64.to_le_bytes());
    let at = bytes
        .windows(nodes.len())
        .position(|w| w == nodes)
        .expect("field nodes of the written segment");
    bytes[at + 4..at + 12].copy_from_slice(&i64::MAX.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();

    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let problems = store.problems();
    assert!(
        problems.iter().any(|p| p.kind == ProblemKind::Structure
            && p.detail.contains("overflow")
            && !p.detail.contains("panicked")),
        "{problems:?}"
    );
    assert!(store.is_empty());
}

#[test]
fn a_record_deeper_than_one_level_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let t = || Value::from(Tensor::from_vec([2], vec![1.0f32, 2.0]).unwrap());
    let nested = Value::dict([("outer", Value::Tuple(vec![t()]))]);
    let err = store.put_batch(&[("deep", nested)]).unwrap_err();
    assert!(
        matches!(&err, Error::SchemaMismatch { key, field, .. } if key == "deep" && field == "outer"),
        "{err}"
    );
    assert!(err.to_string().contains("one level deep"), "{err}");
    assert_eq!(store.len(), 0);
    // The cache still takes a record of the right depth afterwards.
    store
        .put_batch(&[("flat", Value::dict([("outer", t())]))])
        .unwrap();
    store.flush().unwrap();
    assert_eq!(store.len(), 1);
}
