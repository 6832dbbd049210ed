//! `open_or_build`: hit, build, resume, and rebuild with the reason.

use std::path::Path;

use fingerprint::{Mode, StaleReason, stamp_sources};
use memmap_array::{
    Error, NewRow, Outcome, RebuildReason, RowWriter, Schema, WriterOptions, open_or_build,
    open_or_build_with,
};
use tensor_core::{DType, Tensor};

fn schema(len: usize) -> Schema {
    Schema::builder()
        .array("x", DType::I32, [len])
        .build()
        .unwrap()
}

/// A build that writes rows 0..n (skipping committed ones) and records
/// their ids in `written`; with `fail_after`, it commits and fails once it
/// has written that many.
fn builder(
    n: usize,
    fail_after: Option<usize>,
    written: &mut Vec<String>,
) -> impl FnOnce(&mut RowWriter) -> Result<(), Error> + '_ {
    move |w| {
        let skip = w
            .resume_key_set()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>();
        for i in 0..n {
            let id = format!("item{i}");
            if skip.contains(&id) {
                continue;
            }
            if fail_after == Some(written.len()) {
                w.flush()?;
                return Err(Error::InvalidSchema {
                    reason: "simulated failure of the build".into(),
                });
            }
            let t = Tensor::from_vec([2], vec![i as i32, -(i as i32)]).unwrap();
            w.write(&NewRow::new(&id).array("x", t.view()))?;
            written.push(id);
        }
        Ok(())
    }
}

fn sources(root: &Path) -> Vec<fingerprint::SourceStamp> {
    stamp_sources(root, ["input.txt"], Mode::Content).unwrap()
}

#[test]
fn builds_then_hits() {
    let root = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"dim": 2});
    let mut written = Vec::new();
    let first = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(5, None, &mut written),
    )
    .unwrap();
    assert_eq!(first.outcome, Outcome::Built);
    assert_eq!(written.len(), 5);
    assert!(first.dir.starts_with(root.path()));
    let mut again = Vec::new();
    let second = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(5, None, &mut again),
    )
    .unwrap();
    assert_eq!(second.outcome, Outcome::Hit);
    assert!(again.is_empty(), "a hit builds nothing");
    assert_eq!(second.cache.len(), 5);
    let row = second.cache.array(3, "x").unwrap().unwrap();
    assert_eq!(row.as_slice::<i32>().unwrap(), &[3, -3]);
    // fingerprint.json is the fingerprint crate's record.
    let fp = fingerprint::Fingerprint::read(&first.dir.join("fingerprint.json")).unwrap();
    assert_eq!(fp.cache_version, memmap_array::CACHE_VERSION);
}

#[test]
fn changed_source_file_rebuilds_and_says_which() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("input.txt"), "one").unwrap();
    let config = serde_json::json!({"dim": 2});
    let mut w = Vec::new();
    open_or_build(
        root.path(),
        &config,
        sources(root.path()),
        &schema(2),
        builder(3, None, &mut w),
    )
    .unwrap();
    std::fs::write(root.path().join("input.txt"), "two!").unwrap();
    let mut w2 = Vec::new();
    let opened = open_or_build(
        root.path(),
        &config,
        sources(root.path()),
        &schema(2),
        builder(3, None, &mut w2),
    )
    .unwrap();
    let Outcome::Rebuilt {
        why: RebuildReason::Stale(fingerprint::Stale::Changed(reasons)),
    } = &opened.outcome
    else {
        panic!("expected a stale rebuild, got {:?}", opened.outcome);
    };
    assert!(
        reasons
            .iter()
            .any(|r| matches!(r, StaleReason::FileChanged { path, .. } if path == "input.txt")),
        "{reasons:?}"
    );
    assert!(
        opened.outcome.to_string().contains("input.txt"),
        "{}",
        opened.outcome
    );
    assert_eq!(w2.len(), 3, "everything was rebuilt");
    assert_eq!(opened.cache.len(), 3);
}

#[test]
fn interrupted_build_resumes() {
    let root = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"dim": 2, "name": "resume"});
    let mut first = Vec::new();
    let e = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(6, Some(4), &mut first),
    )
    .unwrap_err();
    assert!(e.to_string().contains("simulated failure"), "{e}");
    let mut second = Vec::new();
    let opened = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(6, None, &mut second),
    )
    .unwrap();
    assert_eq!(opened.outcome, Outcome::Resumed { committed_rows: 4 });
    assert_eq!(second, ["item4", "item5"]);
    assert_eq!(opened.cache.len(), 6);
    for i in 0..6u64 {
        assert_eq!(opened.cache.source(i).unwrap(), format!("item{i}"));
    }
}

#[test]
fn interrupted_build_with_changed_sources_starts_over() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("input.txt"), "one").unwrap();
    let config = serde_json::json!({"dim": 2});
    let mut first = Vec::new();
    open_or_build(
        root.path(),
        &config,
        sources(root.path()),
        &schema(2),
        builder(6, Some(3), &mut first),
    )
    .unwrap_err();
    std::fs::write(root.path().join("input.txt"), "changed").unwrap();
    let mut second = Vec::new();
    let opened = open_or_build(
        root.path(),
        &config,
        sources(root.path()),
        &schema(2),
        builder(6, None, &mut second),
    )
    .unwrap();
    assert!(
        matches!(
            opened.outcome,
            Outcome::Rebuilt {
                why: RebuildReason::Stale(_)
            }
        ),
        "{:?}",
        opened.outcome
    );
    assert_eq!(second.len(), 6);
}

#[test]
fn damaged_or_reshaped_cache_is_rebuilt() {
    let root = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"dim": 2});
    let mut w = Vec::new();
    let opened = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(4, None, &mut w),
    )
    .unwrap();
    let dir = opened.dir.clone();
    drop(opened);
    std::fs::write(dir.join("x.bin"), b"short").unwrap();
    let mut w = Vec::new();
    let opened = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(4, None, &mut w),
    )
    .unwrap();
    assert!(
        matches!(&opened.outcome, Outcome::Rebuilt { why: RebuildReason::Unreadable(e) } if e.contains("x.bin")),
        "{:?}",
        opened.outcome
    );
    assert_eq!(opened.cache.len(), 4);
    drop(opened);
    // Same config, another schema: the old cache cannot serve it.
    let mut w = Vec::new();
    let opened = open_or_build_with(
        root.path(),
        &config,
        vec![],
        &schema(3),
        WriterOptions::default(),
        |wr: &mut RowWriter| -> Result<(), Error> {
            let t = Tensor::from_vec([3], vec![1i32, 2, 3]).unwrap();
            wr.write(&NewRow::new("only").array("x", t.view()))?;
            w.push(());
            Ok(())
        },
    )
    .unwrap();
    assert!(
        matches!(
            opened.outcome,
            Outcome::Rebuilt {
                why: RebuildReason::SchemaChanged(_)
            }
        ),
        "{:?}",
        opened.outcome
    );
    assert_eq!(opened.cache.len(), 1);
}

#[test]
fn concurrent_builder_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"dim": 2});
    let key = fingerprint::compute_key(&config).unwrap();
    let dir = fingerprint::cache_key_dir(root.path(), &key);
    let _holder = RowWriter::create_or_resume(&dir, &schema(2), ()).unwrap();
    let mut w = Vec::new();
    let e = open_or_build(
        root.path(),
        &config,
        vec![],
        &schema(2),
        builder(2, None, &mut w),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
}
