//! [`Publisher`]: on a URL, what a writer persists in its working
//! directory reaches the bucket without a call to `publish`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What a publish that failed says (shown, never matched on).
pub type PublishError = Box<dyn std::error::Error + Send + Sync>;

/// What a [`Publisher`] calls returns.
pub type PublishResult = std::result::Result<(), PublishError>;

/// The environment variable that sets the period of background publishes,
/// in seconds (fractions allowed; `0` turns them off: then only drops and
/// the process's exit publish).
pub const PUBLISH_INTERVAL_ENV: &str = "CACHEX_PUBLISH_INTERVAL";

/// The period of background publishes when [`PUBLISH_INTERVAL_ENV`] is
/// not set: what a killed writer may lose at most.
pub const DEFAULT_PUBLISH_INTERVAL: Duration = Duration::from_secs(5);

/// How long a drop (or the process's exit, for all handles at once) waits
/// for its last publish; one still running then is left to finish in the
/// background and reported.
pub const LAST_PUBLISH_BOUND: Duration = Duration::from_secs(60);

/// The period of background publishes: [`PUBLISH_INTERVAL_ENV`] if set to
/// a number of seconds, else [`DEFAULT_PUBLISH_INTERVAL`]; `None` when it
/// is `0` (no background publishes). A value that is not a number is
/// ignored (the default holds), as the tier's environment variables are.
pub fn publish_interval() -> Option<Duration> {
    let given = std::env::var(PUBLISH_INTERVAL_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0);
    match given {
        None => Some(DEFAULT_PUBLISH_INTERVAL),
        // Past what a Duration holds: as good as never, but still on drop.
        Some(s) => (s > 0.0).then(|| Duration::try_from_secs_f64(s).unwrap_or(Duration::MAX)),
    }
}

/// Which publish a [`Publisher`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Publish {
    /// A background one: what the store persisted, as it is.
    Tick,
    /// The last one (a drop, the process's exit): the store first makes
    /// durable what it still holds, as its drop would.
    Last,
}

/// What a publisher calls.
type PublishFn = dyn Fn(Publish) -> PublishResult + Send + Sync;

struct Shared {
    publish: Box<PublishFn>,
    /// The cache as it may be shown (its URL redacted), for reports.
    shown: String,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    /// The background thread is to stop.
    stop: bool,
    /// The last publish was started: no other follows.
    last_started: bool,
    last_error: Option<String>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops the background publishes and starts the last publish on a
    /// thread of its own, whose answer comes on the receiver; `None` when
    /// the last publish was started before.
    fn start_last(self: &Arc<Shared>) -> Option<Receiver<PublishResult>> {
        {
            let mut state = self.state();
            state.stop = true;
            if std::mem::replace(&mut state.last_started, true) {
                return None;
            }
        }
        self.wake.notify_all();
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("cachex-publish-last".into())
            .spawn(move || {
                let _ = tx.send((shared.publish)(Publish::Last));
            });
        match spawned {
            Ok(_) => Some(rx),
            Err(e) => {
                // No thread to spare: publish here, unbounded by us but
                // still by every call's own bound.
                let (tx, rx) = std::sync::mpsc::channel();
                let _ = tx.send((self.publish)(Publish::Last));
                report(&format!(
                    "{}: no thread for the last publish: {e}",
                    self.shown
                ));
                Some(rx)
            }
        }
    }

    /// The last publish's outcome as a failure to report, waiting until
    /// `deadline` at most.
    fn wait_last(&self, rx: &Receiver<PublishResult>, deadline: Instant) -> Option<String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("{}: the last publish failed: {e}", self.shown)),
            Err(RecvTimeoutError::Timeout) => Some(format!(
                "{}: the last publish was still running after {:?}; it goes on in the \
                 background, and what it has not committed when the process exits is lost",
                self.shown, LAST_PUBLISH_BOUND
            )),
            Err(RecvTimeoutError::Disconnected) => {
                Some(format!("{}: the last publish panicked", self.shown))
            }
        }
    }
}

