//! Crash points of finalize, stale temporary files, the writer lock, and
//! FFCV's unfinished-file marker.

mod common;

use common::{Blobs, blob_schema, payload, write_blobs};
use page_alloc::beton;
use page_alloc::{Error, FinalizeStep, PageReader, PageWriter, WriterOptions, recover, temp_path};

fn first_blob(path: &std::path::Path) -> Vec<u8> {
    let r = PageReader::open(path).unwrap();
    r.sample(0).unwrap().bytes(1).unwrap().to_vec()
}

#[test]
fn crash_at_every_finalize_step_leaves_old_file_or_new_file() {
    for step in FinalizeStep::ALL {
        for with_old in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("c.pages");
            if with_old {
                write_blobs(&path, &[10, 20, 30]);
            }
            let mut w = PageWriter::create(
                &path,
                blob_schema(),
                WriterOptions::default().page_size(4096),
            )
            .unwrap();
            w.write_parallel(&Blobs(vec![5000, 7, 300]), 2).unwrap();
            w.finalize_interrupted(step).unwrap();
            let tmp = temp_path(&path);
            if step < FinalizeStep::Rename {
                assert!(tmp.exists(), "{step:?}: temp file kept");
                if with_old {
                    assert_eq!(
                        first_blob(&path),
                        payload(0, 10),
                        "{step:?}: old file intact"
                    );
                } else {
                    assert!(!path.exists(), "{step:?}: no file at the final path");
                }
                // The temp file is only valid once its footer is written.
                match PageReader::open(&tmp) {
                    Ok(r) => {
                        assert!(
                            step >= FinalizeStep::WriteFooter,
                            "{step:?}: uncommitted temp read as valid"
                        );
                        assert_eq!(r.len(), 3);
                    }
                    Err(e) => {
                        assert!(step < FinalizeStep::WriteFooter, "{step:?}: {e}");
                        assert!(e.is_bad_file(), "{step:?}: {e}");
                    }
                }
                assert!(
                    recover(&path).unwrap(),
                    "{step:?}: recover removes the temp"
                );
                assert!(!tmp.exists());
            } else {
                assert_eq!(
                    first_blob(&path),
                    payload(0, 5000),
                    "{step:?}: new file in place"
                );
                assert!(!recover(&path).unwrap());
            }
            // A new writer can always start again.
            write_blobs(&path, &[1]);
            assert_eq!(first_blob(&path), payload(0, 1));
        }
    }
}

#[test]
fn dropping_an_unfinished_writer_removes_its_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.pages");
    write_blobs(&path, &[4]);
    {
        let mut w = PageWriter::create(&path, blob_schema(), WriterOptions::default()).unwrap();
        w.write_parallel(&Blobs(vec![100; 10]), 1).unwrap();
        assert!(temp_path(&path).exists());
    }
    assert!(!temp_path(&path).exists());
    assert_eq!(first_blob(&path), payload(0, 4));
}

#[test]
fn a_second_writer_gets_a_lock_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("l.pages");
    let w = PageWriter::create(&path, blob_schema(), WriterOptions::default()).unwrap();
    let err = PageWriter::create(&path, blob_schema(), WriterOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("l.pages"), "{err}");
    // recover refuses to touch a live writer's temp file.
    assert!(matches!(recover(&path), Err(Error::Locked { .. })));
    w.finalize().unwrap();
    PageWriter::create(&path, blob_schema(), WriterOptions::default()).unwrap();
}

#[test]
fn truncated_files_are_never_read_as_valid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.pages");
    write_blobs(&path, &[100, 5000, 200, 9000]);
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.path().join("cut.pages");
    for len in (0..bytes.len())
        .step_by(97)
        .chain([bytes.len() - 1, bytes.len() - 64])
    {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let err = PageReader::open(&cut).unwrap_err();
        assert!(err.is_bad_file(), "length {len}: {err}");
    }
}

#[test]
fn unfinished_beton_is_reported_as_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes =
        std::fs::read(test_support::fixtures_dir().join("ffcv/small_w1.beton")).unwrap();
    bytes[16..24].fill(0); // what FFCV leaves when it dies before finalize
    let path = dir.path().join("unfinished.beton");
    std::fs::write(&path, &bytes).unwrap();
    let err = beton::read(&path).unwrap_err();
    assert!(matches!(err, Error::Incomplete { .. }), "{err}");
    assert!(err.to_string().contains("unfinished.beton"), "{err}");
}
