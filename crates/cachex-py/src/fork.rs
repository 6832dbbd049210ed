//! Fork safety: every live handle carries a [`ForkMark`], and the
//! `after_in_child` hook that `cachex/__init__.py` registers with
//! `os.register_at_fork` sets the marks of all of them in a forked child.
//!
//! A marked handle never touches what it inherited from the parent: the
//! parent's file descriptors, mappings, locks and background threads (which
//! do not exist in the child). A reader reopens its file from the path and
//! options on first use; a writer refuses every call with
//! `ForkedWriterError` naming its file and, when dropped, leaks what it
//! inherited instead of flushing, unlocking or deleting anything of the
//! parent's. The mark is one atomic load per call (no `getpid`).
//!
//! The registry is a list of weak references, locked only while the GIL is
//! held (handles are created and the hook runs with it held), so no thread
//! of the parent can hold its lock at the moment of a fork.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use pyo3::prelude::*;

/// The marks of every handle created in this process and not yet dropped.
static LIVE: Mutex<Vec<Weak<AtomicBool>>> = Mutex::new(Vec::new());

/// Whether a handle is in a process forked after it was opened.
#[derive(Debug)]
pub struct ForkMark(Arc<AtomicBool>);

impl ForkMark {
    /// A new, unset mark, registered with the fork hook. Call with the GIL
    /// held (see the module docs).
    pub fn new(_py: Python<'_>) -> ForkMark {
        let mark = Arc::new(AtomicBool::new(false));
        let mut live = LIVE.lock();
        // Prune dropped handles once the list has doubled since the last
        // prune: amortised O(1) per handle.
        if live.len() >= 64 && live.len().is_power_of_two() {
            live.retain(|w| w.strong_count() > 0);
        }
        live.push(Arc::downgrade(&mark));
        ForkMark(mark)
    }

    /// Whether the process forked since the handle (re)opened.
    pub fn forked(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// Records that the handle reopened in this process.
    pub fn reopened(&self) {
        self.0.store(false, Ordering::Release);
    }
}

/// The `os.register_at_fork(after_in_child=...)` hook: marks every live
/// handle of the (now forked) process.
#[pyfunction]
pub fn _after_fork_in_child() {
    for mark in LIVE.lock().iter().filter_map(Weak::upgrade) {
        mark.store(true, Ordering::Release);
    }
}
