//! Crash points, resume, truncation and corruption of an unfinished cache.

mod common;

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use memmap_array::{Error, MANIFEST_FILE, MemmapArray, RowWriter, Schema, WriterOptions};
use tensor_core::DType;

fn append(path: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(bytes).unwrap();
}

fn resume_and_finish(dir: &Path, from: usize, n: usize) {
    let mut w = common::writer(dir, 2);
    let keys: Vec<String> = (0..from).map(common::source).collect();
    assert_eq!(w.resume_keys(), &keys[..]);
    assert_eq!(w.committed_rows(), from as u64);
    for i in from..n {
        assert!(!w.resume_key_set().contains(common::source(i).as_str()));
        common::write_row(&mut w, i);
    }
    w.finalize().unwrap();
    common::check_rows(&MemmapArray::open(dir).unwrap(), n);
}

#[test]
fn crash_after_bin_append_before_manifest_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..3 {
        common::write_row(&mut w, i);
    }
    drop(w);
    // Row 3's bytes reached every .bin, its manifest line never did.
    append(&dir.path().join("data.bin"), common::data(3).bytes());
    append(&dir.path().join("mask.bin"), common::mask(3).bytes());
    append(&dir.path().join("score.bin"), &[1, 2]); // and a torn one
    resume_and_finish(dir.path(), 3, 6);
}

#[test]
fn crash_with_rows_waiting_for_group_commit_loses_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 4);
    for i in 0..6 {
        common::write_row(&mut w, i);
    }
    assert_eq!(w.committed_rows(), 4);
    // Dropping without flush is a crash: rows 4 and 5 are lost, 0..4 kept.
    drop(w);
    resume_and_finish(dir.path(), 4, 7);
}

#[test]
fn explicit_flush_commits_with_sync_every_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 0);
    for i in 0..3 {
        common::write_row(&mut w, i);
    }
    assert_eq!(w.committed_rows(), 0);
    w.flush().unwrap();
    assert_eq!(w.committed_rows(), 3);
    common::write_row(&mut w, 3);
    drop(w);
    resume_and_finish(dir.path(), 3, 5);
}

#[test]
fn manifest_cut_at_every_byte_resumes_to_the_complete_lines() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..3 {
        common::write_row(&mut w, i);
    }
    drop(w);
    let manifest = std::fs::read(dir.path().join(MANIFEST_FILE)).unwrap();
    let newlines: Vec<usize> = manifest
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1)
        .collect();
    let header_end = newlines[0];
    let saved = tempfile::tempdir().unwrap();
    for name in ["data.bin", "mask.bin", "score.bin"] {
        std::fs::copy(dir.path().join(name), saved.path().join(name)).unwrap();
    }
    for cut in header_end..=manifest.len() {
        std::fs::write(dir.path().join(MANIFEST_FILE), &manifest[..cut]).unwrap();
        for name in ["data.bin", "mask.bin", "score.bin"] {
            std::fs::copy(saved.path().join(name), dir.path().join(name)).unwrap();
        }
        let complete_lines = newlines.iter().filter(|&&e| e <= cut).count() - 1;
        let w = common::writer(dir.path(), 1);
        assert_eq!(w.committed_rows(), complete_lines as u64, "cut at {cut}");
        drop(w);
        // The torn tail is gone and every .bin is cut to the committed rows.
        let kept = newlines[complete_lines];
        assert_eq!(common::file_len(dir.path(), MANIFEST_FILE), kept as u64);
        assert_eq!(
            common::file_len(dir.path(), "data.bin"),
            complete_lines as u64 * 12
        );
    }
    resume_and_finish(dir.path(), 3, 4);
}

#[test]
fn crash_during_finalize_is_finished_by_the_next_writer() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..4 {
        common::write_row(&mut w, i);
    }
    drop(w);
    // Leftovers of a finalize that died before _COMPLETE.
    std::fs::write(dir.path().join("index.parquet.tmp"), b"half a file").unwrap();
    std::fs::write(dir.path().join("shapes.json"), b"{\"stale\": true}").unwrap();
    assert!(matches!(
        MemmapArray::open(dir.path()),
        Err(Error::Incomplete { .. })
    ));
    resume_and_finish(dir.path(), 4, 4);
    assert!(!dir.path().join("index.parquet.tmp").exists());
}

#[test]
fn corrupt_middle_line_is_an_error_not_a_silent_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..3 {
        common::write_row(&mut w, i);
    }
    drop(w);
    let path = dir.path().join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = "{garbage";
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let e = common::writer_result(dir.path()).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("manifest.jsonl"), "{e}");
}

#[test]
fn out_of_sequence_row_numbers_are_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..2 {
        common::write_row(&mut w, i);
    }
    drop(w);
    let path = dir.path().join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replacen("{\"row\":1,", "{\"row\":7,", 1)).unwrap();
    let e = common::writer_result(dir.path()).unwrap_err();
    assert!(e.to_string().contains("row number 7, expected 1"), "{e}");
}

#[test]
fn short_bin_under_committed_rows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    for i in 0..3 {
        common::write_row(&mut w, i);
    }
    drop(w);
    let f = OpenOptions::new()
        .write(true)
        .open(dir.path().join("data.bin"))
        .unwrap();
    f.set_len(20).unwrap();
    let e = common::writer_result(dir.path()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::BinSize {
                expected: 36,
                actual: 20,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn resume_with_another_schema_or_fingerprint_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = common::writer(dir.path(), 1);
    common::write_row(&mut w, 0);
    drop(w);
    let other = Schema::builder()
        .array("data", DType::I16, [2, 4])
        .build()
        .unwrap();
    let e = RowWriter::create_or_resume(dir.path(), &other, "fp-1").unwrap_err();
    assert!(matches!(e, Error::SchemaMismatch { .. }), "{e}");
    let e = RowWriter::create_or_resume(dir.path(), &common::schema(), "fp-2").unwrap_err();
    assert!(matches!(e, Error::FingerprintMismatch { .. }), "{e}");
    // The refused attempts changed nothing.
    resume_and_finish(dir.path(), 1, 2);
}

#[test]
fn a_complete_cache_is_not_reopened_for_writing() {
    let dir = tempfile::tempdir().unwrap();
    common::build(dir.path(), 2);
    let e = RowWriter::create_or_resume_with(
        dir.path(),
        &common::schema(),
        "fp-1",
        WriterOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::AlreadyComplete { .. }), "{e}");
}

mod garbage {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever follows the committed lines, opening a writer either
        /// recovers the committed rows or returns a typed error; it never
        /// panics and never loses a committed row.
        #[test]
        fn garbage_after_committed_rows(tail in proptest::collection::vec(any::<u8>(), 0..200),
                                        newline_at_end in any::<bool>()) {
            let dir = tempfile::tempdir().unwrap();
            let mut w = common::writer(dir.path(), 1);
            for i in 0..2 {
                common::write_row(&mut w, i);
            }
            drop(w);
            let mut tail = tail;
            if newline_at_end {
                tail.push(b'\n');
            }
            append(&dir.path().join(MANIFEST_FILE), &tail);
            match common::writer_result(dir.path()) {
                Ok(w) => prop_assert!(w.committed_rows() >= 2),
                Err(e) => prop_assert!(matches!(e, Error::Corrupt { .. }), "{e}"),
            }
        }
    }
}
