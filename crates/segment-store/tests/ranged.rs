//! Rows read through byte ranges (`get_batch_ranged`, `ranged::Layout`)
//! against the usual read of whole, mapped segments: the same records for
//! every dtype, structure and blob; few bytes read; corrupt rows refused.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use proptest::prelude::*;
use segment_store::{BoxError, Error, Options, SegmentRanges, SegmentStore, WholeSegment};
use tensor_core::{DType, SharedBytes, SharedTensor, Value};

/// Reads ranges of the segment files on disk, as a remote reader would
/// fetch them: every segment counts as not whole locally.
#[derive(Default)]
struct Ranges {
    read: Mutex<Vec<(PathBuf, Range<u64>)>>,
    /// Fail every read of this file.
    fail: Option<PathBuf>,
    /// Read a segment whole from this many rows a call.
    whole_from: Option<usize>,
}

impl Ranges {
    fn bytes(&self) -> u64 {
        let read = self.read.lock().unwrap();
        read.iter().map(|(_, r)| r.end - r.start).sum()
    }
}

impl SegmentRanges for Ranges {
    fn is_local(&self, _: &Path) -> bool {
        false
    }

    fn read_whole(&self, _: &Path, rows: usize, _: usize) -> bool {
        self.whole_from.is_some_and(|n| rows >= n)
    }

    fn read_ranges(&self, path: &Path, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>, BoxError> {
        if self.fail.as_deref() == Some(path) {
            return Err("the server said no".into());
        }
        let file = File::open(path)?;
        let mut out = Vec::new();
        for r in ranges {
            let mut buf = vec![0u8; (r.end - r.start) as usize];
            file.read_exact_at(&mut buf, r.start)?;
            self.read
                .lock()
                .unwrap()
                .push((path.to_path_buf(), r.clone()));
            out.push(buf);
        }
        Ok(out)
    }
}

fn tensor(dtype: DType, shape: &[usize], seed: u64) -> Value {
    let n: usize = shape.iter().product();
    let bytes: Vec<u8> = (0..n * dtype.size())
        .map(|i| {
            let b = (seed as usize * 131 + i * 7) as u8;
            if dtype == DType::Bool { b & 1 } else { b }
        })
        .collect();
    Value::Tensor(SharedTensor::new(dtype, shape.to_vec(), SharedBytes::from(bytes)).unwrap())
}

const DTYPES: [DType; 13] = [
    DType::Bool,
    DType::U8,
    DType::I8,
    DType::U16,
    DType::BF16,
    DType::I16,
    DType::U32,
    DType::I32,
    DType::U64,
    DType::I64,
    DType::F16,
    DType::F32,
    DType::F64,
];

/// A record layout: the structure (0 tensor, 1 blob, 2 dict, 3 tuple)
/// and each part's dtype index and rank (`None`: a blob).
#[derive(Debug, Clone)]
struct Layout {
    structure: u8,
    parts: Vec<Option<(usize, usize)>>,
}

fn layouts() -> impl Strategy<Value = Layout> {
    let part = prop_oneof![
        3 => (0..DTYPES.len(), 0usize..4).prop_map(Some),
        1 => Just(None),
    ];
    (0u8..4, prop::collection::vec(part, 1..4)).prop_map(|(structure, mut parts)| {
        match structure {
            0 => parts = vec![Some(parts[0].unwrap_or((11, 1)))],
            1 => parts = vec![None],
            _ => {}
        }
        Layout { structure, parts }
    })
}

fn record(layout: &Layout, shapes: &[Vec<usize>], blob: &[u8], seed: u64) -> Value {
    let parts: Vec<Value> = layout
        .parts
        .iter()
        .zip(shapes)
        .map(|(p, shape)| match p {
            Some((d, rank)) => tensor(DTYPES[*d], &shape[..*rank], seed),
            None => Value::Blob(SharedBytes::from(blob.to_vec())),
        })
        .collect();
    match layout.structure {
        0 | 1 => parts.into_iter().next().unwrap(),
        2 => Value::dict(
            parts
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("p{i}"), v)),
        ),
        _ => Value::Tuple(parts),
    }
}

