//! Publishing at the interpreter's exit, and the failures of publishes
//! that a drop could not raise, as warnings. The publishing itself is
//! remote-cache's ([`remote_cache::Publisher`]): a writer on a URL
//! publishes on a period and when dropped; `cachex/__init__.py` registers
//! [`_publish_at_exit`] for the handles Python never drops, with `atexit`
//! and as a `multiprocessing` exit finalizer (a `fork` or `forkserver`
//! child runs its finalizers, then leaves with `os._exit`, past `atexit`).

use pyo3::exceptions::PyRuntimeWarning;
use pyo3::prelude::*;

/// Keeps last-publish failures for [`warn_failures`] (called once, when
/// the module loads).
pub fn collect_failures() {
    remote_cache::collect_failures();
}

/// Raises each last publish that failed since the previous call as a
/// `RuntimeWarning` (a warnings filter that turns it into an error is
/// reported as unraisable: this runs where nothing can raise).
pub fn warn_failures(py: Python<'_>) {
    warn_each(py, remote_cache::take_failures());
}

fn warn_each(py: Python<'_>, failures: Vec<String>) {
    for failure in failures {
        let message = std::ffi::CString::new(format!("cachex: {failure}"))
            .unwrap_or_else(|_| c"cachex: a publish failed".to_owned());
        if let Err(e) = PyErr::warn(py, &py.get_type::<PyRuntimeWarning>(), &message, 1) {
            e.write_unraisable(py, None);
        }
    }
}

/// Publishes, for the last time and with the GIL released, every writer
/// on a URL still open in this process (all at once, within
/// `LAST_PUBLISH_BOUND` in all); what failed or was still running becomes
/// a `RuntimeWarning`. Registered with `atexit` and as a `multiprocessing`
/// exit finalizer: a second call publishes nothing, and a forked child
/// only the writers it opened itself.
#[pyfunction]
pub fn _publish_at_exit(py: Python<'_>) {
    let failures =
        py.detach(|| remote_cache::publish_all_at_exit(remote_cache::LAST_PUBLISH_BOUND));
    warn_each(py, failures);
}
