//! Recovery on open: each crash point and kind of damage on its own.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use tensor_core::Value;

use cache_check::ProblemKind;
use segment_store::format::{INDEX_FILE, SCHEMA_FILE, segment_path};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

fn opts() -> Options {
    Options {
        flush_every: 5,
        lru_bytes: 0,
        ..Options::default()
    }
}

fn rec(i: usize) -> Value {
    Value::from(Tensor::from_vec([3], vec![i as f32, 1.0, 2.0]).unwrap())
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i}")).collect()
}

/// A cache of 15 records in three segments (ids 0, 1, 2).
fn build(dir: &Path) {
    let store = SegmentStore::open(dir, opts()).unwrap();
    for i in 0..15 {
        store.put_batch(&[(format!("k{i}"), rec(i))]).unwrap();
    }
    store.flush().unwrap();
    assert_eq!(store.stats().segments, 3);
}

fn check_all(store: &SegmentStore, n: usize) {
    let ks = keys(n);
    let (got, missing) = store.get_batch(&ks).unwrap();
    assert!(
        missing.is_empty(),
        "missing {missing:?}: {:?}",
        store.problems()
    );
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().unwrap(), &rec(i), "k{i}");
    }
}

fn kinds(store: &SegmentStore) -> Vec<ProblemKind> {
    store.problems().iter().map(|p| p.kind).collect()
}

fn index_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join(INDEX_FILE)).unwrap().len()
}

#[test]
fn leftover_temp_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let tmp_seg: PathBuf = dir.path().join("segments/segment_000003.arrow.tmp");
    std::fs::write(&tmp_seg, b"half a segment").unwrap();
    std::fs::write(dir.path().join("schema.json.tmp"), b"{").unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert!(!tmp_seg.exists());
    assert!(!dir.path().join("schema.json.tmp").exists());
    assert_eq!(kinds(&store), vec![ProblemKind::Interrupted; 2]);
    check_all(&store, 15);
    // The next segment reuses no name of a removed temp file's data.
    store.put_batch(&[("k15", rec(15))]).unwrap();
    store.flush().unwrap();
    check_all(&store, 16);
}

#[test]
fn torn_index_tail_is_dropped_and_its_segment_reindexed() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let full = index_len(dir.path());
    // Cut the last group in half: the crash hit while appending it.
    let f = OpenOptions::new()
        .write(true)
        .open(dir.path().join(INDEX_FILE))
        .unwrap();
    f.set_len(full - 20).unwrap();
    drop(f);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(
        kinds(&store),
        vec![ProblemKind::Interrupted, ProblemKind::Unindexed]
    );
    check_all(&store, 15);
    assert_eq!(index_len(dir.path()), full);
    drop(store);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert!(store.problems().is_empty(), "{:?}", store.problems());
    assert!(store.verify().is_empty());
}

#[test]
fn garbage_after_the_last_group_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let full = index_len(dir.path());
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.path().join(INDEX_FILE))
        .unwrap();
    f.write_all(&[0xAB; 50]).unwrap();
    drop(f);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Interrupted]);
    check_all(&store, 15);
    assert_eq!(index_len(dir.path()), full);
}

#[test]
fn segment_newer_than_the_index_is_indexed() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Crash after the segment's rename, before its index group: keep only
    // the first two groups (16-byte header + 2 x (40 + 5 x 8)).
    let f = OpenOptions::new()
        .write(true)
        .open(dir.path().join(INDEX_FILE))
        .unwrap();
    f.set_len(16 + 2 * (40 + 5 * 8)).unwrap();
    drop(f);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Unindexed]);
    check_all(&store, 15);
    assert!(store.verify().is_empty(), "{:?}", store.verify());
}

#[test]
fn missing_index_is_rebuilt_with_later_rows_winning() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    {
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        store.put_batch(&[("k3", rec(300))]).unwrap();
        store.flush().unwrap();
    }
    std::fs::remove_file(dir.path().join(INDEX_FILE)).unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(store.len(), 15);
    let (got, _) = store.get_batch(&["k3", "k4"]).unwrap();
    assert_eq!(got[0].as_ref().unwrap(), &rec(300));
    assert_eq!(got[1].as_ref().unwrap(), &rec(4));
    assert!(dir.path().join(INDEX_FILE).exists());
    assert!(store.verify().is_empty(), "{:?}", store.verify());
}

#[test]
fn index_with_a_bad_header_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    std::fs::write(dir.path().join(INDEX_FILE), b"not an index at all").unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Structure]);
    check_all(&store, 15);
    drop(store);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert!(store.problems().is_empty());
}

/// A version-1 log (BLAKE3 key hashes) is rebuilt from the segments, and a
/// writer rewrites it as version 2: its hashes would place no key.
#[test]
fn version_1_index_is_rebuilt_as_version_2() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let path = dir.path().join(INDEX_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes[8..12], 2u32.to_le_bytes());
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let problems = store.problems();
    assert_eq!(kinds(&store), vec![ProblemKind::Structure]);
    assert!(problems[0].detail.contains("version 1"), "{problems:?}");
    check_all(&store, 15);
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap()[8..12], 2u32.to_le_bytes());
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert!(store.problems().is_empty());
    check_all(&store, 15);
}

