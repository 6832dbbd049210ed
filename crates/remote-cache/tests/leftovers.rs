//! What dead processes leave in a tier and a working directory — fetch
//! temporaries, fetch-lock files, pin records,
//! link, copy and block-list temporaries — is swept when a store opens,
//! not only when the tier evicts; what a living process holds stays.

#[allow(unused_imports)]
mod common;

use std::path::{Path, PathBuf};

use common::{keyed, small_tier};
use durable_fs::FileLock;
use remote_cache::{Location, SegmentsAt};
use tensor_core::{Tensor, Value};

fn record(i: usize) -> Value {
    Value::from(Tensor::from_vec([4], vec![i as i32; 4]).unwrap())
}

/// The pid of a process that has exited.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn plant(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, b"left over").unwrap();
    path.to_path_buf()
}

#[test]
fn leftovers_of_dead_processes_are_swept_on_open() {
    let scratch = tempfile::tempdir().unwrap();
    let bucket = scratch.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let url = format!("file://{}", bucket.display());
    let (tier_dir, work) = (scratch.path().join("tier"), scratch.path().join("work"));
    let location = |dir: &Path| {
        Location::remote(&url, small_tier(&tier_dir, 1 << 30)).with_work_dir(dir.to_path_buf())
    };
    let writer = SegmentsAt::open(
        &location(&scratch.path().join("writer")),
        segment_store::Options {
            flush_every: 4,
            ..segment_store::Options::default()
        },
    )
    .unwrap();
    writer.put_batch(&keyed("k", 0..16, record)).unwrap();
    writer.publish().unwrap();
    let reader_options = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    drop(SegmentsAt::open(&location(&work), reader_options.clone()).unwrap());

    let (host, dead, me) = (durable_fs::host_name(), dead_pid(), std::process::id());
    let swept = [
        plant(&tier_dir.join(format!("tmp/objects%2Fx.{host}.{dead}.0.tmp"))),
        plant(&tier_dir.join("locks/objects%2Fx.3.fetch")),
        plant(&tier_dir.join("locks/objects%2Fx.all.fetch")),
        plant(&tier_dir.join(format!("pins/{host}-{dead}-1-0"))),
        plant(&work.join(format!("segments/link.{host}.{dead}.1.tmp"))),
        plant(&work.join(format!("schema.json.{host}.{dead}.2.tmp"))),
        plant(&work.join(".cachex-remote/blocks/0123.json.tmp")),
    ];
    // A living process's: a fetch lock held, a fetch in flight, a link
    // being made.
    let held = FileLock::exclusive(&tier_dir.join("locks/objects%2Fy.0.fetch")).unwrap();
    let kept = [
        plant(&tier_dir.join(format!("tmp/objects%2Fy.{host}.{me}.0.tmp"))),
        plant(&work.join(format!("segments/link.{host}.{me}.1.tmp"))),
        held.path().to_path_buf(),
    ];

    let reader = SegmentsAt::open(&location(&work), reader_options).unwrap();
    let (records, missing) = reader.get_batch(&["k3", "k12"]).unwrap();
    assert!(missing.is_empty());
    assert!(records[0].as_ref() == Some(&record(3)));
    for path in &swept {
        assert!(!path.exists(), "{} was left", path.display());
    }
    for path in &kept {
        assert!(path.exists(), "{} was removed", path.display());
    }
    drop(held);
}
