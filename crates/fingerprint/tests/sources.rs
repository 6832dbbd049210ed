//! Source stamps: modes, relative paths, bad paths; the _COMPLETE sentinel.

use fingerprint::{
    FingerprintError, Mode, clear_complete, is_complete, mark_complete, stamp_sources,
};

#[test]
fn content_mode_hashes_small_and_large_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("small"), b"abc").unwrap();
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let stamps = stamp_sources(dir.path(), ["small", "big"], Mode::Content).unwrap();
    assert_eq!(stamps[0].rel_path, "big");
    assert_eq!(
        stamps[0].content.as_deref(),
        Some(blake3::hash(&big).to_hex().as_str())
    );
    assert_eq!(
        stamps[1].content.as_deref(),
        Some(blake3::hash(b"abc").to_hex().as_str())
    );
    assert_eq!(stamps[1].size, 3);
    let meta_only = stamp_sources(dir.path(), ["small"], Mode::Metadata).unwrap();
    assert_eq!(meta_only[0].content, None);
    assert_eq!(meta_only[0].mtime_ns, stamps[1].mtime_ns);
}

#[test]
fn paths_are_relative_to_the_root_and_survive_a_move() {
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("data");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/x.bin"), b"1234").unwrap();
    let by_abs = stamp_sources(&root, [root.join("sub/x.bin")], Mode::Content).unwrap();
    let by_rel = stamp_sources(&root, ["./sub/x.bin", "sub/x.bin"], Mode::Content).unwrap();
    assert_eq!(
        by_abs, by_rel,
        "duplicates removed, absolute and relative agree"
    );
    assert_eq!(by_abs[0].rel_path, "sub/x.bin");

    let moved = parent.path().join("moved");
    std::fs::rename(&root, &moved).unwrap();
    let after = stamp_sources(&moved, ["sub/x.bin"], Mode::Content).unwrap();
    assert_eq!(after[0].rel_path, by_abs[0].rel_path);
    assert_eq!(after[0].content, by_abs[0].content);
}

#[test]
fn paths_outside_the_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["../etc/passwd", "/etc/passwd", "a/../../b", ""] {
        let err = stamp_sources(dir.path(), [bad], Mode::Metadata).unwrap_err();
        assert!(
            matches!(err, FingerprintError::OutsideRoot { .. }),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("outside the root"), "{err}");
    }
}

#[test]
fn unreadable_source_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = stamp_sources(dir.path(), ["missing.csv"], Mode::Metadata).unwrap_err();
    assert!(matches!(err, FingerprintError::Io { .. }));
    assert!(err.to_string().contains("missing.csv"), "{err}");
}

#[test]
fn complete_sentinel_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!is_complete(dir.path()));
    mark_complete(dir.path()).unwrap();
    assert!(is_complete(dir.path()));
    clear_complete(dir.path()).unwrap();
    assert!(!is_complete(dir.path()));
    clear_complete(dir.path()).unwrap();
    let err = mark_complete(&dir.path().join("no/such/dir")).unwrap_err();
    assert!(err.to_string().contains("no/such/dir"), "{err}");
}
