//! page-alloc under SIGKILL and injected I/O failures: a file is either
//! absent, the old committed version or the new one — never torn.

use std::path::Path;

use page_alloc::{PageReader, PageWriter, Schema, Value, WriterOptions};
use reliability::{Fault, crash_loop, sweep};
use test_support::crash::{child_args, report_commit, report_error};

fn sample_bytes(version: u64, i: usize) -> Vec<u8> {
    (0..(200 + (i * 37) % 3000))
        .map(|k| (k as u64 * 31 + version * 7 + i as u64) as u8)
        .collect()
}

fn samples_of(version: u64) -> usize {
    40 + version as usize * 10
}

fn write_version(path: &Path, version: u64) -> page_alloc::Result<()> {
    let schema = Schema::new().int("version").bytes("payload");
    let opts = WriterOptions {
        page_size: 64 << 10,
        ..WriterOptions::default()
    };
    let mut writer = PageWriter::create(path, schema, opts)?;
    for i in 0..samples_of(version) {
        let bytes = sample_bytes(version, i);
        writer.append(&[Value::Int(version as i64), Value::Bytes(&bytes)])?;
    }
    writer.finalize()?;
    Ok(())
}

#[test]
fn child_writer() {
    if let Some(args) = child_args() {
        std::fs::create_dir_all(&args.dir).expect("dir");
        let path = args.dir.join("data.pages");
        let versions = if args.role == "long" { 200 } else { 2 };
        for v in 1..=versions {
            match write_version(&path, v) {
                Ok(()) => report_commit(&v.to_string()),
                Err(e) => return report_error(&e.to_string()),
            }
        }
    }
}

/// The file is absent (nothing committed yet) or exactly one version, at
/// least the last committed one; a new writer can always replace it.
fn check(dir: &Path, committed: &[String]) {
    let path = dir.join("data.pages");
    let last: Option<u64> = committed.last().map(|c| c.parse().expect("version"));
    if path.exists() {
        let reader =
            PageReader::open(&path).unwrap_or_else(|e| panic!("committed file unreadable: {e}"));
        let n = reader.len();
        let version = reader
            .sample(0)
            .and_then(|s| s.int(0))
            .expect("version field") as u64;
        assert_eq!(n, samples_of(version), "sample count of version {version}");
        if let Some(last) = last {
            assert!(
                version == last || version == last + 1,
                "found version {version}, last committed {last}"
            );
        }
        for i in 0..n {
            let s = reader.sample(i).expect("sample");
            assert_eq!(s.int(0).expect("int"), version as i64);
            assert_eq!(
                s.bytes(1).expect("bytes"),
                &sample_bytes(version, i)[..],
                "sample {i}"
            );
        }
        assert!(
            page_alloc::verify(&path).is_empty(),
            "verify flags a committed file"
        );
    } else {
        assert!(last.is_none(), "committed version {last:?} lost");
    }
    std::fs::create_dir_all(dir).expect("dir");
    write_version(&path, 999).expect("a new writer after the crash");
    assert_eq!(
        PageReader::open(&path).expect("reopen").len(),
        samples_of(999)
    );
}

#[test]
fn sigkill_loop() {
    crash_loop("child_writer", "long", 50, |dir, _, out| {
        check(dir, &out.committed)
    });
}

#[test]
fn every_io_failure_point_eio() {
    sweep(
        "page-alloc",
        "child_writer",
        "short",
        1,
        Fault::Eio,
        |dir, out| check(dir, &out.committed),
    );
}

#[test]
fn every_io_failure_point_disk_full() {
    sweep(
        "page-alloc",
        "child_writer",
        "short",
        2,
        Fault::DiskFull,
        |dir, out| check(dir, &out.committed),
    );
}
