//! [`Warming`]: blocks fetched into the local tier in the background, in
//! the order a reader will want them (the next epoch's), before it asks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::Result;

/// A background fill of the local tier ([`RemoteFile::warm`](crate::RemoteFile::warm)).
/// It goes on after this handle is dropped, until done or
/// [`cancel`](Warming::cancel)led.
#[derive(Debug, Clone)]
pub struct Warming {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    total: u64,
    fetched: AtomicU64,
    present: AtomicU64,
    failed: AtomicU64,
    bytes: AtomicU64,
    cancel: AtomicBool,
    finished: Mutex<bool>,
    done: Condvar,
}

impl Warming {
    /// Fetches the units (blocks of one object, or whole objects) `order`
    /// in that order with `workers` threads, in the background: `fetch(i)`
    /// fetches unit `i` (false: it was local already), and
    /// `block_bytes(i)` is its length; no new unit is started once
    /// `max_bytes` were fetched. [`RemoteFile::warm`](crate::RemoteFile::warm)
    /// fills one object this way.
    pub fn start(
        order: Vec<u64>,
        max_bytes: u64,
        workers: usize,
        block_bytes: impl Fn(u64) -> u64 + Send + Sync + 'static,
        fetch: impl Fn(u64) -> Result<bool> + Send + Sync + 'static,
    ) -> Warming {
        let shared = Arc::new(Shared {
            total: order.len() as u64,
            fetched: AtomicU64::new(0),
            present: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            cancel: AtomicBool::new(false),
            finished: Mutex::new(order.is_empty()),
            done: Condvar::new(),
        });
        if order.is_empty() {
            return Warming { shared };
        }
        let state = Arc::clone(&shared);
        let run = move || {
            // A unit that finds the fill cancelled or over its bytes fails,
            // so the pool starts no further one.
            let _ = durable_fs::Pool::new(workers).try_map(&order, |&i| {
                if state.cancel.load(Ordering::Relaxed)
                    || state.bytes.load(Ordering::Relaxed) >= max_bytes
                {
                    return Err(());
                }
                match fetch(i) {
                    Ok(true) => {
                        state.fetched.fetch_add(1, Ordering::Relaxed);
                        state.bytes.fetch_add(block_bytes(i), Ordering::Relaxed);
                    }
                    Ok(false) => {
                        state.present.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        state.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            });
            *state.finished.lock().unwrap_or_else(|p| p.into_inner()) = true;
            state.done.notify_all();
        };
        if std::thread::Builder::new()
            .name("cachex-warm".into())
            .spawn(run)
            .is_err()
        {
            // No thread: nothing is warmed; reads fetch what they need.
            *shared.finished.lock().unwrap_or_else(|p| p.into_inner()) = true;
        }
        Warming { shared }
    }

    /// Waits at most `timeout` for the fill to end; whether it has.
    pub fn wait(&self, timeout: Duration) -> bool {
        let finished = self
            .shared
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let (finished, _) = self
            .shared
            .done
            .wait_timeout_while(finished, timeout, |f| !*f)
            .unwrap_or_else(|p| p.into_inner());
        *finished
    }

    /// Whether the fill has ended (done, over its bytes, or cancelled).
    pub fn is_finished(&self) -> bool {
        *self
            .shared
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the fill after the blocks in flight.
    pub fn cancel(&self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
    }

    /// Blocks asked for.
    pub fn total(&self) -> u64 {
        self.shared.total
    }

    /// Blocks this fill fetched.
    pub fn fetched(&self) -> u64 {
        self.shared.fetched.load(Ordering::Relaxed)
    }

    /// Blocks that were local already.
    pub fn present(&self) -> u64 {
        self.shared.present.load(Ordering::Relaxed)
    }

    /// Blocks whose fetch failed (left for the reads to fetch).
    pub fn failed(&self) -> u64 {
        self.shared.failed.load(Ordering::Relaxed)
    }

    /// Bytes fetched.
    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Relaxed)
    }

    /// The fills of several objects as one: finished when all are, counts
    /// summed.
    pub fn all(fills: Vec<Warming>) -> WarmingSet {
        WarmingSet { fills }
    }
}

/// Several [`Warming`]s, as one reader's prefetch of several objects.
#[derive(Debug, Clone, Default)]
pub struct WarmingSet {
    fills: Vec<Warming>,
}

impl WarmingSet {
    /// Waits at most `timeout` in all for every fill to end; whether they have.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        self.fills
            .iter()
            .all(|f| f.wait(deadline.saturating_duration_since(std::time::Instant::now())))
    }

    /// Whether every fill has ended.
    pub fn is_finished(&self) -> bool {
        self.fills.iter().all(Warming::is_finished)
    }

    /// Stops every fill after the blocks in flight.
    pub fn cancel(&self) {
        self.fills.iter().for_each(Warming::cancel);
    }

    /// Blocks fetched, over every fill.
    pub fn fetched(&self) -> u64 {
        self.fills.iter().map(Warming::fetched).sum()
    }

    /// Blocks whose fetch failed, over every fill.
    pub fn failed(&self) -> u64 {
        self.fills.iter().map(Warming::failed).sum()
    }

    /// Bytes fetched, over every fill.
    pub fn bytes(&self) -> u64 {
        self.fills.iter().map(Warming::bytes).sum()
    }

    /// Blocks asked for, over every fill.
    pub fn total(&self) -> u64 {
        self.fills.iter().map(Warming::total).sum()
    }
}
