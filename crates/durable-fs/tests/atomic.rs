//! The commit path on real files: a replaced file is the old one or the new
//! one, whatever step a crash or an error stops at; leftovers are cleaned.

use std::path::Path;
use std::time::Duration;

use durable_fs::{
    Error, commit_temp, create_temp, parent_dir, read_capped, remove_and_sync,
    remove_dead_temp_files, remove_temp_files, sync_dir, sync_parent_dir, temp_path,
    unique_temp_path, write_atomic,
};
use test_support::crash::{self, child_args, report_commit};

/// Version `v` of the replaced file: its length differs from version to
/// version, so a torn mix of two versions cannot pass for either.
fn version(v: u64) -> Vec<u8> {
    format!("version {v:08}\n")
        .repeat(1000 + (v % 7) as usize * 3000)
        .into_bytes()
}

/// The version `bytes` hold, if they are one whole version.
fn parse_version(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let first = text.lines().next()?;
    let v = first.strip_prefix("version ")?.parse().ok()?;
    (version(v) == bytes).then_some(v)
}

#[test]
fn sigkill_during_replace_leaves_old_or_new() {
    if let Some(args) = child_args() {
        let path = args.dir.join("value.json");
        for v in 1.. {
            write_atomic(&path, &version(v)).unwrap();
            report_commit(&v.to_string());
        }
        return;
    }
    for cycle in 0..crash::cycles(20) {
        let dir = tempfile::tempdir().unwrap();
        let kill_after = Duration::from_millis(5 + (cycle as u64 * 37) % 150);
        let out = crash::run_and_kill(
            "sigkill_during_replace_leaves_old_or_new",
            "replace",
            dir.path(),
            cycle as u64,
            kill_after,
        );
        assert!(out.killed, "the writer loops until killed");
        let committed: Vec<u64> = out.committed.iter().map(|c| c.parse().unwrap()).collect();
        let last = committed.last().copied().unwrap_or(0);
        let path = dir.path().join("value.json");
        match std::fs::read(&path) {
            Ok(bytes) => {
                let v = parse_version(&bytes)
                    .unwrap_or_else(|| panic!("cycle {cycle}: torn file of {} bytes", bytes.len()));
                // The reported version, or the next one renamed just before the kill.
                assert!(
                    v == last || v == last + 1,
                    "cycle {cycle}: found {v}, last commit {last}"
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                assert_eq!(
                    last, 0,
                    "cycle {cycle}: committed {last} but the file is gone"
                );
            }
            Err(e) => panic!("cycle {cycle}: {e}"),
        }
        // Whatever temporary file the kill left is cleaned up, and only it.
        remove_temp_files(dir.path()).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.iter().all(|n| n == "value.json"), "{names:?}");
    }
}

#[test]
fn a_failed_rename_keeps_the_old_file_and_removes_the_temp() {
    let dir = tempfile::tempdir().unwrap();
    // A non-empty directory cannot be renamed over.
    let dest = dir.path().join("meta");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("keep"), b"old").unwrap();
    let err = write_atomic(&dest, b"new").unwrap_err();
    match &err {
        Error::Io { op, path, .. } => {
            assert_eq!(*op, "rename into place");
            assert_eq!(path, &dest);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("meta: rename into place"), "{err}");
    assert_eq!(std::fs::read(dest.join("keep")).unwrap(), b"old");
    assert!(!temp_path(&dest).exists());
}

#[test]
fn a_missing_directory_is_an_error_naming_the_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent").join("meta.json");
    let err = write_atomic(&path, b"x").unwrap_err();
    assert_eq!(err.path(), temp_path(&path));
    assert!(err.to_string().contains("create temporary file"), "{err}");
}

