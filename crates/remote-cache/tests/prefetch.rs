//! Warming ahead of the epoch: `prefetch` on a remote page file and on
//! remote arrays fills the local tier in the background, in the order
//! given, so that the epoch's reads send no request; and it stays within
//! the bytes it is given.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::{build_arrays, new_bucket_url, s3_endpoint, s3_options, small_tier};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetResult, ObjectStore};
use page_alloc::{PageWriter, Value, WriterOptions};
use remote_cache::{ArraysAt, PagesAt, RemoteDir, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, TierConfig, build_store};
use test_support::intercept::{Intercept, Intercepted};

/// Counts the GETs (ranged or whole) a tier sends.
#[derive(Debug, Default)]
struct Gets(AtomicU64);

#[async_trait]
impl Intercept for Gets {
    fn name(&self) -> &'static str {
        "CountingStore"
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if !options.head {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        inner.get_opts(location, options).await
    }
}

/// A tier over `url` whose GETs are counted, in `dir`.
fn counted_tier(endpoint: &str, url: &str, config: TierConfig) -> (RemoteTier, Arc<Gets>) {
    let (inner, prefix) = build_store(url, s3_options(endpoint)).unwrap();
    let gets = Arc::new(Gets::default());
    let store = Arc::new(Intercepted::new(inner, Arc::clone(&gets)));
    (
        RemoteTier::with_store(store, prefix, url, config).unwrap(),
        gets,
    )
}

/// Publishes the cache directory `dir` to `url` as its first commit, with
/// the block lists of `kind`'s files read by blocks.
fn publish(endpoint: &str, url: &str, dir: &std::path::Path, kind: StoreKind) {
    let t = tempfile::tempdir().unwrap();
    let tier =
        RemoteTier::open_with_options(url, s3_options(endpoint), small_tier(t.path(), 1 << 30))
            .unwrap();
    let remote = RemoteDir::open(tier, dir, StoreFiles::for_kind(kind)).unwrap();
    assert_eq!(remote.publish().unwrap().seq, Some(1));
}

fn blob(i: usize) -> Vec<u8> {
    vec![(i % 251) as u8; 3000 + i % 500]
}

/// A published page file of `n` samples in 64 KiB pages.
fn published_pages(endpoint: &str, tag: &str, n: usize) -> String {
    let url = new_bucket_url(endpoint, tag);
    let built = tempfile::tempdir().unwrap();
    let schema = page_alloc::Schema::new().int("label").bytes("blob");
    let mut writer = PageWriter::create(
        built.path().join("data.pages"),
        schema,
        WriterOptions::default().page_size(64 << 10),
    )
    .unwrap();
    for i in 0..n {
        writer
            .append(&[Value::Int(i as i64), Value::Bytes(&blob(i))])
            .unwrap();
    }
    writer.finalize().unwrap();
    publish(endpoint, &url, built.path(), StoreKind::PageAlloc);
    url
}

/// An epoch's order: every index once, shuffled by a fixed LCG.
fn epoch(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    order
}

#[test]
fn a_prefetched_epoch_of_a_page_file_sends_no_request() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 600;
    let url = published_pages(&endpoint, "prefetch-pages", n);
    let dir = tempfile::tempdir().unwrap();
    let (tier, gets) = counted_tier(
        &endpoint,
        &url,
        small_tier(&dir.path().join("tier"), 1 << 30),
    );
    let remote = RemoteDir::open(
        tier,
        &dir.path().join("work"),
        StoreFiles::for_kind(StoreKind::PageAlloc),
    )
    .unwrap();
    let pages = PagesAt::with_remote(remote, "data.pages").unwrap();
    let order = epoch(n);
    let warming = pages.prefetch(&order);
    assert!(warming.total() > 10, "{} blocks asked for", warming.total());
    assert!(
        warming.wait(Duration::from_secs(120)),
        "the prefetch did not end"
    );
    assert_eq!(warming.failed(), 0);
    assert!(warming.fetched() > 0);
    let before = gets.0.load(Ordering::SeqCst);
    for &i in &order {
        let s = pages.sample(i).unwrap();
        assert_eq!(s.int(0).unwrap(), i as i64);
        assert_eq!(s.bytes(1).unwrap(), &blob(i)[..], "sample {i}");
    }
    assert_eq!(
        gets.0.load(Ordering::SeqCst),
        before,
        "the epoch's reads sent requests"
    );
    // A second prefetch of what is local fetches nothing.
    let again = pages.prefetch(&order);
    assert!(again.wait(Duration::from_secs(60)));
    assert_eq!(again.fetched(), 0);
}

