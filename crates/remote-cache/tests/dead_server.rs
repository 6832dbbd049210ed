//! A server that stops answering during a cold open: the open fails, and
//! the objects the background opener had not started yet are never asked
//! for (it stops, rather than trying each one up to its own timeout).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{keyed, new_bucket_url, s3_endpoint, s3_location, s3_options, small_tier};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetResult, ObjectStore};
use remote_cache::{RemoteDir, SegmentsAt, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, build_store};
use tensor_core::{Tensor, Value};
use test_support::intercept::{Intercept, Intercepted};

/// Once `dead`, every request for an object hangs (past any call bound)
/// and is counted; commit records still answer, so the open learns what
/// to link before the server stops.
#[derive(Debug, Default)]
struct Hangs {
    dead: AtomicBool,
    asked: AtomicU64,
}

#[async_trait]
impl Intercept for Hangs {
    fn name(&self) -> &'static str {
        "HangingStore"
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if self.dead.load(Ordering::SeqCst) && location.as_ref().contains("objects/") {
            self.asked.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        inner.get_opts(location, options).await
    }
}

fn record(i: usize) -> Value {
    let values: Vec<f32> = (0..256).map(|j| (i * 256 + j) as f32).collect();
    Value::from(Tensor::from_vec([16, 16], values).unwrap())
}

#[test]
fn a_cold_open_on_a_server_that_stops_answering_fails_without_asking_for_every_segment() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "caches/dead");
    let wt = tempfile::tempdir().unwrap();
    let writer = SegmentsAt::open(
        &s3_location(&endpoint, &url, wt.path()),
        segment_store::Options {
            flush_every: 1,
            ..segment_store::Options::default()
        },
    )
    .unwrap();
    let segments = 64;
    writer.put_batch(&keyed("k", 0..segments, record)).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    let rt = tempfile::tempdir().unwrap();
    let (inner, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let hangs = Arc::new(Hangs::default());
    let store = Arc::new(Intercepted::new(inner, Arc::clone(&hangs)));
    let mut config = small_tier(&rt.path().join("tier"), 1 << 30);
    config.parallelism = 2;
    config.retry.attempts = 1;
    config.retry.request_timeout = Duration::from_millis(300);
    let tier = RemoteTier::with_store(store, prefix, &url, config).unwrap();
    let remote = RemoteDir::open_unapplied(
        tier,
        &rt.path().join("work"),
        StoreFiles::for_kind(StoreKind::SegmentStore),
    )
    .unwrap();
    hangs.dead.store(true, Ordering::SeqCst);
    let opened = remote.refresh();
    assert!(opened.is_err(), "the open reports the dead server");
    let asked = hangs.asked.load(Ordering::SeqCst);
    // At most: one window of the whole pieces fetched ahead (16 at once,
    // remote-cache's `prefetch::IN_FLIGHT`), the opens in flight in the
    // background (its parallelism, 2) and the apply's own; never one per
    // segment.
    let most = 16 + 2 + 1;
    assert!(
        asked <= most,
        "{asked} requests for objects after the server stopped (at most {most}), of {segments} segments"
    );
}
