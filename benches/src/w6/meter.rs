//! A pass-through object store that counts requests and bytes and adds a
//! fixed latency to each request: the same wrapper under the store's
//! reads and under the yardstick's, so both pay the same round trips.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResult, ListResult, ObjectStore, PutOptions, PutPayload, PutResult,
};
use test_support::intercept::{Intercept, Intercepted};

/// Counts requests and bytes, and adds `latency` to each request (but a
/// streamed LIST, which is only counted).
#[derive(Debug)]
pub struct Meter {
    latency: Duration,
    requests: AtomicU64,
    bytes: AtomicU64,
}

impl Meter {
    /// `inner` behind a new meter adding `latency` to each request.
    pub fn wrap(
        inner: Arc<dyn ObjectStore>,
        latency: Duration,
    ) -> (Arc<dyn ObjectStore>, Arc<Meter>) {
        let meter = Arc::new(Meter {
            latency,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        });
        (Arc::new(Intercepted::new(inner, Arc::clone(&meter))), meter)
    }

    /// Requests sent so far (GET, HEAD, PUT, LIST).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Body bytes of the GETs answered so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    async fn wait(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }
}

#[async_trait]
impl Intercept for Meter {
    fn name(&self) -> &'static str {
        "Metered"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.wait().await;
        inner.put_opts(location, payload, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.wait().await;
        let head = options.head;
        let got = inner.get_opts(location, options).await?;
        if !head {
            self.bytes
                .fetch_add(got.range.end - got.range.start, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn list(&self, _prefix: Option<&ObjectPath>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.wait().await;
        inner.list_with_delimiter(prefix).await
    }
}
