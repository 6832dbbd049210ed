//! A process forked while other threads take locks (a DataLoader worker
//! started by a training loop whose threads prefetch) must be able to take
//! locks of its own, and must never let go of a lock its parent holds.
//! Alone in its test binary: the threads it starts are the only others at
//! each fork.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use durable_fs::FileLock;

/// Forks; the child runs `body` and leaves with `_exit(0)` if it returned
/// true, 1 otherwise (2 on a panic). Returns the child's pid.
fn fork_running(body: impl FnOnce() -> bool) -> libc::pid_t {
    // SAFETY: the child runs only `body` (allocation and file calls, which
    // glibc keeps usable after fork) and leaves with `_exit`, running no
    // destructor of the parent's state.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(_) => 2,
        };
        // SAFETY: ends the child without unwinding into the parent's code.
        unsafe { libc::_exit(code) };
    }
    pid
}

/// The exit code of child `pid`, waiting at most `bound` (then it is
/// killed and reaped, and `None` returned).
fn exit_code(pid: libc::pid_t, bound: Duration) -> Option<i32> {
    let deadline = Instant::now() + bound;
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        }
        assert!(r == 0, "waitpid: {}", std::io::Error::last_os_error());
        if Instant::now() > deadline {
            // SAFETY: our own child, which we then reap.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A lock the child takes alone, within a bound far above what an
/// uncontended lock needs.
fn child_takes(path: &Path) -> bool {
    let wait = Duration::from_secs(2);
    let Ok(first) = FileLock::exclusive_within(path, wait) else {
        return false;
    };
    drop(first);
    FileLock::exclusive_within(path, wait).is_ok()
}

#[test]
fn children_forked_while_threads_lock_take_their_own_locks() {
    const FORKS: usize = 300;
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let mut failed = Vec::new();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (dir, stop) = (dir.path(), &stop);
            s.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let path = dir.join(format!("busy-{}.lock", (t + i) % 3));
                    let held = FileLock::exclusive_within(&path, Duration::from_secs(30))
                        .expect("a parent thread's turn");
                    std::thread::yield_now();
                    drop(held);
                    i += 1;
                }
            });
        }
        for n in 0..FORKS {
            let path = dir.path().join(format!("child-{n}.lock"));
            let pid = fork_running(|| child_takes(&path));
            match exit_code(pid, Duration::from_secs(30)) {
                Some(0) => {}
                other => failed.push((n, other)),
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        failed.is_empty(),
        "{} of {FORKS} children could not take an uncontended lock: {failed:?}",
        failed.len()
    );
}

#[test]
fn a_child_dropping_an_inherited_lock_leaves_the_parent_holding_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("held.lock");
    let removed = dir.path().join("removed.lock");
    // Taken through the waiting call, so it carries this process's turn.
    let held = FileLock::exclusive_within(&path, Duration::from_secs(5)).unwrap();
    let gone = FileLock::exclusive_within(&removed, Duration::from_secs(5))
        .unwrap()
        .remove_on_drop();
    let (held_copy, gone_copy) = (&held, &gone);
    let pid = fork_running(move || {
        // SAFETY: bitwise copies of the child's own inherited handles,
        // dropped once each, here; the parent's originals live on in the
        // parent's memory, which the child never returns to.
        let (h, g) = unsafe { (std::ptr::read(held_copy), std::ptr::read(gone_copy)) };
        drop(h);
        drop(g);
        true
    });
    assert_eq!(exit_code(pid, Duration::from_secs(30)), Some(0));
    assert!(
        FileLock::try_exclusive(&path).unwrap().is_none(),
        "the child's drop let go of the parent's lock"
    );
    assert!(
        removed.exists(),
        "the child's drop removed the parent's lock file"
    );
    // The parent's own drop still unlocks (and removes).
    drop((held, gone));
    assert!(FileLock::try_exclusive(&path).unwrap().is_some());
    assert!(!removed.exists());
}
