//! A child forked while other threads of its parent open tiers (and so
//! take the process's shared runtime and HTTP clients) must build its own
//! and never wait on a lock the parent's threads held at the fork. Alone
//! in its test binary: the threads it starts are the only others at each
//! fork.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};

#[test]
fn children_forked_while_threads_open_tiers_open_their_own() {
    const FORKS: usize = 300;
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "fork-shared");
    let dir = tempfile::tempdir().unwrap();
    let data = sample(10_000, 9);
    s3_tier(
        &endpoint,
        &url,
        small_config(&dir.path().join("parent"), 1 << 30),
    )
    .put_bytes("x", data.clone())
    .unwrap();
    let stop = AtomicBool::new(false);
    let mut failed = Vec::new();
    std::thread::scope(|s| {
        for t in 0..2 {
            let (endpoint, url, dir, stop) = (&endpoint, &url, dir.path(), &stop);
            s.spawn(move || {
                let config = small_config(&dir.join(format!("thread-{t}")), 1 << 30);
                while !stop.load(Ordering::Relaxed) {
                    // Each open takes the shared runtime and client map.
                    drop(s3_tier(endpoint, url, config.clone()));
                }
            });
        }
        for n in 0..FORKS {
            let child_dir = dir.path().join(format!("child-{n}"));
            // SAFETY: the child only opens a tier and reads (allocation,
            // files and sockets, usable after fork), then leaves with
            // `_exit`, running none of the parent's destructors.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let ok = std::panic::catch_unwind(|| {
                    let tier = s3_tier(&endpoint, &url, small_config(&child_dir, 1 << 30));
                    tier.read_remote("x").is_ok_and(|b| b == data)
                })
                .unwrap_or(false);
                // SAFETY: ends the child without unwinding into the test.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) };
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut status = 0;
            let exited = loop {
                // SAFETY: our own child; `status` is a valid out pointer.
                if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                    break true;
                }
                if Instant::now() > deadline {
                    // SAFETY: our own child, which we then reap.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut status, 0);
                    }
                    break false;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            if !(exited && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
                failed.push((n, exited, status));
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        failed.is_empty(),
        "{} of {FORKS} children failed or hung (n, exited, status): {failed:?}",
        failed.len()
    );
}
