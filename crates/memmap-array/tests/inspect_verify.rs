//! `inspect` reports and `verify` problem lists.

mod common;

use std::fs::OpenOptions;

use memmap_array::{NewRow, RowWriter, Schema, inspect, verify};
use tensor_core::{DType, Tensor};

#[test]
fn inspect_reports_a_complete_cache() {
    let dir = tempfile::tempdir().unwrap();
    let n = 20;
    drop(common::build(dir.path(), n));
    let report = inspect(dir.path()).unwrap();
    assert!(report.complete);
    assert_eq!(report.rows, n as u64);
    assert_eq!(report.arrays.len(), 3);
    let mask = &report.arrays[1];
    assert_eq!((mask.name.as_str(), mask.nullable), ("mask", true));
    assert_eq!(mask.absent_rows, 10);
    assert_eq!(report.arrays[0].file_bytes, n as u64 * 12);
    assert_eq!(report.projected_ram_bytes, n as u64 * (12 + 4 + 4));
    let side = &report.sidecars[0];
    assert_eq!(side.unique_values, 3);
    assert_eq!(side.rows_with_value, 16);
    let expected_logical: u64 = (0..n)
        .filter(|i| !i.is_multiple_of(5))
        .map(|i| common::config(i).len() as u64)
        .sum();
    assert_eq!(side.logical_bytes, expected_logical);
    assert!(side.dedup_ratio() > 4.0, "{}", side.dedup_ratio());
    let names: Vec<&str> = report.files.iter().map(|f| f.name.as_str()).collect();
    for f in [
        "_COMPLETE",
        "config.json",
        "data.bin",
        "index.parquet",
        "shapes.json",
    ] {
        assert!(names.contains(&f), "{names:?}");
    }
    let table = report.to_string();
    for needle in [
        "complete, 20 rows",
        "mask",
        "config",
        "dedup",
        "load_in_memory",
        "index.parquet",
    ] {
        assert!(table.contains(needle), "{needle} missing from\n{table}");
    }
}

#[test]
fn inspect_reports_an_unfinished_cache_from_its_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..7 {
        common::write_row(&mut w, i);
    }
    drop(w);
    let report = inspect(dir.path()).unwrap();
    assert!(!report.complete);
    assert_eq!(report.rows, 7);
    assert_eq!(report.arrays[1].absent_rows, 3);
    assert_eq!(report.sidecars[0].unique_values, 3);
    assert!(report.to_string().contains("NOT complete"));
}

#[test]
fn verify_finds_nothing_in_a_sound_cache() {
    let dir = tempfile::tempdir().unwrap();
    drop(common::build(dir.path(), 9));
    assert_eq!(verify(dir.path()), vec![]);
}

#[test]
fn verify_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    drop(common::build(dir.path(), 9));
    OpenOptions::new()
        .write(true)
        .open(dir.path().join("data.bin"))
        .unwrap()
        .set_len(50)
        .unwrap();
    std::fs::write(dir.path().join("config.json"), b"{\"0\": \"only one\"}").unwrap();
    std::fs::write(dir.path().join("fingerprint.json"), b"nope").unwrap();
    std::fs::write(dir.path().join("shapes.json.tmp"), b"").unwrap();
    let problems = verify(dir.path());
    let files: Vec<String> = problems
        .iter()
        .map(|p| p.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        files,
        [
            "shapes.json.tmp",
            "data.bin",
            "config.json",
            "fingerprint.json"
        ],
        "{problems:?}"
    );
    assert!(
        problems[1].detail.contains("50 bytes on disk"),
        "{}",
        problems[1]
    );
    assert!(
        problems[2].detail.contains("refer to keys"),
        "{}",
        problems[2]
    );
}

#[test]
fn verify_reports_an_unfinished_cache_and_its_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    common::write_row(&mut w, 0);
    drop(w);
    let manifest = dir.path().join("manifest.jsonl");
    let mut text = std::fs::read(&manifest).unwrap();
    text.extend_from_slice(b"{\"row\":1,\"sou");
    std::fs::write(&manifest, text).unwrap();
    let problems = verify(dir.path());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].detail.contains("never finalized"));
    assert!(problems[1].detail.contains("torn"), "{}", problems[1]);
    // A committed row whose bytes are gone is a problem too.
    std::fs::write(dir.path().join("data.bin"), b"").unwrap();
    let problems = verify(dir.path());
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[2].path.ends_with("data.bin"), "{}", problems[2]);
}

#[test]
fn verify_checks_bool_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::builder()
        .array("flags", DType::Bool, [3])
        .build()
        .unwrap();
    let mut w = RowWriter::create_or_resume(dir.path(), &schema, ()).unwrap();
    let t = Tensor::from_vec([3], vec![true, false, true]).unwrap();
    w.write(&NewRow::new("a").array("flags", t.view())).unwrap();
    w.finalize().unwrap();
    assert_eq!(verify(dir.path()), vec![]);
    std::fs::write(dir.path().join("flags.bin"), [1, 7, 0]).unwrap();
    let problems = verify(dir.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].detail.contains("0x07 at offset 1"),
        "{}",
        problems[0]
    );
}
