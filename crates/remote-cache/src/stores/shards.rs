//! [`ShardsAt`]: a shard-store root on a location.

use std::ops::Deref;
use std::sync::Arc;

use shard_store::{ShardStore, StoreItem};

use crate::Result;
use crate::location::Location;
use crate::publisher::{self, Publisher};
use crate::remote_dir::{PublishReport, RefreshReport, RemoteDir};
use crate::{StoreFiles, StoreKind};

/// A shard-store root on a [`Location`]: shards published by others are
/// materialised before the store opens; shards this process generates
/// from its source are uploaded by [`publish`](Self::publish).
///
/// One process generates a remote root at a time: two that both write
/// `metadata.json` get [`Error::Conflict`](crate::Error::Conflict) at the second publish.
#[derive(Debug)]
pub struct ShardsAt<T> {
    store: ShardStore<T>,
    // After the store (whose drop stops its workers), before the commit
    // log: the last publish takes every shard the store completed.
    publisher: Option<Publisher>,
    remote: Option<Arc<RemoteDir>>,
}

impl<T: StoreItem> ShardsAt<T> {
    /// Opens the published root at `location` without a source.
    pub fn open(location: &Location, options: shard_store::Options) -> Result<ShardsAt<T>> {
        let opened = location.open(StoreFiles::for_kind(StoreKind::ShardStore))?;
        let store = ShardStore::open(&opened.dir, options)?;
        let remote = opened.remote.map(Arc::new);
        Ok(ShardsAt {
            store,
            publisher: remote.as_ref().map(publisher::for_dir),
            remote,
        })
    }

    /// Opens the root at `location` over `source`, which generates the
    /// shards not published yet (see [`ShardStore::open_with_source`]).
    pub fn open_with_source<F, I>(
        location: &Location,
        options: shard_store::Options,
        source: F,
    ) -> Result<ShardsAt<T>>
    where
        F: Fn() -> I + Send + Sync + 'static,
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        let opened = location.open(StoreFiles::for_kind(StoreKind::ShardStore))?;
        let store = ShardStore::open_with_source(&opened.dir, options, source)?;
        let remote = opened.remote.map(Arc::new);
        Ok(ShardsAt {
            store,
            publisher: remote.as_ref().map(publisher::for_dir),
            remote,
        })
    }

    /// The store (also reachable through `Deref`).
    pub fn store(&self) -> &ShardStore<T> {
        &self.store
    }

    /// The commit log behind a remote root (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_deref()
    }

    /// Publishes the shards (and metadata) generated since the last
    /// publish. Shards are written by rename once whole, so any moment
    /// is a consistent one to publish.
    pub fn publish(&self) -> Result<PublishReport> {
        match &self.remote {
            Some(r) => r.publish(),
            // A local location publishes nothing.
            None => Ok(PublishReport::default()),
        }
    }

    /// Publishes nothing on its own from now on (no background publishes,
    /// none when dropped): for a copy of a writer reopened in a worker
    /// process, whose original publishes. [`publish`](Self::publish) still
    /// does.
    pub fn stop_publishing(&self) {
        if let Some(p) = &self.publisher {
            p.stop();
        }
    }

    /// Applies the commits published since (more shards, a longer length).
    pub fn refresh(&self) -> Result<RefreshReport> {
        match &self.remote {
            Some(r) => r.refresh(),
            None => Ok(RefreshReport::default()),
        }
    }
}

impl<T> Deref for ShardsAt<T> {
    type Target = ShardStore<T>;
    fn deref(&self) -> &ShardStore<T> {
        &self.store
    }
}
