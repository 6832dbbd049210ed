//! Reading a few keys of a segment cache in object storage on an empty
//! tier: the index and the blocks that hold the keys' rows, never whole
//! segments — counted on the test server's own requests; a corrupt block
//! is an error naming its object, never a record; the store's own whole
//! read still works after ranged reads.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;

use async_trait::async_trait;
use common::{new_bucket_url, s3_endpoint, s3_location, s3_options};
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResult, ListResult, ObjectStore, PutOptions, PutPayload, PutResult,
};
use remote_cache::{Error, RemoteDir, SegmentsAt, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, TierConfig, build_store};
use segment_store::Options;
use tensor_core::{Tensor, Value};
use test_support::intercept::{Intercept, Intercepted};

/// W1's record: `sample_{i}`, one f32[512].
fn w1_record(i: usize) -> Value {
    let base = (i % 65_536) as f32 * 0.25;
    Value::from(Tensor::from_vec([512], (0..512).map(|j| base + j as f32).collect()).unwrap())
}

/// Counts the requests a reader sends and the body bytes of each object
/// it GETs.
#[derive(Debug, Default)]
struct Meter {
    requests: Mutex<u64>,
    bytes: Mutex<BTreeMap<String, u64>>,
}

impl Meter {
    fn requests(&self) -> u64 {
        *self.requests.lock().unwrap()
    }

    /// Body bytes GET, in all and of the objects `pick` says.
    fn bytes(&self, pick: impl Fn(&str) -> bool) -> u64 {
        let bytes = self.bytes.lock().unwrap();
        bytes.iter().filter(|(k, _)| pick(k)).map(|(_, v)| v).sum()
    }

    fn count(&self) {
        *self.requests.lock().unwrap() += 1;
    }
}

#[async_trait]
impl Intercept for Meter {
    fn name(&self) -> &'static str {
        "Meter"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.count();
        inner.put_opts(location, payload, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.count();
        let head = options.head;
        let got = inner.get_opts(location, options).await?;
        if !head {
            *self
                .bytes
                .lock()
                .unwrap()
                .entry(location.to_string())
                .or_default() += got.range.end - got.range.start;
        }
        Ok(got)
    }

    fn list(&self, _prefix: Option<&ObjectPath>) {
        self.count();
    }

    async fn list_with_delimiter(
        &self,
        inner: &dyn ObjectStore,
        prefix: Option<&ObjectPath>,
    ) -> object_store::Result<ListResult> {
        self.count();
        inner.list_with_delimiter(prefix).await
    }
}

/// Publishes `n` of W1's records, `flush_every` to a segment, as a
/// segment store publishes them; returns the URL.
fn publish(endpoint: &str, name: &str, n: usize, flush_every: usize) -> String {
    let url = new_bucket_url(endpoint, name);
    let tier = tempfile::tempdir().unwrap();
    let writer = SegmentsAt::open(
        &s3_location(endpoint, &url, tier.path()),
        Options {
            flush_every,
            ..Options::default()
        },
    )
    .unwrap();
    let records: Vec<(String, Value)> = (0..n)
        .map(|i| (format!("sample_{i}"), w1_record(i)))
        .collect();
    for chunk in records.chunks(4096) {
        writer.put_batch(chunk).unwrap();
    }
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    url
}

/// A reader on an empty tier of default settings, its requests metered.
fn cold_reader(endpoint: &str, url: &str, tier_dir: &Path) -> (SegmentsAt, Arc<Meter>) {
    let (store, prefix) = build_store(url, s3_options(endpoint)).unwrap();
    let meter = Arc::new(Meter::default());
    let metered: Arc<dyn ObjectStore> = Arc::new(Intercepted::new(store, Arc::clone(&meter)));
    let tier = RemoteTier::with_store(
        metered,
        prefix,
        url,
        TierConfig::new(tier_dir.join("tier"), 1 << 30),
    )
    .unwrap();
    let work = tier_dir.join("work");
    let remote =
        RemoteDir::open_unapplied(tier, &work, StoreFiles::for_kind(StoreKind::SegmentStore))
            .unwrap();
    let options = Options {
        read_only: true,
        ..Options::default()
    };
    (SegmentsAt::with_unapplied(remote, options).unwrap(), meter)
}

