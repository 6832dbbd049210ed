//! [`Handle`]: the one fork-safe holder of an open store, used by every
//! reader and writer class of the binding.
//!
//! A handle holds the opened store behind an `Arc` and a [`ForkMark`]. In
//! a process forked after the store was opened (a DataLoader worker), the
//! handle never touches what it inherited from the parent: the parent's
//! file descriptors, mappings, locks, buffers and background threads (which
//! do not exist in the child, and whose locks a parent thread may have held
//! at the moment of the fork). A reader builds a fresh opening on first use
//! ([`Handle::get`], with the class's own reopen function) and leaks the
//! inherited one; a writer refuses every call with `ForkedWriterError`
//! ([`Handle::get_writer`]) and leaks what it inherited when dropped,
//! instead of flushing, unlocking or deleting anything of the parent's.
//!
//! The slot's lock is taken only with the GIL held, and only to clone or
//! swap the `Arc`, never across a call that releases the GIL: a fork (made
//! by a thread that holds the GIL) can never find it held by a thread that
//! does not exist in the child. A reopen happens outside the lock and is
//! re-checked under it, so two threads of a child reopen at most once.
//!
//! Nothing here waits for a store with the GIL held: a store's drop may
//! join threads that run Python code (a shard store's workers pulling the
//! Python iterator), so the last reference is always dropped with the GIL
//! released ([`Handle::enter`], and the handle's own `Drop`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;
use pyo3::prelude::*;

use crate::errors::{self, StoreError};
use crate::fork::ForkMark;

/// An open store (or writer) shared by a Python object, fork-safe.
pub struct Handle<T: ?Sized + Send + Sync + 'static> {
    path: PathBuf,
    slot: RwLock<Option<Arc<T>>>,
    fork: ForkMark,
}

impl<T: ?Sized + Send + Sync + 'static> Handle<T> {
    /// A handle of the store at `path` (named in errors). Call with the
    /// GIL held (the fork hook's registry needs it).
    pub fn new(py: Python<'_>, path: PathBuf, value: Arc<T>) -> Handle<T> {
        Handle {
            path,
            slot: RwLock::new(Some(value)),
            fork: ForkMark::new(py),
        }
    }

    /// The store's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the process forked since the handle (re)opened.
    pub fn forked(&self) -> bool {
        self.fork.forked()
    }

    /// The open store. In a forked child, first `reopen(py, inherited)`
    /// builds a fresh one (`inherited` may be read for its options, never
    /// used for I/O) and the inherited one is leaked. A closed handle
    /// stays closed.
    pub fn get(
        &self,
        py: Python<'_>,
        reopen: impl FnOnce(Python<'_>, &T) -> PyResult<Arc<T>>,
    ) -> PyResult<Arc<T>> {
        if self.fork.forked() {
            self.reopen(py, reopen)?;
        }
        self.slot
            .read()
            .clone()
            .ok_or_else(|| errors::closed(&self.path))
    }

    fn reopen(
        &self,
        py: Python<'_>,
        reopen: impl FnOnce(Python<'_>, &T) -> PyResult<Arc<T>>,
    ) -> PyResult<()> {
        let inherited = self.slot.read().clone();
        let Some(inherited) = inherited else {
            self.fork.reopened();
            return Ok(());
        };
        let fresh = reopen(py, &inherited)?;
        // Only a clone: the slot keeps the inherited store alive until it
        // is leaked below.
        drop(inherited);
        let mut slot = self.slot.write();
        if self.fork.forked() {
            if let Some(old) = slot.replace(fresh) {
                std::mem::forget(old);
            }
            self.fork.reopened();
            return Ok(());
        }
        // Another thread of this child reopened first: ours goes.
        drop(slot);
        py.detach(move || drop(fresh));
        Ok(())
    }

    /// The open writer; `ForkedWriterError` in a forked child, whose
    /// parent keeps the writer.
    pub fn get_writer(&self) -> PyResult<Arc<T>> {
        if self.fork.forked() {
            return Err(errors::forked_writer(&self.path));
        }
        self.slot
            .read()
            .clone()
            .ok_or_else(|| errors::closed(&self.path))
    }

    /// The store as it is, without reopening (for `__repr__` and pickling,
    /// which read options only); `None` when closed.
    pub fn peek(&self) -> Option<Arc<T>> {
        self.slot.read().clone()
    }

    /// Runs `f` on the store (reopened first in a forked child) with the
    /// GIL released, and raises its error as its `cachex.errors` class.
    /// The store's reference is dropped with the GIL released too, so a
    /// call that outlives its handle never joins threads holding the GIL.
    pub fn enter<R, E>(
        &self,
        py: Python<'_>,
        reopen: impl FnOnce(Python<'_>, &T) -> PyResult<Arc<T>>,
        f: impl Send + FnOnce(&T) -> Result<R, E>,
    ) -> PyResult<R>
    where
        R: Send,
        E: StoreError + Send,
        Arc<T>: Send,
    {
        let store = self.get(py, reopen)?;
        errors::enter(py, move || {
            let result = f(&store);
            drop(store);
            result
        })
    }

    /// Replaces the open store (arrays returned before keep the old one).
    pub fn replace(&self, py: Python<'_>, value: Arc<T>)
    where
        Arc<T>: Send,
    {
        let old = self.slot.write().replace(value);
        py.detach(move || drop(old));
    }

    /// Takes the store out (`None` when already closed); in a forked child
    /// the inherited store is leaked and `None` returned.
    pub fn close(&self) -> Option<Arc<T>> {
        let store = self.slot.write().take();
        if self.fork.forked() {
            std::mem::forget(store);
            return None;
        }
        store
    }

    /// Whether the handle was closed.
    pub fn is_closed(&self) -> bool {
        self.slot.read().is_none()
    }
}

impl<T: ?Sized + Send + Sync + 'static> Drop for Handle<T> {
    fn drop(&mut self) {
        let Some(store) = self.slot.get_mut().take() else {
            return;
        };
        if self.fork.forked() {
            // The parent's: dropping it here would flush, unlock or delete
            // what is the parent's, or join threads that do not exist.
            std::mem::forget(store);
            return;
        }
        // Handles live in Python objects, dropped with the GIL held; the
        // store's drop may join threads that wait for it, and (a writer on
        // a URL) publish for the last time, whose failure is a warning.
        Python::attach(|py| {
            py.detach(move || drop(store));
            crate::publish::warn_failures(py);
        });
    }
}
