//! Damaged finished caches: every problem is a typed error naming the file,
//! never a panic.

mod common;

use std::fs::OpenOptions;
use std::path::Path;

use memmap_array::{Error, MemmapArray};

fn built(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::build(dir.path(), n);
    dir
}

fn set_len(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn short_and_long_bin_files_are_refused_at_open() {
    for delta in [-1i64, 1, -12, 4096] {
        let dir = built(5);
        let path = dir.path().join("data.bin");
        set_len(&path, (60 + delta) as u64);
        let e = MemmapArray::open(dir.path()).unwrap_err();
        assert!(
            matches!(&e, Error::BinSize { expected: 60, actual, rows: 5, row_bytes: 12, .. } if *actual == (60 + delta) as u64),
            "{e}"
        );
        assert!(e.to_string().contains("data.bin"), "{e}");
    }
}

#[test]
fn missing_complete_sentinel_is_incomplete() {
    let dir = built(2);
    std::fs::remove_file(dir.path().join("_COMPLETE")).unwrap();
    assert!(matches!(
        MemmapArray::open(dir.path()),
        Err(Error::Incomplete { .. })
    ));
}

fn shapes_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("shapes.json")).unwrap()).unwrap()
}

fn open_with_shapes(edit: impl FnOnce(&mut serde_json::Value)) -> Error {
    let dir = built(3);
    let mut shapes = shapes_json(dir.path());
    edit(&mut shapes);
    std::fs::write(
        dir.path().join("shapes.json"),
        serde_json::to_vec(&shapes).unwrap(),
    )
    .unwrap();
    MemmapArray::open(dir.path()).unwrap_err()
}

#[test]
fn corrupt_shapes_json_is_a_typed_error() {
    let e = open_with_shapes(|s| s["version"] = 99.into());
    assert!(
        matches!(e, Error::UnsupportedVersion { found: 99, .. }),
        "{e}"
    );
    let e = open_with_shapes(|s| s["arrays"][0]["dtype"] = "<c16".into());
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = open_with_shapes(|s| s["arrays"][0]["row_bytes"] = 13.into());
    assert!(e.to_string().contains("row_bytes 13"), "{e}");
    let e = open_with_shapes(|s| s["arrays"][0]["shape"] = serde_json::json!([u64::MAX, 4]));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = open_with_shapes(|s| s["rows"] = u64::MAX.into());
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = open_with_shapes(|s| s["rows"] = 4.into());
    assert!(matches!(e, Error::BinSize { .. }), "{e}");
    let e = open_with_shapes(|s| s["arrays"][0]["name"] = "../../etc".into());
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = open_with_shapes(|s| s["format"] = "something-else".into());
    assert!(e.to_string().contains("shapes.json"), "{e}");

    let dir = built(1);
    std::fs::write(dir.path().join("shapes.json"), b"{\"rows\": ").unwrap();
    let e = MemmapArray::open(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Json { .. }), "{e}");
    assert!(e.to_string().contains("shapes.json"), "{e}");
}

#[test]
fn corrupt_index_parquet_never_panics() {
    let dir = built(20);
    let path = dir.path().join("index.parquet");
    let good = std::fs::read(&path).unwrap();
    // Garbage, truncations and single-byte flips across the whole file.
    std::fs::write(&path, b"not parquet at all").unwrap();
    let e = MemmapArray::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("index.parquet"), "{e}");
    for cut in [0, 4, good.len() / 2, good.len() - 1] {
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(MemmapArray::open(dir.path()).is_err(), "cut at {cut}");
    }
    let step = (good.len() / 97).max(1);
    for pos in (0..good.len()).step_by(step) {
        let mut bad = good.clone();
        bad[pos] ^= 0x5a;
        std::fs::write(&path, &bad).unwrap();
        // Either an error, or (for a flip the format cannot see, e.g. in
        // snappy-compressed padding) a cache whose rows still read safely.
        if let Ok(cache) = MemmapArray::open(dir.path()) {
            for i in 0..cache.len() {
                let _ = cache.row(i).map(|r| r.sidecar("config").map(|_| ()));
            }
        }
    }
}

#[test]
fn index_of_another_schema_is_refused() {
    let other = tempfile::tempdir().unwrap();
    let mut w = memmap_array::RowWriter::create_or_resume(
        other.path(),
        &memmap_array::Schema::builder()
            .array("data", tensor_core::DType::I16, [2, 3])
            .build()
            .unwrap(),
        "x",
    )
    .unwrap();
    let d = common::data(0);
    for _ in 0..3 {
        w.write(&memmap_array::NewRow::new("s").array("data", d.view()))
            .unwrap();
    }
    w.finalize().unwrap();
    let dir = built(3);
    std::fs::copy(
        other.path().join("index.parquet"),
        dir.path().join("index.parquet"),
    )
    .unwrap();
    let e = MemmapArray::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("columns"), "{e}");
}

