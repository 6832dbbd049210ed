//! Every reason a cache can be stale, and fingerprint.json round trips.

use std::path::Path;

use fingerprint::{
    FINGERPRINT_FILE, FileChange, Fingerprint, Mode, SourceStamp, Stale, StaleReason, check_dir,
    compute_fingerprint, validate,
};
use serde_json::json;

fn stamp(path: &str, size: u64, mtime_ns: i64, content: Option<&str>) -> SourceStamp {
    SourceStamp {
        rel_path: path.into(),
        size,
        mtime_ns,
        content: content.map(Into::into),
    }
}

fn reasons(stale: Stale) -> Vec<StaleReason> {
    match stale {
        Stale::Changed(r) => r,
        other => panic!("expected Changed, got {other:?}"),
    }
}

#[test]
fn identical_fingerprints_validate() {
    let s = vec![stamp("a.txt", 3, 10, None)];
    let a = compute_fingerprint(&json!({"x": 1}), s.clone(), 1).unwrap();
    let b = compute_fingerprint(&json!({"x": 1}), s, 1).unwrap();
    assert_eq!(validate(&a, &b), Ok(()));
    assert!(a.stale_reason(&b).is_none());
}

#[test]
fn config_change_names_every_field() {
    let old = compute_fingerprint(
        &json!({"model": {"depth": 18, "width": 64}, "lr": 0.1, "tags": [1, 2]}),
        vec![],
        1,
    )
    .unwrap();
    let new = compute_fingerprint(
        &json!({"model": {"depth": 34, "width": 64}, "lr": 0.1, "tags": [1, 3], "extra": true}),
        vec![],
        1,
    )
    .unwrap();
    let r = reasons(validate(&old, &new).unwrap_err());
    assert_eq!(r.len(), 1);
    match &r[0] {
        StaleReason::ConfigChanged {
            old_hash,
            new_hash,
            fields,
        } => {
            assert_eq!(old_hash, &old.config_hash);
            assert_eq!(new_hash, &new.config_hash);
            assert_eq!(fields, &["extra", "model.depth", "tags[1]"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn file_changed_added_removed() {
    let old = compute_fingerprint(
        &json!(1),
        vec![
            stamp("a", 1, 100, None),
            stamp("b", 2, 200, None),
            stamp("gone", 3, 300, None),
        ],
        1,
    )
    .unwrap();
    let new = compute_fingerprint(
        &json!(1),
        vec![
            stamp("a", 5, 100, None),
            stamp("b", 2, 201, None),
            stamp("new", 1, 1, None),
        ],
        1,
    )
    .unwrap();
    let r = reasons(validate(&old, &new).unwrap_err());
    assert_eq!(
        r,
        vec![
            StaleReason::FileChanged {
                path: "a".into(),
                changes: vec![FileChange::Size { old: 1, new: 5 }]
            },
            StaleReason::FileChanged {
                path: "b".into(),
                changes: vec![FileChange::Mtime { old: 200, new: 201 }]
            },
            StaleReason::FileRemoved {
                path: "gone".into()
            },
            StaleReason::FileAdded { path: "new".into() },
        ]
    );
}

#[test]
fn content_mode_ignores_mtime_but_not_content() {
    let old = compute_fingerprint(&json!(1), vec![stamp("a", 4, 100, Some("aa"))], 1).unwrap();
    let touched = compute_fingerprint(&json!(1), vec![stamp("a", 4, 999, Some("aa"))], 1).unwrap();
    assert_eq!(validate(&old, &touched), Ok(()));
    let edited = compute_fingerprint(&json!(1), vec![stamp("a", 4, 100, Some("bb"))], 1).unwrap();
    let r = reasons(validate(&old, &edited).unwrap_err());
    assert_eq!(
        r,
        vec![StaleReason::FileChanged {
            path: "a".into(),
            changes: vec![FileChange::Content]
        }]
    );
}

#[test]
fn version_bump_is_a_reason() {
    let old = compute_fingerprint(&json!(1), vec![], 1).unwrap();
    let new = compute_fingerprint(&json!(1), vec![], 2).unwrap();
    let r = reasons(validate(&old, &new).unwrap_err());
    assert_eq!(
        r,
        vec![StaleReason::VersionChanged {
            what: "cache",
            old: 1,
            new: 2
        }]
    );
    assert_eq!(
        Stale::Changed(r).to_string(),
        "cache is stale: cache version changed from 1 to 2"
    );
}

#[test]
fn all_reasons_are_listed_together_and_read_like_a_sentence() {
    let old = compute_fingerprint(&json!({"k": 1}), vec![stamp("a", 1, 1, None)], 1).unwrap();
    let new = compute_fingerprint(&json!({"k": 2}), vec![], 3).unwrap();
    let stale = validate(&old, &new).unwrap_err();
    let text = stale.to_string();
    assert!(
        text.starts_with("cache is stale: cache version changed from 1 to 3; config changed ("),
        "{text}"
    );
    assert!(text.contains("fields: k)"), "{text}");
    assert!(text.ends_with("; source a was removed"), "{text}");
}

#[test]
fn fingerprint_json_round_trips_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let fp =
        compute_fingerprint(&json!({"a": [1, 2]}), vec![stamp("x", 1, 2, Some("ff"))], 7).unwrap();
    let path = dir.path().join(FINGERPRINT_FILE);
    fp.write(&path).unwrap();
    assert_eq!(Fingerprint::read(&path).unwrap(), fp);
    assert_eq!(check_dir(dir.path(), &fp), Ok(()));
    // No temp file is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(FINGERPRINT_FILE)]);
}

#[test]
fn missing_and_corrupt_fingerprints_are_stale_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let fp = compute_fingerprint(&json!(1), vec![], 1).unwrap();
    let path = dir.path().join(FINGERPRINT_FILE);
    assert!(matches!(
        check_dir(dir.path(), &fp),
        Err(Stale::Missing { .. })
    ));
    for garbage in [
        &b""[..],
        b"{",
        b"\xff\xfe",
        b"{\"format_version\": \"x\"}",
        b"[]",
        b"null",
    ] {
        std::fs::write(&path, garbage).unwrap();
        match check_dir(dir.path(), &fp) {
            Err(Stale::Unreadable { path: p, reason }) => {
                assert_eq!(p, path);
                assert!(!reason.is_empty());
            }
            other => panic!("{:?}: {other:?}", String::from_utf8_lossy(garbage)),
        }
    }
    // Truncations of a valid file at every byte are stale, never a panic.
    fp.write(&path).unwrap();
    let good = std::fs::read(&path).unwrap();
    for cut in 0..good.len() - 1 {
        std::fs::write(&path, &good[..cut]).unwrap();
        assert!(check_dir(dir.path(), &fp).is_err(), "cut at {cut}");
    }
    // A file over the cap is refused before it is read into memory (sparse:
    // it takes no disk).
    let huge = std::fs::File::create(&path).unwrap();
    huge.set_len(fingerprint::FINGERPRINT_FILE_CAP + 1).unwrap();
    drop(huge);
    match check_dir(dir.path(), &fp) {
        Err(Stale::Unreadable { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(reason.contains("limit"), "{reason}");
        }
        other => panic!("oversized fingerprint.json: {other:?}"),
    }
    let text = Stale::Unreadable {
        path: Path::new("d/fingerprint.json").into(),
        reason: "EOF".into(),
    }
    .to_string();
    assert_eq!(
        text,
        "cache is stale: d/fingerprint.json is unreadable: EOF"
    );
}

#[test]
fn stamps_from_disk_validate_until_a_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "hello").unwrap();
    let sources = fingerprint::stamp_sources(dir.path(), ["a.txt"], Mode::Metadata).unwrap();
    let stored = compute_fingerprint(&json!(1), sources, 1).unwrap();
    let again = fingerprint::stamp_sources(dir.path(), ["a.txt"], Mode::Metadata).unwrap();
    assert_eq!(
        validate(&stored, &compute_fingerprint(&json!(1), again, 1).unwrap()),
        Ok(())
    );
    std::fs::write(dir.path().join("a.txt"), "hello, world").unwrap();
    let changed = fingerprint::stamp_sources(dir.path(), ["a.txt"], Mode::Metadata).unwrap();
    let r = reasons(
        validate(
            &stored,
            &compute_fingerprint(&json!(1), changed, 1).unwrap(),
        )
        .unwrap_err(),
    );
    assert!(
        matches!(&r[0], StaleReason::FileChanged { path, changes } if path == "a.txt" && changes.contains(&FileChange::Size { old: 5, new: 12 }))
    );
}
