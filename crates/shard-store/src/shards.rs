//! The decoded-shard cache every handle shares: a shard found in memory,
//! read from disk or generated from the source, kept within the memory
//! limit, the preload workers that fetch shards ahead, and [`Item`], an
//! item borrowed from its shard.

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::format::StoreItem;
use crate::inner::{Cursor, Inner, Job};
use crate::iter::ShardRef;

/// One item, borrowed from its decoded shard (no copy).
#[derive(Clone)]
pub struct Item<T> {
    pub(crate) shard: Arc<Vec<T>>,
    pub(crate) index: usize,
}

impl<T> Deref for Item<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.shard[self.index]
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Item<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: PartialEq> PartialEq<T> for Item<T> {
    fn eq(&self, other: &T) -> bool {
        **self == *other
    }
}

impl<T: Clone> Item<T> {
    /// The item as an owned value (a clone).
    pub fn to_owned_item(&self) -> T {
        (**self).clone()
    }
}

impl<T: StoreItem> Inner<T> {
    pub(crate) fn next_tick(&self) -> u64 {
        self.tick.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn touch_disk(&self, start: u64) {
        let t = self.next_tick();
        self.state.lock().disk_access.insert(start, t);
    }

    pub(crate) fn len(&self) -> Result<u64> {
        if let Some(len) = self.final_length_refreshed()? {
            return Ok(len);
        }
        // A short shard fixes the length even if a crash kept it out of the metadata.
        let short = self
            .shard_files()?
            .into_iter()
            .filter(|n| n.len() < self.shard_len)
            .map(|n| n.end)
            .max();
        if let Some(len) = short {
            if self.source.is_some() {
                self.set_final_length(len)?;
            } else {
                self.state.lock().length = Some(len);
            }
            return Ok(len);
        }
        if let Some(len) = self.opts.length {
            return Ok(len);
        }
        if self.source.is_none() {
            return Err(Error::LengthUnknown {
                root: self.root.clone(),
            });
        }
        self.drive_to_end()
    }

    pub(crate) fn item(&self, i: u64, asked: i64) -> Result<Item<T>> {
        let start = i - i % self.shard_len;
        let shard = self.shard(start, i)?;
        match shard {
            Some(shard) if ((i - start) as usize) < shard.len() => Ok(Item {
                shard,
                index: (i - start) as usize,
            }),
            _ => Err(Error::IndexOutOfRange {
                index: asked,
                len: self.state.lock().length.unwrap_or(i) as usize,
            }),
        }
    }

    /// The decoded shard starting at `start` (`None` past the end), from
    /// memory, disk or the source; `wanted` is the index asked for (errors).
    pub(crate) fn shard(&self, start: u64, wanted: u64) -> Result<Option<Arc<Vec<T>>>> {
        self.shard_with(start, wanted, true)
    }

    /// [`Inner::shard`]; `preload` marks a foreground access, which
    /// schedules the shards after it (background loads do not, or preloads
    /// would chain through the store) and counts a memory-cache miss.
    pub(crate) fn shard_with(
        &self,
        start: u64,
        wanted: u64,
        preload: bool,
    ) -> Result<Option<Arc<Vec<T>>>> {
        let t = self.next_tick();
        {
            let mut state = self.state.lock();
            if let Some((shard, tick)) = state.cache.get_mut(&start) {
                *tick = t;
                let shard = Arc::clone(shard);
                drop(state);
                if preload {
                    self.preload_after(start);
                }
                return Ok(Some(shard));
            }
            if state.length.is_some_and(|len| start >= len) {
                return Ok(None);
            }
        }
        if preload {
            self.memory_misses.fetch_add(1, Ordering::Relaxed);
        }
        let loaded = match self.load_from_disk_or_quarantine(start)? {
            Some(shard) => Some(shard),
            None => {
                self.disk_misses.fetch_add(1, Ordering::Relaxed);
                if self.source.is_none() {
                    if self
                        .final_length_refreshed()?
                        .is_some_and(|len| start >= len)
                    {
                        return Ok(None);
                    }
                    return Err(Error::NotCached {
                        root: self.root.clone(),
                        index: wanted as usize,
                    });
                }
                self.generate(start)?
            }
        };
        if let Some(shard) = &loaded {
            self.insert_cache(start, Arc::clone(shard));
            if preload {
                self.preload_after(start);
            }
        }
        Ok(loaded)
    }

    /// Like [`Inner::shard`], but a shard read from disk is returned owned
    /// and is not put in the memory cache.
    pub(crate) fn shard_for_iteration(&self, start: u64) -> Result<Option<ShardRef<T>>> {
        let t = self.next_tick();
        {
            let mut state = self.state.lock();
            if let Some((shard, tick)) = state.cache.get_mut(&start) {
                *tick = t;
                return Ok(Some(ShardRef::Shared(Arc::clone(shard))));
            }
            if state.length.is_some_and(|len| start >= len) {
                return Ok(None);
            }
        }
        if let Some(shard) = self.load_from_disk_or_quarantine(start)? {
            self.memory_misses.fetch_add(1, Ordering::Relaxed);
            return Ok(Some(match Arc::try_unwrap(shard) {
                Ok(items) => ShardRef::Owned(items),
                Err(shared) => ShardRef::Shared(shared),
            }));
        }
        // A foreground lookup: it counts its own misses.
        Ok(self.shard(start, start)?.map(ShardRef::Shared))
    }

    pub(crate) fn insert_cache(&self, start: u64, shard: Arc<Vec<T>>) {
        let t = self.next_tick();
        let mut state = self.state.lock();
        state.cache.insert(start, (shard, t));
        while state.cache.len() > self.opts.max_cache_size {
            let Some(oldest) = state
                .cache
                .iter()
                .min_by_key(|(_, (_, tick))| *tick)
                .map(|(k, _)| *k)
            else {
                break;
            };
            state.cache.remove(&oldest);
        }
    }

    pub(crate) fn submit(&self, job: Job) {
        if let Some(tx) = &self.jobs {
            // A closed channel only means the workers are gone.
            let _ = tx.lock().send(job);
        }
    }

    pub(crate) fn preload_after(&self, start: u64) {
        if self.jobs.is_none() || self.source.is_none() {
            return;
        }
        let n = self.preload.load(Ordering::Relaxed);
        if n == 0 {
            return;
        }
        let mut todo = Vec::new();
        {
            let mut state = self.state.lock();
            for k in 1..=n as u64 {
                let s = start.saturating_add(k.saturating_mul(self.shard_len));
                if state.length.is_some_and(|len| s >= len) {
                    break;
                }
                if !state.cache.contains_key(&s) && state.pending.insert(s) {
                    todo.push(s);
                }
            }
        }
        for s in todo {
            self.submit(Job::Shard(s));
        }
    }

    /// Picks the free cursor nearest before `start`, or waits for one.
    pub(crate) fn take_cursor(&self, start: u64) -> parking_lot::MutexGuard<'_, Option<Cursor<T>>> {
        let mut best: Option<(i128, parking_lot::MutexGuard<'_, Option<Cursor<T>>>)> = None;
        for c in &self.cursors {
            if let Some(g) = c.try_lock() {
                let score = match g.as_ref() {
                    Some(cur) if cur.pos <= start && !cur.done => cur.pos as i128,
                    Some(cur) if cur.done && cur.pos <= start => i128::MAX,
                    None => -1,
                    Some(_) => -2,
                };
                if best.as_ref().is_none_or(|(s, _)| score > *s) {
                    best = Some((score, g));
                }
            }
        }
        match best {
            Some((_, g)) => g,
            None => {
                let k = (start / self.shard_len) as usize % self.cursors.len();
                self.cursors[k].lock()
            }
        }
    }
}

pub(crate) fn worker_loop<T: StoreItem>(inner: Arc<Inner<T>>, rx: Arc<Mutex<mpsc::Receiver<Job>>>) {
    loop {
        let job = {
            let rx = rx.lock();
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        if inner.stop.load(Ordering::SeqCst) {
            return;
        }
        match job {
            Job::Stop => return,
            Job::Shard(start) => {
                // Errors surface again when the shard is asked for in the foreground.
                let _ = inner.shard_with(start, start, false);
                inner.state.lock().pending.remove(&start);
            }
            Job::All => {
                let mut start = 0;
                while !inner.stop.load(Ordering::SeqCst) {
                    match inner.shard_with(start, start, false) {
                        Ok(Some(_)) => start += inner.shard_len,
                        _ => break,
                    }
                }
            }
        }
    }
}
