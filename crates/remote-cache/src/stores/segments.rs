//! [`RemoteSegments`]: a segment-store cache on a location.

use std::ops::Deref;

use segment_store::SegmentStore;

use super::local_publish;
use crate::Result;
use crate::files::{StoreFiles, StoreKind};
use crate::journal::{PublishReport, RefreshReport, RemoteDir};
use crate::location::Location;

/// A segment-store cache on a [`Location`]: read, and append.
///
/// Remote: every published segment and index log is materialised in the
/// working directory before the store opens it (the store maps every
/// segment); [`publish`](Self::publish) uploads the segments and index
/// bytes written since, then the commit record. Several writers append to
/// one remote cache when each has its own
/// [`writer_id`](segment_store::Options::writer_id); two writers that
/// write the same segment id cannot both publish it ([`Error::Conflict`](crate::Error::Conflict)).
#[derive(Debug)]
pub struct RemoteSegments {
    // Dropped before the commit log: the store's files stay while it lives.
    store: SegmentStore,
    remote: Option<RemoteDir>,
}

impl RemoteSegments {
    /// Opens the segment store at `location` with `options`. A reader
    /// whose working directory holds earlier commits opens its store while
    /// the request that learns what was published since is in flight
    /// ([`with_unapplied`](RemoteSegments::with_unapplied)).
    pub fn open(location: &Location, options: segment_store::Options) -> Result<RemoteSegments> {
        let opened = location.open_unapplied(StoreFiles::for_kind(StoreKind::Segments))?;
        match opened.remote {
            Some(remote) => RemoteSegments::with_unapplied(remote, options),
            None => Ok(RemoteSegments {
                store: SegmentStore::open(&opened.dir, options)?,
                remote: None,
            }),
        }
    }

    /// Opens the store in the working directory of `remote`, opened with
    /// [`RemoteDir::open_unapplied`], and applies what was published
    /// since: the store sees every commit published before this returns.
    ///
    /// For a read-only store over a working directory that holds earlier
    /// commits, the request for the next commit and the store's own open
    /// (reading its index logs) run at once — nothing changes in the
    /// directory until both are done — and the store refreshes after
    /// applying whatever that request found; a warm open then costs the
    /// longer of the two, not their sum. A writer, or an empty working
    /// directory, applies first and opens after, as
    /// [`with_remote`](RemoteSegments::with_remote).
    pub fn with_unapplied(
        remote: RemoteDir,
        options: segment_store::Options,
    ) -> Result<RemoteSegments> {
        if !options.read_only || remote.seq() == 0 {
            remote.refresh()?;
            return RemoteSegments::with_remote(remote, options);
        }
        let (next, store) = std::thread::scope(|s| {
            let next = s.spawn(|| remote.fetch_next());
            let store = SegmentStore::open(remote.dir(), options);
            let next = next
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (next, store)
        });
        let (next, store) = (next?, store?);
        if next.is_some() {
            remote.refresh_from(next)?;
            store.refresh()?;
        }
        Ok(RemoteSegments {
            store,
            remote: Some(remote),
        })
    }

    /// Opens the store in the working directory of `remote` (a commit log
    /// opened by the caller, e.g. over a wrapped object store).
    pub fn with_remote(
        remote: RemoteDir,
        options: segment_store::Options,
    ) -> Result<RemoteSegments> {
        let store = SegmentStore::open(remote.dir(), options)?;
        Ok(RemoteSegments {
            store,
            remote: Some(remote),
        })
    }

    /// The store (also reachable through `Deref`).
    pub fn store(&self) -> &SegmentStore {
        &self.store
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Flushes the store, then publishes what it wrote since the last
    /// publish (a no-op for a local cache).
    pub fn publish(&self) -> Result<PublishReport> {
        self.store.flush()?;
        match &self.remote {
            Some(r) => r.publish(),
            None => Ok(local_publish()),
        }
    }

    /// Applies the commits other writers published since (never half of
    /// one), then makes their segments visible to the store. Returns what
    /// the commit log did and how many segments the store gained.
    pub fn refresh(&self) -> Result<(RefreshReport, usize)> {
        let report = match &self.remote {
            Some(r) => r.refresh()?,
            None => RefreshReport::default(),
        };
        Ok((report, self.store.refresh()?))
    }
}

/// A background thread refreshing a [`RemoteSegments`] on a period
/// ([`RemoteSegments::refresh_every`]); stops when dropped, or when the
/// store is gone.
#[derive(Debug)]
pub struct Refresher {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    last_error: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

impl Refresher {
    /// The last refresh's error, if it failed (the next period tries again).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl RemoteSegments {
    /// Refreshes `store` every `period` on a background thread, until the
    /// returned [`Refresher`] is dropped or the last other handle to the
    /// store is. A failed refresh is kept in
    /// [`Refresher::last_error`] and tried again next period.
    pub fn refresh_every(
        store: &std::sync::Arc<RemoteSegments>,
        period: std::time::Duration,
    ) -> Refresher {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let weak = std::sync::Arc::downgrade(store);
        let last_error = std::sync::Arc::new(std::sync::Mutex::new(None));
        let errors = std::sync::Arc::clone(&last_error);
        let thread = std::thread::Builder::new()
            .name("cachex-refresh".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(period)
                {
                    let Some(store) = weak.upgrade() else { return };
                    let outcome = store.refresh().err().map(|e| e.to_string());
                    *errors.lock().unwrap_or_else(|p| p.into_inner()) = outcome;
                }
            })
            .ok();
        Refresher {
            stop: Some(tx),
            thread,
            last_error,
        }
    }
}

impl Deref for RemoteSegments {
    type Target = SegmentStore;
    fn deref(&self) -> &SegmentStore {
        &self.store
    }
}