fn written(dir: &Path, records: &[(String, Value)], flush_every: usize) -> SegmentStore {
    let store = SegmentStore::open(
        dir,
        Options {
            flush_every,
            ..Options::default()
        },
    )
    .unwrap();
    store.put_batch(records).unwrap();
    store.flush().unwrap();
    drop(store);
    SegmentStore::open(
        dir,
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn ranged_rows_equal_the_usual_read(
        layout in layouts(),
        rows in prop::collection::vec(
            (prop::collection::vec(0usize..5, 3), prop::collection::vec(any::<u8>(), 0..40)),
            1..40,
        ),
        flush_every in 1usize..16,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<(String, Value)> = rows
            .iter()
            .enumerate()
            .map(|(i, (shape, blob))| {
                let shapes = vec![shape.clone(); layout.parts.len()];
                (format!("key-{i}-é"), record(&layout, &shapes, blob, i as u64))
            })
            .collect();
        let store = written(dir.path(), &records, flush_every);
        let mut keys: Vec<String> = records.iter().map(|(k, _)| k.clone()).collect();
        keys.push("absent".into());
        let src = Ranges::default();
        let (ranged, missing) = store.get_batch_ranged(&keys, &src).unwrap();
        prop_assert_eq!(missing, vec![keys.len() - 1]);
        let (usual, _) = store.get_batch(&keys).unwrap();
        prop_assert_eq!(&ranged, &usual);
        for ((_, want), got) in records.iter().zip(&ranged) {
            prop_assert_eq!(Some(want), got.as_ref());
        }
    }
}

#[test]
fn one_key_reads_a_few_pages_of_a_large_segment() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(String, Value)> = (0..4096)
        .map(|i| (format!("sample_{i}"), tensor(DType::F32, &[512], i)))
        .collect();
    let store = written(dir.path(), &records, 4096);
    let src = Ranges::default();
    let (got, missing) = store.get_batch_ranged(&["sample_1234"], &src).unwrap();
    assert!(missing.is_empty());
    assert_eq!(got[0].as_ref(), Some(&records[1234].1));
    let segment = std::fs::metadata(dir.path().join("segments/segment_000000.arrow"))
        .unwrap()
        .len();
    let bytes = src.bytes();
    // The tail (4 KiB), the batch metadata, two offsets a column, the key,
    // 2 KiB of elements and the dims: of an 8 MiB segment.
    assert!(bytes < 8 << 10, "{bytes} bytes of {segment}");
    // A second key of the segment: its rows only, the layout is kept.
    let before = src.read.lock().unwrap().len();
    store.get_batch_ranged(&["sample_7"], &src).unwrap();
    let after = src.read.lock().unwrap().len();
    assert_eq!(
        after - before,
        6,
        "{:?}",
        &src.read.lock().unwrap()[before..]
    );
}

/// `ranges` sorted, adjacent and overlapping ones merged.
fn merged(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| r.end > r.start);
    ranges.sort_unstable_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