fn is_segment(reader: &SegmentsAt, object: &str) -> bool {
    let remote = reader.remote().unwrap();
    let segments = std::fs::read_dir(remote.dir().join("segments")).unwrap();
    segments.flatten().any(|e| {
        let rel = format!("segments/{}", e.file_name().to_string_lossy());
        remote
            .object(&rel)
            .is_some_and(|f| object.ends_with(f.name()))
    })
}

#[test]
fn keys_of_w1_on_an_empty_tier_fetch_the_index_and_their_rows() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 20_000;
    let url = publish(&endpoint, "w1get", n, 4096);
    for asked in [1usize, 10] {
        let tier = tempfile::tempdir().unwrap();
        let (reader, meter) = cold_reader(&endpoint, &url, tier.path());
        assert_eq!(reader.len(), n);
        let opened = (meter.requests(), meter.bytes(|_| true));
        let keys: Vec<String> = (0..asked)
            .map(|k| format!("sample_{}", (k * 7919 + 123) % n))
            .collect();
        let (got, missing) = reader.get_batch(&keys).unwrap();
        assert!(missing.is_empty());
        for (k, v) in keys.iter().zip(&got) {
            let i: usize = k["sample_".len()..].parse().unwrap();
            assert_eq!(v.as_ref(), Some(&w1_record(i)), "{k}");
        }
        let segment_bytes = meter.bytes(|o| is_segment(&reader, o));
        let index_bytes = meter.bytes(|o| !is_segment(&reader, o));
        let commit_bytes = meter.bytes(|o| o.contains("commits/"));
        eprintln!(
            "W1 get of {asked} keys on an empty tier: open {} requests {} bytes; \
             in all {} requests {} bytes = index {index_bytes} (commit records \
             {commit_bytes}) + segments {segment_bytes}",
            opened.0,
            opened.1,
            meter.requests(),
            meter.bytes(|_| true)
        );
        assert!(
            segment_bytes <= asked as u64 * (64 << 10),
            "{segment_bytes} bytes of segments for {asked} keys"
        );
        // Nothing but the commit records, the log's identity, index logs
        // and schema besides.
        let log_bytes = meter.bytes(|o| o.ends_with(remote_cache::LOG_OBJECT));
        let index_files: u64 = ["segment-index.log", "schema.json"]
            .iter()
            .map(|f| {
                std::fs::metadata(reader.remote().unwrap().dir().join(f))
                    .unwrap()
                    .len()
            })
            .sum();
        assert_eq!(index_bytes, index_files + commit_bytes + log_bytes);

        // The store's own whole read still works after ranged reads: each
        // segment fetched whole, verified, mapped.
        let every: Vec<String> = (0..n).step_by(97).map(|i| format!("sample_{i}")).collect();
        let (got, missing) = reader.store().get_batch(&every).unwrap();
        assert!(missing.is_empty(), "{:?}", reader.problems());
        for (k, v) in every.iter().zip(&got) {
            let i: usize = k["sample_".len()..].parse().unwrap();
            assert_eq!(v.as_ref(), Some(&w1_record(i)), "{k}");
        }
        assert!(reader.store().verify().is_empty());
        // And the ranged path now reads those local copies.
        let before = meter.requests();
        let (got, _) = reader.get_batch(&keys).unwrap();
        assert!(got.iter().all(Option::is_some));
        assert_eq!(meter.requests(), before);
    }
}

