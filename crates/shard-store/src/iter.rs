//! Sequential iteration over a store: whole decoded shards
//! ([`ShardIter`]) and the items in them ([`Iter`]).

use std::sync::Arc;

use crate::error::Result;
use crate::format::StoreItem;
use crate::inner::Inner;

/// Iterator of [`ShardStore::iter`](crate::ShardStore::iter).
pub struct Iter<T> {
    shards: ShardIter<T>,
    current: Current<T>,
}

enum Current<T> {
    None,
    Shared(Arc<Vec<T>>, usize),
    Owned(std::vec::IntoIter<T>),
}

impl<T> Iter<T> {
    pub(crate) fn new(shards: ShardIter<T>) -> Iter<T> {
        Iter {
            shards,
            current: Current::None,
        }
    }
}

impl<T: StoreItem + Clone> Iterator for Iter<T> {
    type Item = Result<T>;
    fn next(&mut self) -> Option<Result<T>> {
        loop {
            match &mut self.current {
                Current::Shared(shard, offset) => {
                    if let Some(x) = shard.get(*offset) {
                        *offset += 1;
                        return Some(Ok(x.clone()));
                    }
                }
                Current::Owned(items) => {
                    if let Some(x) = items.next() {
                        return Some(Ok(x));
                    }
                }
                Current::None => {}
            }
            match self.shards.next_ref(true)? {
                Ok(ShardRef::Shared(shard)) => self.current = Current::Shared(shard, 0),
                Ok(ShardRef::Owned(items)) => self.current = Current::Owned(items.into_iter()),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// A decoded shard: shared with the memory cache, or read privately.
pub(crate) enum ShardRef<T> {
    Shared(Arc<Vec<T>>),
    Owned(Vec<T>),
}

impl<T> ShardRef<T> {
    fn len(&self) -> usize {
        match self {
            ShardRef::Shared(s) => s.len(),
            ShardRef::Owned(v) => v.len(),
        }
    }
}

/// Iterator of [`ShardStore::iter_shards`](crate::ShardStore::iter_shards):
/// each decoded shard in order.
pub struct ShardIter<T> {
    inner: Arc<Inner<T>>,
    next_start: u64,
    done: bool,
}

impl<T: StoreItem> ShardIter<T> {
    pub(crate) fn new(inner: Arc<Inner<T>>) -> ShardIter<T> {
        ShardIter {
            inner,
            next_start: 0,
            done: false,
        }
    }

    /// The next shard; with `private`, a shard that is not in the memory
    /// cache is read from disk for the caller alone (not cached, not shared).
    fn next_ref(&mut self, private: bool) -> Option<Result<ShardRef<T>>> {
        if self.done {
            return None;
        }
        let start = self.next_start;
        let got = if private {
            self.inner.shard_for_iteration(start)
        } else {
            self.inner
                .shard(start, start)
                .map(|s| s.map(ShardRef::Shared))
        };
        match got {
            Ok(Some(shard)) => {
                self.next_start = start + shard.len() as u64;
                if (shard.len() as u64) < self.inner.shard_len {
                    self.done = true;
                }
                Some(Ok(shard))
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl<T: StoreItem> Iterator for ShardIter<T> {
    type Item = Result<Arc<Vec<T>>>;
    fn next(&mut self) -> Option<Result<Arc<Vec<T>>>> {
        self.next_ref(false).map(|r| {
            r.map(|s| match s {
                ShardRef::Shared(a) => a,
                ShardRef::Owned(v) => Arc::new(v),
            })
        })
    }
}
