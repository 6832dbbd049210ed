//! The writer lock on real files, across processes and open descriptions.

use durable_fs::{Error, FileLock};
use test_support::crash::{self, child_args, report_commit};

/// A second process is refused while the lock is held, and gets it once it
/// is dropped. The child is this test binary re-executed (a real process,
/// not a second descriptor).
#[test]
fn a_second_process_is_refused_the_writer_lock() {
    if let Some(args) = child_args() {
        let outcome = match FileLock::writer(&args.dir.join("writer.lock")) {
            Ok(_) => "acquired".to_owned(),
            Err(Error::Locked { lock_path }) => format!("locked {}", lock_path.display()),
            Err(e) => format!("error {e}"),
        };
        report_commit(&outcome);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lock_path = dir.path().join("writer.lock");
    let held = FileLock::writer(&lock_path).unwrap();
    let run = || {
        crash::child(
            "a_second_process_is_refused_the_writer_lock",
            "lock",
            dir.path(),
            0,
        )
        .run()
        .committed
    };
    assert_eq!(run(), [format!("locked {}", lock_path.display())]);
    drop(held);
    assert_eq!(run(), ["acquired"]);
}

/// `flock` locks belong to an open file description, so a second open in
/// the same process is refused exactly like a second process.
#[test]
fn a_second_open_in_one_process_is_refused_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("writer.lock");
    let held = FileLock::writer(&path).unwrap();
    let err = FileLock::writer(&path).unwrap_err();
    assert!(
        matches!(&err, Error::Locked { lock_path } if *lock_path == path),
        "{err:?}"
    );
    assert!(err.to_string().contains("held by another process"), "{err}");
    assert!(FileLock::try_exclusive(&path).unwrap().is_none());
    drop(held);
    assert!(FileLock::try_exclusive(&path).unwrap().is_some());
}

#[test]
fn shared_locks_coexist_and_keep_writers_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("writer_lock.lock");
    let a = FileLock::shared(&path).unwrap();
    let b = FileLock::shared(&path).unwrap();
    assert!(FileLock::try_exclusive(&path).unwrap().is_none());
    drop(a);
    assert!(FileLock::try_exclusive(&path).unwrap().is_none());
    drop(b);
    let x = FileLock::exclusive(&path).unwrap();
    assert_eq!(x.path(), path);
    // try_shared is refused while the exclusive lock is held, at once.
    assert!(FileLock::try_shared(&path).unwrap().is_none());
    drop(x);
    let c = FileLock::try_shared(&path).unwrap().unwrap();
    let d = FileLock::try_shared(&path).unwrap().unwrap();
    assert!(FileLock::try_exclusive(&path).unwrap().is_none());
    drop((c, d));
}

#[test]
fn a_read_only_lock_file_still_locks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("writer.lock");
    std::fs::write(&path, b"").unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(&path, perms).unwrap();
    let held = FileLock::writer(&path).unwrap();
    assert!(FileLock::try_exclusive(&path).unwrap().is_none());
    drop(held);
}

/// A lock whose holder never lets go (a stopped process) is a typed error
/// naming the lock file after the caller's bound, never a wait for good;
/// once it is let go the same call takes it.
#[test]
fn bounded_waits_end_in_a_lock_timeout_naming_the_file() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("block.fetch");
    let held = FileLock::exclusive(&path).unwrap();
    let wait = Duration::from_millis(60);
    for taken in [
        FileLock::exclusive_within(&path, wait),
        FileLock::exclusive_live_within(&path, wait),
        FileLock::shared_live_within(&path, wait),
    ] {
        match taken {
            Err(durable_fs::Error::LockTimeout { lock_path, waited }) => {
                assert_eq!(lock_path, path);
                assert!(waited >= wait);
            }
            other => panic!("expected LockTimeout, got {other:?}"),
        }
    }
    let message = FileLock::exclusive_within(&path, wait)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("block.fetch") && message.contains("still held"),
        "{message}"
    );
    drop(held);
    FileLock::exclusive_within(&path, wait).unwrap();
    FileLock::shared_live_within(&path, wait).unwrap();
}
