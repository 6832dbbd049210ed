//! gc on S3 run between a publisher's uploads and its commit, with the
//! uploads older than the grace period (the publish of a large cache, a
//! long Ray job): for `publish`, `push` and a staged commit, the commit
//! lands and every object it names is in the store; what a gc that
//! ignores leases took meanwhile is sent again before the commit.
//!
//! As in `gc.rs`, the uploads are made older than the grace period from
//! the test's own clock: a grace of zero and a pause of a few seconds, so
//! that the listing's whole-second last-modified times fall before it.
//! The pause and the gc run inside the publish, at its `Uploaded` stage
//! ([`remote_cache::hooks`]).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{new_bucket_url, s3_endpoint, tier};
use remote_cache::hooks::{Stage, on_stage};
use remote_cache::staged::{WRITER_BLOCK_HASHES, commit_files, read_file, upload_files};
use remote_cache::{GcOptions, GcReport, gc};
use remote_cache::{LogState, RemoteDir, StoreFiles};
use remote_cache::{pull_dir, push_dir};
use remote_tier::RemoteTier;

/// Every object older than a second or two is past it.
const NO_GRACE: GcOptions = GcOptions {
    keep: Duration::ZERO,
    grace: Duration::ZERO,
};

/// The listing's times are whole seconds: past this, the uploads are
/// older than a grace of zero.
fn age_the_uploads() {
    std::thread::sleep(Duration::from_secs(3));
}

