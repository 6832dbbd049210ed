//! Shared by the remote-tier integration tests: the S3 test server that
//! `scripts/test` starts, a fresh bucket per test, sample bytes, and a
//! wrapper store that counts and breaks requests.
#![allow(dead_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use remote_tier::{RemoteTier, TierConfig, build_store};
pub use test_support::s3::{endpoint as s3_endpoint, options as s3_options};

/// Creates a bucket no other test uses and returns its name.
pub fn new_bucket(endpoint: &str) -> String {
    test_support::s3::new_bucket(endpoint, "tier")
}

/// The S3 store of a fresh bucket (and the URL prefix inside it).
pub fn s3_store(endpoint: &str, prefix: &str) -> (Arc<dyn ObjectStore>, ObjectPath, String) {
    let url = format!("s3://{}/{prefix}", new_bucket(endpoint));
    let (store, path) = build_store(&url, s3_options(endpoint)).expect("build the S3 store");
    (store, path, url)
}

/// A tier over the S3 URL `url` with a local tier in `dir`.
pub fn s3_tier(endpoint: &str, url: &str, config: TierConfig) -> RemoteTier {
    RemoteTier::open_with_options(url, s3_options(endpoint), config).expect("open the S3 tier")
}

/// Small blocks so that tests cover many of them without much data.
pub fn small_config(dir: &std::path::Path, budget: u64) -> TierConfig {
    let mut config = TierConfig::new(dir, budget);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 2;
    config.parallelism = 4;
    config.retry.backoff = Duration::from_millis(5);
    config
}

/// `len` bytes that differ from object to object and from block to block.
pub fn sample(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a [`FaultyStore`] does to the next requests.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail this many of the next GETs (a transient server error).
    pub fail_gets: AtomicU64,
    /// Make this many of the next GETs hang past any timeout.
    pub hang_gets: AtomicU64,
    /// Cut the body of this many of the next GETs short by one byte.
    pub truncate_gets: AtomicU64,
    /// Fail this many of the next conditional puts before they are sent.
    pub fail_creates: AtomicU64,
    /// Perform this many of the next conditional puts, then answer with an
    /// error as if the answer were lost.
    pub lose_put_answers: AtomicU64,
    /// GET requests (not HEAD) that reached the store, ranged or not.
    pub gets: AtomicU64,
    /// Every GET range served, for checks of what was fetched.
    pub ranges: Mutex<Vec<Option<Range<u64>>>>,
}

fn take(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected fault: {what}").into(),
    }
}

/// A wrapper store that counts GETs and injects the [`Faults`] asked for.
#[derive(Debug)]
pub struct FaultyStore {
    pub inner: Arc<dyn ObjectStore>,
    pub faults: Arc<Faults>,
}

impl std::fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let conditional = matches!(opts.mode, object_store::PutMode::Create);
        if conditional && take(&self.faults.fail_creates) {
            return Err(injected("commit refused"));
        }
        let result = self.inner.put_opts(location, payload, opts).await;
        if conditional && result.is_ok() && take(&self.faults.lose_put_answers) {
            return Err(injected("answer lost after the put"));
        }
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !options.head {
            self.faults.gets.fetch_add(1, Ordering::SeqCst);
            if take(&self.faults.fail_gets) {
                return Err(injected("server error"));
            }
            if take(&self.faults.hang_gets) {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let range = match &options.range {
                Some(object_store::GetRange::Bounded(r)) => Some(r.clone()),
                _ => None,
            };
            self.faults.ranges.lock().unwrap().push(range);
            if take(&self.faults.truncate_gets) {
                let got = self.inner.get_opts(location, options).await?;
                let meta = got.meta.clone();
                let attributes = got.attributes.clone();
                let range = got.range.clone();
                let mut bytes = got.bytes().await?;
                bytes.truncate(bytes.len().saturating_sub(1));
                let body = futures::stream::once(async move { Ok(bytes) });
                return Ok(GetResult {
                    payload: object_store::GetResultPayload::Stream(Box::pin(body)),
                    meta,
                    range,
                    attributes,
                    extensions: Default::default(),
                });
            }
        }
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<ObjectPath>>,
    ) -> BoxStream<'static, object_store::Result<ObjectPath>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &ObjectPath,
        to: &ObjectPath,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// A tier over `FaultyStore(store)`; returns the tier and its faults.
pub fn faulty_tier(
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    url: &str,
    config: TierConfig,
) -> (RemoteTier, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let wrapped = Arc::new(FaultyStore {
        inner: store,
        faults: Arc::clone(&faults),
    });
    let tier = RemoteTier::with_store(wrapped, prefix, url, config).expect("open the tier");
    (tier, faults)
}
