//! [`Pool`]: the one worker pool of the workspace — scoped threads over a
//! slice, bounded, in the items' order, with one panic policy.

use std::any::Any;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs a function over the items of a slice on up to `workers` scoped
/// threads at once, and returns the answers in the items' order.
///
/// - **Bounded**: at most `workers` threads (never more than items); a
///   call returns when every thread it started has ended.
/// - **Stops early**: once an item fails ([`try_map`](Self::try_map)), no
///   further item is started; the items in flight finish, and the error
///   of the first failed item (in the items' order) is returned.
/// - **One panic policy**: a panic in a worker stops the others from
///   starting items and is resumed on the caller once every worker has
///   ended — a bug is never turned into a missing answer or an error.
/// - **No thread, no failure**: where the system refuses a thread, the
///   threads it gave do the work; with none (or one item, or one worker)
///   the caller's thread does it.
///
/// # Example
/// ```
/// use durable_fs::Pool;
///
/// let squares = Pool::new(4).map(&[1u64, 2, 3], |n| n * n);
/// assert_eq!(squares, vec![1, 4, 9]);
///
/// let first_bad = Pool::new(2).try_map(&[1, 2, 3], |&n| if n == 2 { Err(n) } else { Ok(n) });
/// assert_eq!(first_bad, Err(2));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    workers: usize,
}

impl Pool {
    /// A pool of at most `workers` threads (0 counts as 1).
    pub fn new(workers: usize) -> Pool {
        Pool {
            workers: workers.max(1),
        }
    }

    /// `f` of every item.
    pub fn map<T: Sync, R: Send>(&self, items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
        match self.try_map(items, |item| Ok::<R, std::convert::Infallible>(f(item))) {
            Ok(answers) => answers,
            Err(never) => match never {},
        }
    }

    /// `f` of every item, or the first error (no item is started after
    /// one fails).
    pub fn try_map<T: Sync, R: Send, E: Send>(
        &self,
        items: &[T],
        f: impl Fn(&T) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E> {
        self.try_map_with(items, || (), |(), item| f(item))
    }

    /// [`try_map`](Self::try_map) where each worker first makes a state
    /// of its own with `init` (a buffer reused from item to item) and
    /// hands it to `f` with every item it takes.
    pub fn try_map_with<T: Sync, S, R: Send, E: Send>(
        &self,
        items: &[T],
        init: impl Fn() -> S + Sync,
        f: impl Fn(&mut S, &T) -> Result<R, E> + Sync,
    ) -> Result<Vec<R>, E> {
        let workers = self.workers.min(items.len());
        if workers <= 1 {
            let mut state = init();
            return items.iter().map(|item| f(&mut state, item)).collect();
        }
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let panic: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
        let work = || {
            let mut state = init();
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let at = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(at) else { break };
                let answer = f(&mut state, item);
                if answer.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                done.push((at, answer));
            }
            done
        };
        let mut answers: Vec<(usize, Result<R, E>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map_while(|_| {
                    std::thread::Builder::new()
                        .name("cachex-pool".into())
                        .spawn_scoped(s, || {
                            let guard = StopOnPanic(&stop);
                            let done = work();
                            std::mem::forget(guard);
                            done
                        })
                        .ok()
                })
                .collect();
            // With no thread at all, the caller works through the items.
            let mut answers = if handles.is_empty() {
                work()
            } else {
                Vec::new()
            };
            for handle in handles {
                match handle.join() {
                    Ok(done) => answers.extend(done),
                    Err(payload) => {
                        let mut first = panic.lock().unwrap_or_else(|p| p.into_inner());
                        first.get_or_insert(payload);
                    }
                }
            }
            answers
        });
        if let Some(payload) = panic.into_inner().unwrap_or_else(|p| p.into_inner()) {
            std::panic::resume_unwind(payload);
        }
        answers.sort_unstable_by_key(|(at, _)| *at);
        answers.into_iter().map(|(_, answer)| answer).collect()
    }
}

/// Tells the other workers to start no further item when the worker
/// holding it unwinds (it is forgotten on a normal return).
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    #[test]
    fn answers_come_in_the_items_order_whatever_order_they_finish_in() {
        let items: Vec<u64> = (0..64).collect();
        let answers = Pool::new(8).map(&items, |&n| {
            std::thread::sleep(Duration::from_micros((64 - n) * 50));
            n * 2
        });
        assert_eq!(answers, items.iter().map(|n| n * 2).collect::<Vec<_>>());
    }

    #[test]
    fn no_more_threads_than_workers_or_items() {
        let threads = Mutex::new(HashSet::new());
        let in_flight = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        Pool::new(3).map(&[(); 40], |()| {
            threads.lock().unwrap().insert(std::thread::current().id());
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(1));
            in_flight.fetch_sub(1, Ordering::SeqCst);
        });
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert!(threads.lock().unwrap().len() <= 3);

        let one = Pool::new(8).map(&[7], |_| std::thread::current().id());
        assert_eq!(one, vec![std::thread::current().id()]);
        assert!(Pool::new(8).map(&[] as &[u8], |_| 0).is_empty());
    }

    #[test]
    fn the_first_failed_item_is_returned_and_no_item_starts_after_a_failure() {
        let started = AtomicUsize::new(0);
        let items: Vec<usize> = (0..10_000).collect();
        let got = Pool::new(4).try_map(&items, |&n| {
            started.fetch_add(1, Ordering::SeqCst);
            if n == 3 || n == 5 { Err(n) } else { Ok(n) }
        });
        assert_eq!(got, Err(3));
        // The four workers each finish at most the item in hand.
        assert!(started.load(Ordering::SeqCst) < 100, "{started:?}");
    }

    #[test]
    fn each_worker_keeps_one_state_across_its_items() {
        let inits = AtomicUsize::new(0);
        let got = Pool::new(2).try_map_with(
            &[1u32; 100],
            || {
                inits.fetch_add(1, Ordering::SeqCst);
                Vec::<u32>::new()
            },
            |buf, &n| {
                std::thread::sleep(Duration::from_micros(100));
                buf.push(n);
                Ok::<usize, ()>(buf.len())
            },
        );
        let lens = got.unwrap();
        assert!(inits.load(Ordering::SeqCst) <= 2);
        // Each worker's buffer grew by one per item it took: a length of
        // one marks the first item of a worker, so there are no more of
        // them than states made (a fresh state per item would give 100).
        let firsts = lens.iter().filter(|&&l| l == 1).count();
        assert!(
            (1..=inits.load(Ordering::SeqCst)).contains(&firsts),
            "{lens:?}"
        );
    }

    #[test]
    fn a_worker_panic_is_resumed_on_the_caller_with_its_payload() {
        let started = AtomicUsize::new(0);
        let items: Vec<usize> = (0..10_000).collect();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Pool::new(4).map(&items, |&n| {
                started.fetch_add(1, Ordering::SeqCst);
                assert!(n != 2, "item two is a bug");
                // Slow enough that the others cannot run out of items
                // while the panic is reported.
                std::thread::sleep(Duration::from_millis(1));
            })
        }));
        let payload = caught.unwrap_err();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        assert!(message.contains("item two is a bug"), "{message}");
        // The others stopped taking items once the panic began to unwind.
        assert!(started.load(Ordering::SeqCst) < items.len(), "{started:?}");
    }
}