/// `n` files of 100 KiB with distinct bytes, under `dir`.
fn write_files(dir: &Path, names: &[&str], salt: u8) {
    for (i, name) in names.iter().enumerate() {
        let bytes: Vec<u8> = (0..100 << 10)
            .map(|j: u32| (j as u8).wrapping_mul(7) ^ ((salt << 4) | i as u8))
            .collect();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Every object the log's state names is in the store.
fn assert_every_object_there(tier: &RemoteTier) -> LogState {
    let state = LogState::read(tier).unwrap();
    for (path, pieces) in &state.files {
        for p in pieces {
            if let Err(e) = tier.head(&p.object()) {
                panic!("commit {} names {} for {path}: {e}", state.seq, p.object());
            }
        }
    }
    state
}

/// Runs `act` once, at the first publish to `url` that reaches `stage`.
fn once_at(url: &str, stage: Stage, act: impl Fn() + Send + Sync + 'static) {
    let armed = AtomicBool::new(true);
    on_stage(url, move |s| {
        if s == stage && armed.swap(false, Ordering::SeqCst) {
            act();
        }
    });
}

/// A gc at the `Uploaded` stage of the next publish to `url`; its report.
fn gc_when_uploaded(url: &str, gc_tier: RemoteTier) -> Arc<Mutex<Option<GcReport>>> {
    let report = Arc::new(Mutex::new(None));
    let out = Arc::clone(&report);
    once_at(url, Stage::Uploaded, move || {
        age_the_uploads();
        *out.lock().unwrap() = Some(gc(&gc_tier, NO_GRACE).unwrap());
    });
    report
}

fn open_dir(endpoint: &str, url: &str, root: &Path) -> RemoteDir {
    RemoteDir::open(
        tier(endpoint, url, &root.join("tier")),
        &root.join("work"),
        StoreFiles::PLAIN,
    )
    .unwrap()
}

#[test]
fn a_gc_between_a_publishs_uploads_and_its_commit_keeps_them() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "publish");
    let (w, g, r) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let writer = open_dir(&endpoint, &url, w.path());
    write_files(writer.dir(), &["a", "b"], 0);
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    write_files(writer.dir(), &["c", "d", "e"], 1);
    let gc_tier = tier(&endpoint, &url, g.path());
    let report = gc_when_uploaded(writer.tier().url(), gc_tier.clone());
    let published = writer.publish().unwrap();
    let report = report.lock().unwrap().take().expect("gc ran");
    println!("gc inside the publish: {report:?}; {published:?}");
    assert_eq!(published.seq, Some(2));
    assert_eq!(report.leased_objects, 3, "{report:?}");
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    let state = assert_every_object_there(&gc_tier);
    assert_eq!(state.files.len(), 5);
    // The lease is gone with the publish.
    assert!(gc_tier.list("leases").unwrap().is_empty());

    // Something that ignores leases deletes an upload: the publish
    // sends it again before its commit.
    write_files(writer.dir(), &["f"], 2);
    let taker = gc_tier.clone();
    once_at(writer.tier().url(), Stage::Uploaded, move || {
        let f = LogState::read(&taker).unwrap();
        assert_eq!(f.seq, 2);
        let unreferenced: Vec<String> = taker
            .list("objects")
            .unwrap()
            .into_iter()
            .map(|o| o.name)
            .filter(|o| !f.files.values().flatten().any(|p| &p.object() == o))
            .collect();
        assert_eq!(unreferenced.len(), 1, "{unreferenced:?}");
        taker.delete(&unreferenced[0]).unwrap();
    });
    let third = writer.publish().unwrap();
    assert_eq!((third.seq, third.uploaded), (Some(3), 2), "{third:?}");
    assert_every_object_there(&gc_tier);

    let reader = open_dir(&endpoint, &url, r.path());
    for name in ["a", "b", "c", "d", "e", "f"] {
        assert_eq!(
            std::fs::read(reader.dir().join(name)).unwrap(),
            std::fs::read(writer.dir().join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn a_gc_between_a_pushs_uploads_and_its_commit_keeps_them() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "push");
    let (src, t, g, dest) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_files(src.path(), &["a", "b", "c", "d"], 3);
    let pusher = tier(&endpoint, &url, t.path());
    let gc_tier = tier(&endpoint, &url, g.path());
    let report = gc_when_uploaded(pusher.url(), gc_tier.clone());
    let pushed = push_dir(&pusher, src.path(), &mut |_, _| {}).unwrap();
    let report = report.lock().unwrap().take().expect("gc ran");
    println!("gc inside the push: {report:?}; {pushed:?}");
    assert_eq!((pushed.seq, pushed.uploaded), (Some(1), 4), "{pushed:?}");
    assert_eq!(report.leased_objects, 4, "{report:?}");
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    assert_eq!(assert_every_object_there(&gc_tier).files.len(), 4);
    assert!(gc_tier.list("leases").unwrap().is_empty());

    let pulled = tier(&endpoint, &url, &dest.path().join("tier"));
    pull_dir(&pulled, &dest.path().join("copy")).unwrap();
    for name in ["a", "b", "c", "d"] {
        assert_eq!(
            std::fs::read(dest.path().join("copy").join(name)).unwrap(),
            std::fs::read(src.path().join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn a_gc_between_staged_uploads_and_their_commit_keeps_them() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "staged");
    let (src, t, g) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_files(src.path(), &["a", "b", "c"], 4);
    let writer = tier(&endpoint, &url, t.path());
    // Two writers' uploads, as two tasks of a job stage them.
    let (a, b, c) = (
        src.path().join("a"),
        src.path().join("b"),
        src.path().join("c"),
    );
    let mut pieces = upload_files(
        &writer,
        StoreFiles::PLAIN,
        &[("a".into(), a.as_path()), ("b".into(), b.as_path())],
        WRITER_BLOCK_HASHES,
    )
    .unwrap();
    pieces.extend(
        upload_files(
            &writer,
            StoreFiles::PLAIN,
            &[("c".into(), c.as_path())],
            WRITER_BLOCK_HASHES,
        )
        .unwrap(),
    );
    // The job runs on past the grace period; a gc runs before the commit.
    age_the_uploads();
    let gc_tier = tier(&endpoint, &url, g.path());
    let report = gc(&gc_tier, NO_GRACE).unwrap();
    println!("gc between staged uploads and their commit: {report:?}");
    assert_eq!(report.leased_objects, 3, "{report:?}");
    assert_eq!(report.deleted_objects, 0, "{report:?}");
    assert_eq!(commit_files(&writer, 0, pieces, vec![]).unwrap(), Some(1));
    let state = assert_every_object_there(&gc_tier);
    for (name, path) in [("a", &a), ("b", &b), ("c", &c)] {
        assert_eq!(
            read_file(&gc_tier, name, &state.files[name]).unwrap(),
            std::fs::read(path).unwrap(),
            "{name}"
        );
    }
    // The writers' leases lapse (a day); the committer's is gone.
    assert_eq!(gc_tier.list("leases").unwrap().len(), 2);
}
