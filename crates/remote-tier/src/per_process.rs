//! State that belongs to one process and must not follow it into a
//! forked child: the pin records and the open local copies. A child
//! that finds its parent's state (another pid) starts its own, and never
//! waits on a lock the parent's other threads may have held at `fork()`.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A value of this process, behind a mutex held only for short,
/// non-blocking work.
pub(crate) struct PerProcess<T> {
    slot: AtomicPtr<Slot<T>>,
}

struct Slot<T> {
    pid: u32,
    value: Mutex<T>,
}

impl<T: Default + Leave> PerProcess<T> {
    /// An empty slot, for a `static`.
    pub(crate) const fn new() -> PerProcess<T> {
        PerProcess {
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This process's value, locked. In a forked child, the parent's
    /// value is left behind (its mutex may be held by a thread that did
    /// not follow the fork), emptied through [`Leave::leave`] if it can
    /// be locked at once, and a fresh one starts.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        let pid = std::process::id();
        loop {
            let found = self.slot.load(Ordering::Acquire);
            // SAFETY: a non-null slot was made by `Box::into_raw` below and
            // is never freed (a parent's slot is left in the child, not
            // dropped), so the reference is valid for 'static.
            let current = unsafe { found.as_ref() };
            if let Some(slot) = current
                && slot.pid == pid
            {
                return slot.value.lock().unwrap_or_else(|p| p.into_inner());
            }
            let fresh = Box::into_raw(Box::new(Slot {
                pid,
                value: Mutex::new(T::default()),
            }));
            match self
                .slot
                .compare_exchange(found, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if let Some(parent) = current
                        && let Ok(mut held) = parent.value.try_lock()
                    {
                        held.leave();
                    }
                }
                Err(_) => {
                    // SAFETY: `fresh` came from `Box::into_raw` just above
                    // and was never shared (the exchange failed).
                    drop(unsafe { Box::from_raw(fresh) });
                }
            }
        }
    }
}

/// What a forked child does with the state it inherited from its parent.
pub(crate) trait Leave {
    /// Lets go of what the parent's state holds open (closing descriptors
    /// only: never unlocking what the parent still holds).
    fn leave(&mut self);
}
