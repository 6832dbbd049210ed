//! A writer's lock is released when the writer is dropped, even while a
//! forked child (another thread spawning a process, before its exec) still
//! shares the lock's descriptor. Found by the fault sweeps as a flaky
//! "Locked" on reopen.

use std::time::Duration;

/// Forks a child that holds copies of every descriptor for `hold`, then
/// exits without running any Rust code.
fn fork_holder(hold: Duration) -> libc::pid_t {
    // SAFETY: the child only calls async-signal-safe functions (usleep,
    // _exit) before exiting, so forking a multi-threaded process is sound.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: as above; _exit skips atexit handlers and destructors.
        unsafe {
            libc::usleep(hold.as_micros() as libc::useconds_t);
            libc::_exit(0);
        }
    }
    pid
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waits for our own child; `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

#[test]
fn segment_store_lock_survives_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        segment_store::SegmentStore::open(dir.path(), segment_store::Options::default()).unwrap();
    let child = fork_holder(Duration::from_millis(300));
    drop(store);
    let again = segment_store::SegmentStore::open(dir.path(), segment_store::Options::default());
    reap(child);
    assert!(again.is_ok(), "{:?}", again.err());
}

#[test]
fn memmap_array_lock_survives_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let schema = memmap_array::Schema::builder()
        .array("x", tensor_core::DType::U8, [1])
        .build()
        .unwrap();
    let w = memmap_array::RowWriter::create_or_resume(dir.path(), &schema, serde_json::json!(1))
        .unwrap();
    let child = fork_holder(Duration::from_millis(300));
    drop(w);
    let again =
        memmap_array::RowWriter::create_or_resume(dir.path(), &schema, serde_json::json!(1));
    reap(child);
    assert!(again.is_ok(), "{:?}", again.err());
}

#[test]
fn page_alloc_lock_survives_a_fork() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.pages");
    let schema = || page_alloc::Schema::new().int("i");
    let w = page_alloc::PageWriter::create(&path, schema(), page_alloc::WriterOptions::default())
        .unwrap();
    let child = fork_holder(Duration::from_millis(300));
    drop(w);
    let again =
        page_alloc::PageWriter::create(&path, schema(), page_alloc::WriterOptions::default());
    reap(child);
    assert!(again.is_ok(), "{:?}", again.err());
}