#[test]
fn a_corrupt_block_is_an_error_naming_its_object_never_a_record() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 4096;
    let url = publish(&endpoint, "rangedcorrupt", n, n);
    let admin_tier = tempfile::tempdir().unwrap();
    let admin = RemoteTier::open_with_options(
        &url,
        s3_options(&endpoint),
        TierConfig::new(admin_tier.path(), 1 << 30),
    )
    .unwrap();
    let commit: remote_cache::Commit = serde_json::from_slice(
        &admin
            .read_remote("commits/00000000000000000001.json")
            .unwrap(),
    )
    .unwrap();
    let piece = commit
        .pieces
        .iter()
        .find(|p| p.path.starts_with("segments/"))
        .unwrap();
    let object = format!("objects/{}", piece.blake3);
    let mut bytes = admin.read_remote(&object).unwrap().to_vec();
    // A byte in the middle of the elements (those of the rows near the
    // middle): what a bad disk would serve.
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    admin.put_bytes(&object, bytes).unwrap();

    let tier = tempfile::tempdir().unwrap();
    let (reader, _) = cold_reader(&endpoint, &url, tier.path());
    let (mut good, mut refused) = (0, Vec::new());
    for i in n / 2 - 8..n / 2 + 8 {
        let key = format!("sample_{i}");
        match reader.get_batch(&[&key]) {
            Ok((got, missing)) => {
                assert!(missing.is_empty());
                assert_eq!(got[0].as_ref(), Some(&w1_record(i)), "{key}");
                good += 1;
            }
            Err(e) => {
                let Error::Segment(segment_store::Error::Fetch { path, source }) = &e else {
                    panic!("{key}: expected a failed fetch, got {e:?}");
                };
                assert!(path.ends_with("segments/segment_000000.arrow"), "{e}");
                match source.downcast_ref::<remote_tier::Error>() {
                    Some(remote_tier::Error::BlockMismatch(m)) => assert_eq!(m.name, object),
                    other => panic!("{key}: expected a block mismatch, got {other:?}"),
                }
                assert!(e.to_string().contains(&object), "{e}");
                refused.push(key);
            }
        }
    }
    // A 4 KiB block holds two rows' elements (and a part of a third).
    assert!(
        (1..=3).contains(&refused.len()),
        "{refused:?} refused, {good} read"
    );
    // Many keys at once read the segment whole (its blocks in runs, each
    // checked): the bad block is an error naming the object too.
    let many: Vec<String> = (0..n).step_by(8).map(|i| format!("sample_{i}")).collect();
    let e = reader.get_batch(&many).unwrap_err();
    let Error::Segment(segment_store::Error::Fetch { source, .. }) = &e else {
        panic!("expected a failed fetch, got {e:?}");
    };
    assert!(
        matches!(
            source.downcast_ref::<remote_tier::Error>(),
            Some(remote_tier::Error::BlockMismatch(_))
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&object), "{e}");
    // The store's own read refuses it as well: its keys read as missing,
    // the problem names the fetch.
    let (_, missing) = reader.store().get_batch(&refused[..1]).unwrap();
    assert_eq!(missing, vec![0]);
    assert!(
        reader
            .problems()
            .iter()
            .any(|p| p.detail.contains("fetching segment bytes")),
        "{:?}",
        reader.problems()
    );
}

