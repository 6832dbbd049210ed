//! [`PerProcess`]: process-global state that a forked child never shares.

use std::marker::PhantomData;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

/// A value of this process, built anew (with `T::default()`) in a forked
/// child on first use there.
///
/// `fork()` copies memory as it is at that instant, in the middle of
/// whatever the parent's other threads were doing: a mutex one of them
/// held is held forever in the child, where that thread does not exist.
/// A process-global `Mutex` is thus a trap for any child (a DataLoader
/// worker) that touches it. `PerProcess` keeps each process's value apart,
/// tagged with its process id: the child never looks inside its copy of
/// the parent's value (which it leaks — dropping it could close the
/// parent's sockets or wait on the parent's threads), so a lock the
/// parent's threads held at the fork is never taken in the child.
///
/// # Example
/// ```
/// use std::sync::Mutex;
/// use durable_fs::PerProcess;
///
/// static SEEN: PerProcess<Mutex<Vec<u32>>> = PerProcess::new();
/// SEEN.get().lock().unwrap().push(1);
/// assert_eq!(SEEN.get().lock().unwrap().len(), 1);
/// ```
#[derive(Debug)]
pub struct PerProcess<T> {
    current: AtomicPtr<Owned<T>>,
    /// Shared across threads only where `T` is (`AtomicPtr` alone would
    /// make any `T` look `Sync`).
    _value: PhantomData<T>,
}

/// One process's value.
#[derive(Debug)]
struct Owned<T> {
    pid: u32,
    value: T,
}

impl<T> PerProcess<T> {
    /// No value yet: the first [`get`](PerProcess::get) builds it.
    pub const fn new() -> PerProcess<T> {
        PerProcess {
            current: AtomicPtr::new(ptr::null_mut()),
            _value: PhantomData,
        }
    }
}

impl<T> Default for PerProcess<T> {
    fn default() -> PerProcess<T> {
        PerProcess::new()
    }
}

impl<T: Default> PerProcess<T> {
    /// This process's value: the one built here before, or a new one (in
    /// a process that has none yet, or a child forked since it was built).
    pub fn get(&self) -> &T {
        self.get_leaving(|_| {})
    }

    /// [`get`](PerProcess::get), and in a forked child that meets its
    /// parent's value first, `leave(parent's)` once before the child's own
    /// is built: to close descriptors the parent's value holds (a child
    /// needs not keep them open), never to unlock what the parent still
    /// holds nor to wait on a lock its threads may have held at the fork
    /// (take such a lock with `try_lock` there, or not at all).
    pub fn get_leaving(&self, leave: impl FnOnce(&T)) -> &T {
        let mut leave = Some(leave);
        let pid = std::process::id();
        loop {
            let seen = self.current.load(Ordering::Acquire);
            // SAFETY: a non-null pointer here came from `Box::into_raw` in
            // this function and is never freed (values are leaked, see the
            // type's docs), so it is valid for as long as `self` is.
            if let Some(owned) = unsafe { seen.as_ref() }
                && owned.pid == pid
            {
                return &owned.value;
            }
            let fresh = Box::into_raw(Box::new(Owned {
                pid,
                value: T::default(),
            }));
            match self
                .current
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The value replaced (none, or the parent's copy) is leaked.
                Ok(_) => {
                    // SAFETY: as above, a stored pointer is never freed.
                    if let (Some(parent), Some(leave)) = (unsafe { seen.as_ref() }, leave.take()) {
                        leave(&parent.value);
                    }
                    // SAFETY: `fresh` is now stored and, like every stored
                    // pointer, never freed.
                    return unsafe { &(*fresh).value };
                }
                Err(_) => {
                    // Another thread of this process installed its own
                    // first: use that one (next turn of the loop).
                    // SAFETY: `fresh` was never shared; we own it alone.
                    drop(unsafe { Box::from_raw(fresh) });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn one_value_per_process_across_threads() {
        static COUNT: PerProcess<Mutex<u32>> = PerProcess::new();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..100 {
                        *COUNT.get().lock().unwrap() += 1;
                    }
                });
            }
        });
        assert_eq!(*COUNT.get().lock().unwrap(), 800);
    }
}