#[test]
fn row_spans_are_exactly_the_ranges_each_rows_read_reads() {
    let dir = tempfile::tempdir().unwrap();
    // Rows of very different sizes (1 byte to 64 KiB of blob, tensors of
    // 1 to 700 elements): a row's place in its batch says nothing of
    // where its bytes are.
    let records: Vec<(String, Value)> = (0..1200u64)
        .map(|i| {
            let len = 1 + (i * 7919 % 65_536) as usize;
            let blob: Vec<u8> = (0..len).map(|k| (k as u64 * 31 + i) as u8).collect();
            let record = Value::dict([
                ("blob", Value::blob(blob)),
                ("t", tensor(DType::F32, &[1 + (i as usize * 37) % 700], i)),
            ]);
            (format!("sample_{i}"), record)
        })
        .collect();
    // A flush every 100 rows: several segments and batches.
    let store = written(dir.path(), &records, 100);
    let src = Ranges::default();
    let keys: Vec<&str> = [
        "sample_0",
        "sample_57",
        "sample_399",
        "sample_400",
        "sample_1199",
        "absent",
    ]
    .into();
    let spans = store.row_spans_of(&keys, &src).unwrap();
    assert!(spans[5].is_none(), "a key in no segment");
    for (key, found) in keys[..5].iter().zip(&spans) {
        let (path, ranges) = found.as_ref().unwrap();
        let before = src.read.lock().unwrap().len();
        let (got, _) = store.get_batch_ranged(&[*key], &src).unwrap();
        let i: usize = key["sample_".len()..].parse().unwrap();
        assert_eq!(got[0].as_ref(), Some(&records[i].1), "{key}");
        // What reading the row took (its layout is kept): its offsets,
        // key, blob, elements and dims, and nothing else.
        let read: Vec<(PathBuf, Range<u64>)> = src.read.lock().unwrap()[before..].to_vec();
        assert!(read.iter().all(|(p, _)| p == path), "{key}: one segment");
        let read = merged(read.into_iter().map(|(_, r)| r).collect());
        assert_eq!(&read, ranges, "{key}: the spans are the ranges read");
    }
    // The layouts are kept: placing the keys again reads their offsets
    // only (stage 3 of a read), and places them the same.
    let before = src.read.lock().unwrap().len();
    assert_eq!(store.row_spans_of(&keys, &src).unwrap(), spans);
    let again = src.read.lock().unwrap()[before..].to_vec();
    let offsets: u64 = again.iter().map(|(_, r)| r.end - r.start).sum();
    // Two 4-byte offsets for each of 4 offset arrays (key, blob, the
    // tensor's data and shape) of 5 rows.
    assert_eq!(offsets, 5 * 4 * 8, "{again:?}");
    // Every key at once: each placed as alone, the offsets of neighbouring
    // rows read as one range (a few reads a batch: its offset and validity
    // buffers).
    let every: Vec<String> = (0..1200).map(|i| format!("sample_{i}")).collect();
    let before = src.read.lock().unwrap().len();
    let all = store.row_spans_of(&every, &src).unwrap();
    let reads = src.read.lock().unwrap().len() - before;
    // (Uncoalesced: 4 offset pairs a row, 4,800.)
    assert!(reads <= 12 * 8, "{reads} reads for 12 batches of 100 rows");
    for (key, found) in keys[..5].iter().zip(&spans) {
        let i: usize = key["sample_".len()..].parse().unwrap();
        assert_eq!(&all[i], found, "{key}");
    }
    for i in 55..60 {
        let alone = store.row_spans_of(&[&every[i]], &src).unwrap();
        assert_eq!(all[i], alone[0], "sample_{i}");
    }
}

/// The first match of `pattern` in `bytes`.
fn find(bytes: &[u8], pattern: &[u8]) -> usize {
    bytes
        .windows(pattern.len())
        .position(|w| w == pattern)
        .expect("pattern in the file")
}

fn one_segment(dir: &Path) -> (SegmentStore, PathBuf) {
    let records: Vec<(String, Value)> = (0..8)
        .map(|i| (format!("k{i}"), tensor(DType::F32, &[4], i)))
        .collect();
    let store = written(dir, &records, 8);
    (store, dir.join("segments/segment_000000.arrow"))
}

fn patch(path: &Path, at: usize, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, at as u64).unwrap();
}

#[test]
fn a_key_that_is_not_utf8_is_refused_naming_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (store, path) = one_segment(dir.path());
    let at = find(&std::fs::read(&path).unwrap(), b"k0k1k2");
    patch(&path, at + 2, &[0xff]);
    let e = store
        .get_batch_ranged(&["k1"], &Ranges::default())
        .unwrap_err();
    assert!(matches!(e, Error::CorruptSegment { .. }), "{e}");
    assert!(e.to_string().contains("segment_000000.arrow") && e.to_string().contains("UTF-8"));
}