#[test]
fn a_working_directory_left_by_ranged_reads_opens_whole_for_other_stores() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 600;
    let url = publish(&endpoint, "rangedthenwhole", n, 200);
    let tier = tempfile::tempdir().unwrap();
    let location = s3_location(&endpoint, &url, tier.path());
    let reader = SegmentsAt::open(
        &location,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let (got, _) = reader.get_batch(&["sample_5", "sample_450"]).unwrap();
    assert!(got.iter().all(Option::is_some));
    let work = reader.remote().unwrap().dir().to_path_buf();
    let segment = work.join("segments/segment_000000.arrow");
    assert!(std::fs::symlink_metadata(&segment).unwrap().is_symlink());
    drop(reader);

    // `cachex inspect URL` after a Python reader: the same working
    // directory, opened for a store that maps every segment whole.
    let opened = location.open_dir(None).unwrap();
    assert_eq!(opened.path(), work);
    assert!(!std::fs::symlink_metadata(&segment).unwrap().is_symlink());
    let store = segment_store::SegmentStore::open(
        opened.path(),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let keys: Vec<String> = (0..n).map(|i| format!("sample_{i}")).collect();
    let (got, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{:?}", store.problems());
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v.as_ref(), Some(&w1_record(i)));
    }
    assert!(store.verify().is_empty());
    drop(store);
    drop(opened);
    // And opened again by blocks, the copies stay whole and read.
    let reader = SegmentsAt::open(
        &location,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    let (got, _) = reader.get_batch(&keys).unwrap();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, v)| v.as_ref() == Some(&w1_record(i)))
    );
}

#[test]
fn many_keys_of_a_segment_fetch_it_whole_not_row_by_row() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 600;
    let url = publish(&endpoint, "rangedmany", n, n);
    let tier = tempfile::tempdir().unwrap();
    let (reader, meter) = cold_reader(&endpoint, &url, tier.path());
    let opened = meter.requests();
    // A sixth of the rows: one request for the segment (it is smaller
    // than the tier fetches whole), after its footer and batch metadata.
    let keys: Vec<String> = (0..n).step_by(6).map(|i| format!("sample_{i}")).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty());
    for (k, v) in keys.iter().zip(&got) {
        let i: usize = k["sample_".len()..].parse().unwrap();
        assert_eq!(v.as_ref(), Some(&w1_record(i)), "{k}");
    }
    let requests = meter.requests() - opened;
    assert!(requests <= 4, "{requests} requests for {} keys", keys.len());
    // Every other key of it now reads locally.
    let before = meter.requests();
    let rest: Vec<String> = (1..n).step_by(6).map(|i| format!("sample_{i}")).collect();
    let (got, _) = reader.get_batch(&rest).unwrap();
    assert!(got.iter().all(Option::is_some));
    assert_eq!(meter.requests(), before);
}

#[test]
fn a_prefetched_epoch_of_a_segment_store_sends_no_request() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let n = 3_000;
    let url = publish(&endpoint, "w1prefetch", n, 512);
    let tier = tempfile::tempdir().unwrap();
    let (reader, meter) = cold_reader(&endpoint, &url, tier.path());
    // The epoch's order: a stride through the keys, every key once.
    let order: Vec<String> = (0..n)
        .map(|k| format!("sample_{}", (k * 1237) % n))
        .collect();
    let opened = meter.requests();
    let warming = reader.prefetch(&order);
    assert_eq!(warming.total(), n.div_ceil(512) as u64);
    assert!(
        warming.wait(std::time::Duration::from_secs(120)),
        "the prefetch did not end"
    );
    assert_eq!(warming.failed(), 0);
    assert_eq!(warming.fetched(), warming.total());
    // Each segment (about 1 MB of 4 KiB blocks) in one request: adjacent
    // blocks are fetched together.
    let before = meter.requests();
    assert!(
        before - opened <= warming.total(),
        "{} requests for {} segments",
        before - opened,
        warming.total()
    );
    for batch in order.chunks(256) {
        let (got, missing) = reader.get_batch(batch).unwrap();
        assert!(missing.is_empty());
        for (k, v) in batch.iter().zip(&got) {
            let i: usize = k["sample_".len()..].parse().unwrap();
            assert_eq!(v.as_ref(), Some(&w1_record(i)), "{k}");
        }
    }
    assert_eq!(meter.requests(), before, "the epoch's reads sent requests");
    // Everything is whole here now: a second prefetch has nothing to do.
    let again = reader.prefetch(&order);
    assert_eq!(again.total(), 0);
}