#[test]
fn corrupt_segment_is_excluded_and_its_keys_read_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // Same length, damaged footer: found when first read.
    let path = segment_path(dir.path(), 1);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n - 60..n - 10] {
        *b ^= 0x5A;
    }
    std::fs::write(&path, &bytes).unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let ks = keys(15);
    let (got, missing) = store.get_batch(&ks).unwrap();
    assert_eq!(missing, vec![5, 6, 7, 8, 9]);
    assert_eq!(got[0].as_ref().unwrap(), &rec(0));
    assert_eq!(got[14].as_ref().unwrap(), &rec(14));
    let problems = store.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.kind == ProblemKind::Structure && p.path == path)
    );
    let v = store.verify();
    assert!(
        v.iter()
            .any(|p| p.kind == ProblemKind::ChecksumMismatch && p.path == path),
        "{v:?}"
    );
    // The error names the file.
    assert!(problems[0].to_string().contains("segment_000001.arrow"));
}

#[test]
fn truncated_segment_is_excluded_at_open() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let path = segment_path(dir.path(), 0);
    let len = std::fs::metadata(&path).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Truncated]);
    let (_, missing) = store.get_batch(&keys(15)).unwrap();
    assert_eq!(missing, vec![0, 1, 2, 3, 4]);
    assert!(!store.verify().is_empty());
    // The directory-level check says the same, in the shared shape.
    let all = segment_store::verify(dir.path());
    assert!(
        all.iter()
            .any(|p| p.kind == ProblemKind::Truncated && p.path == path),
        "{all:?}"
    );
    let gone = segment_store::verify(dir.path().join("no-such-cache"));
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].kind, ProblemKind::Missing);
    assert!(
        !dir.path().join("no-such-cache").exists(),
        "verify creates nothing"
    );
}

#[test]
fn corrupt_segment_without_an_index_is_excluded_on_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    std::fs::remove_file(dir.path().join(INDEX_FILE)).unwrap();
    std::fs::write(
        segment_path(dir.path(), 2),
        b"ARROW1\0\0garbage garbage garbage",
    )
    .unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Structure]);
    assert_eq!(store.len(), 10);
    let (_, missing) = store.get_batch(&keys(15)).unwrap();
    assert_eq!(missing, vec![10, 11, 12, 13, 14]);
}

#[test]
fn missing_segment_listed_in_the_index_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Missing]);
    let (_, missing) = store.get_batch(&keys(15)).unwrap();
    assert_eq!(missing, vec![5, 6, 7, 8, 9]);
    // New writes never reuse the lost id.
    store.put_batch(&[("k5", rec(5))]).unwrap();
    store.flush().unwrap();
    assert!(!segment_path(dir.path(), 1).exists());
    assert_eq!(store.get_batch(&["k5"]).unwrap().1, Vec::<usize>::new());
}

#[test]
fn corrupt_schema_json_is_rederived_from_the_segments() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = std::fs::read_to_string(dir.path().join(SCHEMA_FILE)).unwrap();
    std::fs::write(dir.path().join(SCHEMA_FILE), b"{\"fields\": [tru").unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Structure]);
    check_all(&store, 15);
    let rewritten = std::fs::read_to_string(dir.path().join(SCHEMA_FILE)).unwrap();
    assert_eq!(rewritten, original);
    // And the schema still guards puts.
    let bad = Value::from(Tensor::from_vec([3], vec![1u8, 2, 3]).unwrap());
    assert!(store.put_batch(&[("x", bad)]).is_err());
}

#[test]
fn oversized_schema_json_is_not_read_into_memory_but_rederived() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let original = std::fs::read_to_string(dir.path().join(SCHEMA_FILE)).unwrap();
    // Sparse: over the cap without taking the disk space.
    let f = std::fs::File::create(dir.path().join(SCHEMA_FILE)).unwrap();
    f.set_len(segment_store::SCHEMA_FILE_CAP + 1).unwrap();
    drop(f);
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    let problems = store.problems();
    assert_eq!(kinds(&store), vec![ProblemKind::Structure]);
    assert!(
        problems[0].detail.contains("limit"),
        "{:?}",
        problems[0].detail
    );
    check_all(&store, 15);
    let rewritten = std::fs::read_to_string(dir.path().join(SCHEMA_FILE)).unwrap();
    assert_eq!(rewritten, original);
}

#[test]
fn stale_segment_older_than_the_index_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    // As if compaction crashed after switching the index, before deleting:
    // the index no longer lists segment 0 (drop its group by rewriting).
    {
        let store = SegmentStore::open(dir.path(), opts()).unwrap();
        store.compact().unwrap();
    }
    let seg0 = segment_path(dir.path(), 0);
    assert!(!seg0.exists());
    std::fs::write(&seg0, b"left over").unwrap();
    let store = SegmentStore::open(dir.path(), opts()).unwrap();
    assert_eq!(kinds(&store), vec![ProblemKind::Stale]);
    check_all(&store, 15);
}