#[test]
fn commit_temp_renames_a_written_temp_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("shapes.json");
    std::fs::write(&dest, b"old").unwrap();
    let tmp = temp_path(&dest);
    let mut file = create_temp(&tmp).unwrap();
    std::io::Write::write_all(&mut file, b"new").unwrap();
    // Until the commit, readers see the old file.
    assert_eq!(std::fs::read(&dest).unwrap(), b"old");
    commit_temp(file, &tmp, &dest).unwrap();
    sync_dir(dir.path()).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"new");
    assert!(!tmp.exists());
}

#[test]
fn a_bare_file_name_lives_in_the_current_directory() {
    // Its parent is the empty path, which cannot be opened: one of the old
    // copies fsynced `""` and failed on a relative bare name.
    assert_eq!(parent_dir(Path::new("index.log")), Path::new("."));
    assert_eq!(parent_dir(Path::new("/index.log")), Path::new("/"));
    assert_eq!(parent_dir(Path::new("a/index.log")), Path::new("a"));
    sync_parent_dir(Path::new("index.log")).unwrap();
}

#[test]
fn remove_and_sync_reports_whether_there_was_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("_COMPLETE");
    assert!(!remove_and_sync(&path).unwrap());
    std::fs::write(&path, b"").unwrap();
    assert!(remove_and_sync(&path).unwrap());
    assert!(!path.exists());
}

#[test]
fn stale_temp_files_are_removed_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a.bin.tmp", "index.log.tmp", "a.bin", "tmp", "notes.tmpx"] {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let mut removed = remove_temp_files(dir.path()).unwrap();
    removed.sort();
    assert_eq!(
        removed,
        [
            dir.path().join("a.bin.tmp"),
            dir.path().join("index.log.tmp")
        ]
    );
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["a.bin", "notes.tmpx", "tmp"]);
    // A directory never created holds no temporary files.
    assert!(
        remove_temp_files(&dir.path().join("absent"))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn temp_files_of_dead_processes_are_removed_and_live_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = child.id();
    child.wait().unwrap();
    let dead = dir.path().join(format!(
        "3.7.shard.pickle.{}.{dead_pid}.0.tmp",
        durable_fs::host_name()
    ));
    std::fs::write(&dead, b"x").unwrap();
    let ours = unique_temp_path(dir.path(), "3.7.shard.pickle");
    std::fs::write(&ours, b"x").unwrap();
    let other = dir.path().join("user-file.tmp");
    std::fs::write(&other, b"x").unwrap();
    remove_dead_temp_files(dir.path());
    assert!(!dead.exists());
    assert!(ours.exists());
    assert!(other.exists());
}

/// A scratch directory on a shared file system (NFS, Lustre): a pid that
/// is dead here may be alive on the node that wrote the file.
#[test]
fn temp_files_of_another_node_are_never_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead_here = child.id();
    child.wait().unwrap();
    let theirs = [
        format!("3.7.shard.pickle.node-17.{dead_here}.0.tmp"),
        // An older build's name, which carries no host at all.
        format!("3.7.shard.pickle.{dead_here}.0.tmp"),
    ];
    for name in &theirs {
        std::fs::write(dir.path().join(name), b"x").unwrap();
    }
    let ours = unique_temp_path(dir.path(), "3.7.shard.pickle");
    let name = ours.file_name().unwrap().to_str().unwrap();
    assert!(
        name.contains(&format!(
            ".{}.{}.",
            durable_fs::host_name(),
            std::process::id()
        )),
        "{name} names its host and process"
    );
    remove_dead_temp_files(dir.path());
    for name in &theirs {
        assert!(dir.path().join(name).exists(), "{name} was removed");
    }
}

#[test]
fn capped_reads_refuse_one_byte_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shapes.json");
    std::fs::write(&path, [b'x'; 64]).unwrap();
    assert_eq!(read_capped(&path, 64).unwrap().len(), 64);
    let err = read_capped(&path, 63).unwrap_err();
    assert!(matches!(err, Error::TooLarge { cap: 63, .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("shapes.json: larger than the 63-byte limit"),
        "{err}"
    );
}