/// Publishes a writer's working directory on a period and once more when
/// dropped (see below). Held by the handle it publishes
/// for, after the store in field order: the store's own drop (its last
/// flush) comes first.
///
/// [`Publisher`]: on a URL, what a writer persists in its working
/// directory reaches the bucket without a call to `publish`.
///
/// A store opened on a URL writes its working directory exactly as it
/// writes a local one: a shard renamed into place once whole, a segment
/// and its index group at each flush. Users of the Python tools cachex
/// replaces (loadit, torchcachex) never call a `publish` — those tools
/// persist as they go — so a writer on a URL publishes on its own:
///
/// - **On a period** ([`publish_interval`]: [`DEFAULT_PUBLISH_INTERVAL`],
///   or `CACHEX_PUBLISH_INTERVAL` seconds, `0` for never), a background
///   thread publishes what the store persisted since — each completed
///   shard, each flushed segment — as one commit. It never flushes a
///   store itself: a segment store's pending records become a segment on
///   the store's own schedule, as they would locally.
/// - **When the handle is dropped**, or at the process's exit
///   ([`publish_all_at_exit`], which the Python package calls from
///   `atexit` and a `multiprocessing` child's exit), a last publish takes whatever is left (after the store
///   flushed what it held, as its drop does locally). It is bounded
///   ([`LAST_PUBLISH_BOUND`]): a server that does not answer delays the
///   drop by that much at most, and its failure is reported
///   ([`take_failures`], or standard error), never raised from a drop.
///
/// A writer killed (`SIGKILL`, a node lost) loses what it persisted since
/// its last publish: at most one interval's work, which its working
/// directory still holds for a writer that reopens it on that machine.
/// Publishing mid-write is safe: every commit is whole or absent, and a
/// segment store's publish waits for the flush in progress
/// ([`SegmentStore::while_committed`](segment_store::SegmentStore::while_committed)).
pub struct Publisher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("cache", &self.shared.shown)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Starts publishing the cache shown as `shown` by calling `publish`:
    /// every `interval` on a background thread (`None`: never), and with
    /// [`Publish::Last`] when dropped or at the process's exit.
    pub fn start(
        shown: String,
        interval: Option<Duration>,
        publish: impl Fn(Publish) -> PublishResult + Send + Sync + 'static,
    ) -> Publisher {
        let shared = Arc::new(Shared {
            publish: Box::new(publish),
            shown,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        register(&shared);
        if let Some(period) = interval {
            let thread = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("cachex-publish".into())
                .spawn(move || tick(&thread, period));
            if let Err(e) = spawned {
                shared.state().last_error = Some(format!("no publishing thread: {e}"));
            }
        }
        Publisher { shared }
    }

    /// Stops publishing: no background publish after the one in progress,
    /// and none when dropped or at exit. For a handle that writes but is
    /// not the one that publishes (a copy reopened in a worker process,
    /// whose original publishes).
    pub fn stop(&self) {
        {
            let mut state = self.shared.state();
            state.stop = true;
            state.last_started = true;
        }
        self.shared.wake.notify_all();
    }

    /// The last background publish's error, if it failed (the next
    /// period tries again).
    pub fn last_error(&self) -> Option<String> {
        self.shared.state().last_error.clone()
    }
}

/// The background publishes of `shared`, every `period` until stopped.
fn tick(shared: &Shared, period: Duration) {
    let mut state = shared.state();
    loop {
        let (next, _) = shared
            .wake
            .wait_timeout_while(state, period, |s| !s.stop)
            .unwrap_or_else(|p| p.into_inner());
        if next.stop {
            return;
        }
        drop(next);
        let outcome = (shared.publish)(Publish::Tick).err().map(|e| e.to_string());
        state = shared.state();
        state.last_error = outcome;
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let Some(rx) = self.shared.start_last() else {
            return;
        };
        if let Some(failure) = self
            .shared
            .wait_last(&rx, Instant::now() + LAST_PUBLISH_BOUND)
        {
            report(&failure);
        }
    }
}

/// The live publishers of this process, for [`publish_all_at_exit`].
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
/// The process the entries of [`LIVE`] belong to (0: none yet). A forked
/// child inherits them, and must never publish its parent's directories.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// [`LIVE`], or `None` if it cannot be had within a second: a process
/// forked while another thread held it finds it held forever, and then
/// goes without (its publishers still publish on drop).
fn live() -> Option<MutexGuard<'static, Vec<Weak<Shared>>>> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match LIVE.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

fn register(shared: &Arc<Shared>) {
    let pid = std::process::id();
    let Some(mut live) = live() else { return };
    if OWNER.swap(pid, Ordering::AcqRel) != pid {
        // Inherited from a parent process: never ours to publish.
        live.clear();
    }
    live.retain(|w| w.strong_count() > 0);
    live.push(Arc::downgrade(shared));
}

/// Publishes, for the last time, every writer of this process still open
/// (their handles' drops then publish nothing more): all at once, waiting
/// `bound` at most in all. Returns what failed or was still running, one
/// line each. For the process's exit (the Python package's `atexit` and
/// `multiprocessing` exit finalizer), where handles may never be dropped;
/// a second call publishes nothing. A forked child publishes only the
/// writers it opened itself.
pub fn publish_all_at_exit(bound: Duration) -> Vec<String> {
    if OWNER.load(Ordering::Acquire) != std::process::id() {
        return Vec::new();
    }
    let Some(mut live) = live() else {
        return vec!["the list of open writers is held: nothing published at exit".into()];
    };
    let open: Vec<Arc<Shared>> = live.drain(..).filter_map(|w| w.upgrade()).collect();
    drop(live);
    let deadline = Instant::now() + bound;
    let started: Vec<_> = open
        .iter()
        .filter_map(|s| s.start_last().map(|rx| (s, rx)))
        .collect();
    let mut failures: Vec<String> = started
        .into_iter()
        .filter_map(|(s, rx)| s.wait_last(&rx, deadline))
        .collect();
    failures.extend(take_failures());
    failures
}

/// Whether failures of last publishes are kept for [`take_failures`]
/// rather than written to standard error.
static COLLECT: AtomicBool = AtomicBool::new(false);
static FAILURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the failures of last publishes (which a drop cannot return) for
/// [`take_failures`] from now on, instead of writing them to standard
/// error: for a caller that reports them its own way (the Python package
/// raises them as warnings).
pub fn collect_failures() {
    COLLECT.store(true, Ordering::Release);
}

/// The failures of last publishes since the previous call (see
/// [`collect_failures`]).
pub fn take_failures() -> Vec<String> {
    match FAILURES.try_lock() {
        Ok(mut f) => std::mem::take(&mut *f),
        Err(std::sync::TryLockError::Poisoned(p)) => std::mem::take(&mut *p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => Vec::new(),
    }
}

fn report(failure: &str) {
    if COLLECT.load(Ordering::Acquire)
        && let Ok(mut f) = FAILURES.lock()
    {
        // Bounded: a caller that never takes them keeps the latest.
        if f.len() >= 1024 {
            f.remove(0);
        }
        f.push(failure.to_string());
        return;
    }
    eprintln!("cachex warning: {failure}");
}

/// The publisher of a working directory whose store persists by renames
/// alone (a shard store: shards and `metadata.json` appear whole): any
/// moment is a consistent one to publish.
pub(crate) fn for_dir(remote: &Arc<crate::RemoteDir>) -> Publisher {
    let shown = crate::redact_url(remote.tier().url());
    let remote = Arc::clone(remote);
    Publisher::start(shown, publish_interval(), move |_| {
        remote.publish_if_changed()?;
        Ok(())
    })
}

/// The publisher of a segment store's working directory (`None` for a
/// read-only store): each publish waits for the flush in progress, and
/// the last one first flushes what the store still holds (unless the
/// store is gone, its drop having flushed it).
pub(crate) fn for_segments(
    store: &Arc<segment_store::SegmentStore>,
    remote: &Arc<crate::RemoteDir>,
) -> Option<Publisher> {
    if !store.is_writer() {
        return None;
    }
    let shown = crate::redact_url(remote.tier().url());
    let (store, remote) = (Arc::downgrade(store), Arc::clone(remote));
    Some(Publisher::start(shown, publish_interval(), move |step| {
        match store.upgrade() {
            Some(store) => {
                if step == Publish::Last {
                    store.flush()?;
                }
                store.while_committed(|| remote.publish_if_changed())?;
            }
            None => {
                remote.publish_if_changed()?;
            }
        }
        Ok(())
    }))
}
