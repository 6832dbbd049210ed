//! memmap-array under SIGKILL and injected I/O failures: every row the
//! writer committed survives, resume finishes the cache, nothing is torn.

use std::path::Path;

use memmap_array::{MemmapArray, NewRow, RowWriter, Schema, WriterOptions};
use reliability::{Fault, crash_loop, sweep};
use tensor_core::{DType, Tensor};
use test_support::crash::{child_args, report_commit, report_error};

fn schema() -> Schema {
    Schema::builder()
        .array("x", DType::U16, [64])
        .sidecar("tag")
        .build()
        .expect("schema")
}

fn row_values(i: usize) -> Vec<u16> {
    (0..64).map(|k| (i * 131 + k * 7) as u16).collect()
}

fn write_row(w: &mut RowWriter, i: usize) -> memmap_array::Result<()> {
    let t = Tensor::from_vec([64], row_values(i)).expect("tensor");
    let id = format!("s{i:05}");
    let tag = if i.is_multiple_of(2) { "even" } else { "odd" };
    w.write(&NewRow::new(&id).array("x", t.view()).sidecar("tag", tag))
}

fn run_writer(dir: &Path, rows: usize, sync_every: usize) -> memmap_array::Result<()> {
    let opts = WriterOptions { sync_every };
    let mut w =
        RowWriter::create_or_resume_with(dir, &schema(), serde_json::json!({"v": 1}), opts)?;
    for i in 0..rows {
        write_row(&mut w, i)?;
        if sync_every == 1 {
            report_commit(&i.to_string());
        } else if (i + 1) % sync_every == 0 {
            // The group commit happened inside write(): rows 0..=i are durable.
            report_commit(&i.to_string());
        }
    }
    w.finalize()?;
    report_commit("final");
    Ok(())
}

#[test]
fn child_writer() {
    if let Some(args) = child_args() {
        let result = match args.role.as_str() {
            "long" => run_writer(&args.dir, 3000, 1),
            _ => run_writer(&args.dir, 6, 2),
        };
        if let Err(e) = result {
            report_error(&e.to_string());
        }
    }
}

/// Finishes the cache by resuming, then checks every row byte-exact and
/// that every committed row is there.
fn check(dir: &Path, committed: &[String], rows: usize) {
    let last_row: Option<usize> = committed.iter().filter_map(|c| c.parse().ok()).max();
    let finalized = committed.iter().any(|c| c == "final");
    if !dir.join(memmap_array::COMPLETE_FILE).exists() {
        assert!(!finalized, "finalize returned but _COMPLETE is missing");
        let mut w = RowWriter::create_or_resume(dir, &schema(), serde_json::json!({"v": 1}))
            .unwrap_or_else(|e| panic!("resume after crash: {e}"));
        let done: std::collections::HashSet<String> = w.resume_keys().iter().cloned().collect();
        if let Some(last) = last_row {
            for i in 0..=last {
                assert!(done.contains(&format!("s{i:05}")), "committed row {i} lost");
            }
        }
        for i in 0..rows {
            if !done.contains(&format!("s{i:05}")) {
                write_row(&mut w, i).expect("write after resume");
            }
        }
        w.finalize().expect("finalize after resume");
    }
    let cache = MemmapArray::open(dir).unwrap_or_else(|e| panic!("open finished cache: {e}"));
    assert_eq!(cache.len() as usize, rows, "every row exactly once");
    for r in 0..cache.len() {
        let row = cache.row(r).expect("row");
        let i: usize = row.source()[1..].parse().expect("source id");
        let x = row.get("x").expect("x").expect("x present");
        assert_eq!(
            x.to_tensor().as_slice::<u16>().expect("u16"),
            &row_values(i)[..],
            "row {i}"
        );
        let tag = row.sidecar("tag").expect("sidecar");
        assert_eq!(tag, Some(if i.is_multiple_of(2) { "even" } else { "odd" }));
    }
    assert!(
        memmap_array::verify(dir).is_empty(),
        "{:?}",
        memmap_array::verify(dir)
    );
}

#[test]
fn sigkill_loop() {
    crash_loop("child_writer", "long", 50, |dir, _, out| {
        if dir.exists() {
            check(dir, &out.committed, 3000);
        } else {
            assert!(out.committed.is_empty());
        }
    });
}

#[test]
fn every_io_failure_point_eio() {
    sweep(
        "memmap-array",
        "child_writer",
        "short",
        1,
        Fault::Eio,
        |dir, out| {
            if dir.exists() {
                check(dir, &out.committed, 6);
            }
        },
    );
}

#[test]
fn every_io_failure_point_disk_full() {
    sweep(
        "memmap-array",
        "child_writer",
        "short",
        2,
        Fault::DiskFull,
        |dir, out| {
            if dir.exists() {
                check(dir, &out.committed, 6);
            }
        },
    );
}