#[test]
fn a_prefetched_epoch_of_arrays_sends_no_request() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let rows = 500u64;
    let url = new_bucket_url(&endpoint, "prefetch-arrays");
    let row = |i: u64| (0..1024).map(|j| (i * 1024 + j) as i32).collect::<Vec<_>>();
    let built = build_arrays(rows, row);
    publish(&endpoint, &url, built.path(), StoreKind::MemmapArray);
    let dir = tempfile::tempdir().unwrap();
    let (tier, gets) = counted_tier(
        &endpoint,
        &url,
        small_tier(&dir.path().join("tier"), 1 << 30),
    );
    let remote = RemoteDir::open(
        tier,
        &dir.path().join("work"),
        StoreFiles::for_kind(StoreKind::MemmapArray),
    )
    .unwrap();
    let arrays = ArraysAt::with_remote(remote).unwrap();
    let order: Vec<u64> = epoch(rows as usize).into_iter().map(|i| i as u64).collect();
    let warming = arrays.prefetch(&order);
    assert!(
        warming.wait(Duration::from_secs(120)),
        "the prefetch did not end"
    );
    assert_eq!(warming.failed(), 0);
    // Every row is local now: the sparse copy reads right without a fetch.
    let before = gets.0.load(Ordering::SeqCst);
    for &i in &order {
        let view = arrays.cache().array(i, "data").unwrap().unwrap();
        assert_eq!(view.as_slice::<i32>().unwrap(), &row(i)[..], "row {i}");
    }
    assert_eq!(gets.0.load(Ordering::SeqCst), before);
}

#[test]
fn a_prefetch_stays_within_the_bytes_it_is_given() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 600;
    let url = published_pages(&endpoint, "prefetch-budget", n);
    let dir = tempfile::tempdir().unwrap();
    // A budget of a quarter of the file: the prefetch stops there (give or
    // take the blocks in flight), and reads still fetch the rest.
    let mut config = small_tier(&dir.path().join("tier"), 0);
    let file_len = {
        let t = tempfile::tempdir().unwrap();
        let probe = RemoteTier::open_with_options(
            &url,
            s3_options(&endpoint),
            small_tier(t.path(), 1 << 30),
        )
        .unwrap();
        let remote = RemoteDir::open(
            probe,
            &t.path().join("w"),
            StoreFiles::for_kind(StoreKind::PageAlloc),
        )
        .unwrap();
        remote.object("data.pages").unwrap().len()
    };
    config.tier_budget = file_len / 4;
    let in_flight = config.parallelism as u64 * config.block_size;
    let (tier, _gets) = counted_tier(&endpoint, &url, config);
    let remote = RemoteDir::open(
        tier,
        &dir.path().join("work"),
        StoreFiles::for_kind(StoreKind::PageAlloc),
    )
    .unwrap();
    let pages = PagesAt::with_remote(remote, "data.pages").unwrap();
    let order = epoch(n);
    let warming = pages.prefetch(&order);
    assert!(warming.wait(Duration::from_secs(120)));
    assert!(
        warming.bytes() <= file_len / 4 + in_flight,
        "{} bytes prefetched, budget {}",
        warming.bytes(),
        file_len / 4
    );
    assert!(warming.fetched() < warming.total());
    for &i in order.iter().rev().take(50) {
        assert_eq!(pages.sample(i).unwrap().bytes(1).unwrap(), &blob(i)[..]);
    }
}