#[test]
fn corrupt_sidecar_is_an_error_on_first_use() {
    let cases: [&[u8]; 4] = [
        b"[1, 2]",
        b"{\"0\": \"a\", \"7\": \"b\"}",
        b"{\"zero\": \"a\"}",
        b"{\"0\": ",
    ];
    for bad in cases {
        let dir = built(4);
        std::fs::write(dir.path().join("config.json"), bad).unwrap();
        let cache = MemmapArray::open(dir.path()).unwrap();
        let e = cache.sidecar("config", 1).unwrap_err();
        assert!(e.to_string().contains("config.json"), "{e}");
        // The arrays are still readable.
        assert!(cache.row(1).unwrap().get("data").unwrap().is_some());
    }
    // Fewer entries than the index refers to.
    let dir = built(4);
    std::fs::write(dir.path().join("config.json"), b"{\"0\": \"a\"}").unwrap();
    let cache = MemmapArray::open(dir.path()).unwrap();
    let e = cache.sidecar("config", 1).unwrap_err();
    assert!(e.to_string().contains("refers to key"), "{e}");
}

#[test]
fn corrupt_fingerprint_json_is_a_typed_error() {
    let dir = built(1);
    std::fs::write(dir.path().join("fingerprint.json"), b"{{{").unwrap();
    let e = MemmapArray::open(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Json { .. }), "{e}");
    assert!(e.to_string().contains("fingerprint.json"), "{e}");
}

#[test]
fn missing_bin_file_is_an_io_error_naming_it() {
    let dir = built(2);
    std::fs::remove_file(dir.path().join("score.bin")).unwrap();
    let e = MemmapArray::open(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("score.bin"), "{e}");
}

mod mutated {
    use super::*;
    use memmap_array::fuzz_entry;
    use proptest::prelude::*;

    /// Valid shapes.json, manifest.jsonl and sidecar bytes to mutate
    /// (built once for all cases).
    fn seeds() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        static SEEDS: std::sync::OnceLock<(Vec<u8>, Vec<u8>, Vec<u8>)> = std::sync::OnceLock::new();
        SEEDS.get_or_init(make_seeds).clone()
    }

    fn make_seeds() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
        let dir = built(6);
        let shapes = std::fs::read(dir.path().join("shapes.json")).unwrap();
        let sidecar = std::fs::read(dir.path().join("config.json")).unwrap();
        let unfinished = tempfile::tempdir().unwrap();
        let mut w = common::writer(unfinished.path(), 1);
        for i in 0..6 {
            common::write_row(&mut w, i);
        }
        drop(w);
        let manifest = std::fs::read(unfinished.path().join("manifest.jsonl")).unwrap();
        (shapes, manifest, sidecar)
    }

    fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: usize) -> Vec<u8> {
        for &(pos, x) in flips {
            if !bytes.is_empty() {
                let at = pos % bytes.len();
                bytes[at] ^= x;
            }
        }
        let keep = bytes.len() - cut % (bytes.len() + 1);
        bytes.truncate(keep);
        bytes
    }

    #[test]
    fn seeds_parse() {
        let (shapes, manifest, sidecar) = seeds();
        assert_eq!(fuzz_entry::shapes_json(&shapes).unwrap(), 6);
        assert_eq!(fuzz_entry::manifest_jsonl(&manifest).unwrap(), 6);
        assert_eq!(fuzz_entry::sidecar_json(&sidecar).unwrap(), 3);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Flipped bytes and truncations give a result or a typed error,
        /// never a panic.
        #[test]
        fn mutated_files_never_panic(
            flips in proptest::collection::vec((any::<usize>(), 1u8..), 0..4),
            cut in any::<usize>(),
        ) {
            let (shapes, manifest, sidecar) = seeds();
            let _ = fuzz_entry::shapes_json(&mutate(shapes, &flips, cut));
            let rows = fuzz_entry::manifest_jsonl(&mutate(manifest, &flips, cut));
            if let Ok(rows) = rows {
                prop_assert!(rows <= 6);
            }
            let _ = fuzz_entry::sidecar_json(&mutate(sidecar, &flips, cut));
        }
    }
}