#[test]
fn offsets_outside_the_values_are_refused_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let (store, path) = one_segment(dir.path());
    // The key offsets 0, 2, 4, ...: row 3's end now lies far outside.
    let offsets: Vec<u8> = [0i32, 2, 4, 6, 8]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let at = find(&std::fs::read(&path).unwrap(), &offsets);
    patch(&path, at + 16, &0x7fff_0000i32.to_le_bytes());
    let src = Ranges::default();
    let e = store.get_batch_ranged(&["k3"], &src).unwrap_err();
    assert!(
        matches!(e, Error::CorruptSegment { .. }) && e.to_string().contains("outside"),
        "{e}"
    );
    // Rows whose offsets are sound still read.
    let (got, missing) = store.get_batch_ranged(&["k0", "k6"], &src).unwrap();
    assert!(missing.is_empty() && got.iter().all(Option::is_some));
}

#[test]
fn a_failed_fetch_is_an_error_naming_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (store, path) = one_segment(dir.path());
    let src = Ranges {
        fail: Some(path.clone()),
        ..Ranges::default()
    };
    let e = store.get_batch_ranged(&["k1"], &src).unwrap_err();
    assert!(matches!(e, Error::Fetch { .. }), "{e}");
    assert!(e.to_string().contains("segment_000000.arrow") && e.to_string().contains("said no"));
}

#[test]
fn the_whole_segment_hook_runs_before_a_map_never_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, path) = one_segment(dir.path());
    drop(store);
    let calls = std::sync::Arc::new(Mutex::new(Vec::new()));
    let seen = std::sync::Arc::clone(&calls);
    let hook = WholeSegment::new(move |p: &Path, len: u64| {
        seen.lock().unwrap().push((p.to_path_buf(), len));
        Ok(Some(File::open(p)?))
    });
    let store = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            whole_segment: Some(hook),
            ..Options::default()
        },
    )
    .unwrap();
    assert!(calls.lock().unwrap().is_empty());
    let (got, _) = store.get_batch(&["k1", "k2"]).unwrap();
    assert!(got.iter().all(Option::is_some));
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(*calls.lock().unwrap(), vec![(path, len)]);
    // A hook that fails: the segment is not mapped, its keys read missing
    // and the problem names the fetch.
    drop(store);
    let store = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            whole_segment: Some(WholeSegment::new(|_: &Path, _: u64| Err("offline".into()))),
            ..Options::default()
        },
    )
    .unwrap();
    let (_, missing) = store.get_batch(&["k1"]).unwrap();
    assert_eq!(missing, vec![0]);
    assert!(
        store
            .problems()
            .iter()
            .any(|p| p.detail.contains("offline"))
    );
}

#[test]
fn a_segment_the_reader_wants_whole_is_read_as_usual() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<(String, Value)> = (0..64)
        .map(|i| (format!("k{i}"), tensor(DType::F32, &[8], i)))
        .collect();
    let store = written(dir.path(), &records, 32);
    let src = Ranges {
        whole_from: Some(3),
        ..Ranges::default()
    };
    // Two keys of segment 0 through ranges, four of segment 1 whole.
    let keys = ["k1", "k2", "k40", "k41", "k42", "k43"];
    let (got, missing) = store.get_batch_ranged(&keys, &src).unwrap();
    assert!(missing.is_empty());
    for (k, v) in keys.iter().zip(&got) {
        let i: usize = k[1..].parse().unwrap();
        assert_eq!(v.as_ref(), Some(&records[i].1));
    }
    let read = src.read.lock().unwrap();
    let of = |seg: &str| read.iter().filter(|(p, _)| p.ends_with(seg)).count();
    // Segment 1: its footer and batch metadata only (the layout says how
    // many rows it has); segment 0: those and its rows' ranges too.
    assert_eq!(of("segment_000001.arrow"), 3);
    assert!(of("segment_000000.arrow") > 3);
}
