//! A publish that fails before its commit (the server refuses every
//! conditional put, as if the writer died there) leaves the remote cache
//! at its last commit; the next publish resumes, sending only the commit.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tensor_core::Value;

use async_trait::async_trait;
use common::{
    RefuseCreates, child_writer, keyed, new_bucket_url, s3_endpoint, s3_location, s3_options,
    small_tier, spawn_child_writer,
};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutOptions, PutPayload, PutResult};
use remote_cache::{RemoteDir, SegmentsAt};
use remote_tier::{RemoteTier, build_store};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;
use test_support::intercept::{Intercept, Intercepted};

fn record(i: usize) -> Value {
    Value::from(Tensor::from_vec([4], vec![i as f32; 4]).unwrap())
}

fn put(store: &SegmentStore, range: std::ops::Range<usize>) {
    store.put_batch(&keyed("k", range, record)).unwrap();
    store.flush().unwrap();
}

#[test]
fn a_publish_that_fails_before_its_commit_leaves_the_last_commit() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "r");
    let (tier_dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let fail_creates = Arc::new(RefuseCreates::default());
    let refusing = Arc::new(Intercepted::new(store, Arc::clone(&fail_creates)));
    let tier = RemoteTier::with_store(refusing, prefix, &url, small_tier(tier_dir.path(), 1 << 30))
        .unwrap();
    let dir = RemoteDir::open(tier, work.path(), remote_cache::StoreFiles::PLAIN).unwrap();
    let segments = SegmentStore::open(dir.dir(), Options::default()).unwrap();
    put(&segments, 0..40);
    assert_eq!(dir.publish().unwrap().seq, Some(1));

    put(&segments, 40..80);
    fail_creates.0.store(1_000, Ordering::SeqCst);
    let err = dir.publish().unwrap_err();
    assert!(err.to_string().contains("commit"), "{err}");

    // Another machine sees the last commit only: 40 records, all right.
    let reader_dir = tempfile::tempdir().unwrap();
    let reader = SegmentsAt::open(
        &s3_location(&endpoint, &url, reader_dir.path()),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(reader.remote().unwrap().seq(), 1);
    assert_eq!(reader.len(), 40);
    let (got, missing) = reader.get_batch(&["k0", "k39", "k40"]).unwrap();
    assert_eq!(missing, vec![2]);
    assert!(got[1].as_ref() == Some(&record(39)));

    // The server answers again: the publish resumes, its pieces already up.
    fail_creates.0.store(0, Ordering::SeqCst);
    let again = dir.publish().unwrap();
    assert_eq!((again.seq, again.uploaded), (Some(2), 0));
    reader.refresh().unwrap();
    assert_eq!(reader.len(), 80);
}

const KILL_CHILD_ENV: &str = "REMOTE_CACHE_KILLED_WRITER";
const PER_COMMIT: usize = 40;

/// The writer that the test below SIGKILLs (does nothing unless spawned
/// by it): publishes commits of PER_COMMIT records until killed.
#[test]
fn killed_writer_child() {
    let Some(store) = child_writer(KILL_CHILD_ENV, 1) else {
        return;
    };
    let start = store.len();
    for c in 0.. {
        let base = start + c * PER_COMMIT;
        store
            .put_batch(&keyed("k", base..base + PER_COMMIT, record))
            .unwrap();
        store.publish().unwrap();
        println!(
            "published {} {}",
            store.remote().unwrap().seq(),
            store.len()
        );
    }
}

fn spawn_writer(endpoint: &str, url: &str, dir: &std::path::Path) -> std::process::Child {
    spawn_child_writer(
        "killed_writer_child",
        KILL_CHILD_ENV,
        (endpoint, url, dir),
        std::process::Stdio::null(),
    )
}

/// A fresh reader of the cache at `url`: every record right, none beyond
/// the count. Returns the last commit and the record count.
fn assert_committed(endpoint: &str, url: &str) -> (u64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let reader = SegmentsAt::open(
        &s3_location(endpoint, url, dir.path()),
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let seq = reader.remote().unwrap().seq();
    let n = reader.len();
    assert_eq!(n % PER_COMMIT, 0, "whole batches only");
    let keys: Vec<String> = (0..=n).map(|i| format!("k{i}")).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert_eq!(
        missing,
        vec![n],
        "every record up to the count, none beyond"
    );
    for (i, r) in got.iter().take(n).enumerate() {
        assert!(r.as_ref() == Some(&record(i)), "k{i}");
    }
    (seq, n)
}

#[test]
fn a_writer_killed_mid_publish_leaves_the_last_commit_and_resumes() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "killed");
    let work = tempfile::tempdir().unwrap();
    let mut last = 0;
    for round in 0..3u64 {
        let mut child = spawn_writer(&endpoint, &url, work.path());
        // Kill it at a point that moves from round to round: after 1, 2, 3
        // commits of this run, somewhere inside the next publish.
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut printed: Vec<(u64, usize)> = Vec::new();
        let mut line = String::new();
        let parse = |line: &str| -> Option<(u64, usize)> {
            let mut w = line.strip_prefix("published ")?.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        };
        while printed.len() as u64 <= round {
            line.clear();
            if std::io::BufRead::read_line(&mut out, &mut line).unwrap() == 0 {
                break;
            }
            printed.extend(parse(&line));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        printed.extend(rest.lines().filter_map(parse));
        let (seq, n) = assert_committed(&endpoint, &url);
        // The remote is at a commit the writer reported, or at the one it
        // made just before it died (before it could say so).
        let last_printed = printed.last().copied().unwrap_or((0, 0));
        assert!(
            printed.contains(&(seq, n)) || (seq == last_printed.0 + 1 && n > last_printed.1),
            "round {round}: remote at ({seq}, {n}), writer said {printed:?}"
        );
        assert!(
            seq > last,
            "round {round}: the writer published before it died"
        );
        last = seq;
    }
    // The same working directory, reopened once more, publishes on.
    let store = SegmentsAt::open(
        &s3_location(&endpoint, &url, work.path()),
        Options {
            writer_id: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    let local = store.len();
    store.publish().unwrap();
    drop(store);
    let (_, n) = assert_committed(&endpoint, &url);
    assert_eq!(n, local, "what the killed writer flushed is published now");
}

/// The reader's record of applied commits in its working directory.
fn applied_log(tier_dir: &std::path::Path, url: &str) -> std::path::PathBuf {
    remote_cache::default_work_dir(tier_dir, url)
        .join(remote_cache::STATE_DIR)
        .join("applied.jsonl")
}

#[test]
fn a_torn_line_in_the_applied_log_is_cut_and_opens_keep_advancing() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "torn");
    let (writer_tier, reader_tier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A single-writer handle: the one kind that may compact.
    let writer = SegmentsAt::open(
        &s3_location(&endpoint, &url, writer_tier.path()),
        Options::default(),
    )
    .unwrap();
    let read_only = || Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    let open_reader = || {
        SegmentsAt::open(
            &s3_location(&endpoint, &url, reader_tier.path()),
            read_only(),
        )
    };
    writer.put_batch(&keyed("k", 0..20, record)).unwrap();
    writer.publish().unwrap();
    drop(open_reader().unwrap());

    // A crash while the reader recorded a commit: half a line at the end.
    let log = applied_log(reader_tier.path(), &url);
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, br#"{"seq":2,"files":{"segm"#).unwrap();
    drop(f);

    for round in 2..=4u64 {
        let n = round as usize * 20;
        writer.put_batch(&keyed("k", n - 20..n, record)).unwrap();
        writer.publish().unwrap();
        let reader = open_reader().unwrap();
        assert_eq!(reader.remote().unwrap().seq(), round, "round {round}");
        assert_eq!(reader.len(), n);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
        "every line of the log whole: {text}"
    );

    // The writer compacts and publishes: the reader's next open applies it.
    writer.compact().unwrap();
    writer.publish().unwrap();
    let reader = open_reader().unwrap();
    assert_eq!(reader.len(), 80);
    let keys: Vec<String> = (0..80).map(|i| format!("k{i}")).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    for (i, r) in got.iter().enumerate() {
        assert!(r.as_ref() == Some(&record(i)), "k{i}");
    }
}

/// A server that takes `If-None-Match: *` and overwrites anyway.
#[derive(Debug, Default)]
struct IgnoresCreate;

#[async_trait]
impl Intercept for IgnoresCreate {
    fn name(&self) -> &'static str {
        "IgnoresCreate"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        mut opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if matches!(opts.mode, object_store::PutMode::Create) {
            opts.mode = object_store::PutMode::Overwrite;
        }
        inner.put_opts(location, payload, opts).await
    }
}

#[test]
fn a_writer_refuses_to_publish_where_conditional_puts_are_ignored() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "ignores");
    let (tier_dir, work) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (store, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let ignoring = Arc::new(Intercepted::new(store, IgnoresCreate));
    let tier = RemoteTier::with_store(ignoring, prefix, &url, small_tier(tier_dir.path(), 1 << 30))
        .unwrap();
    let dir = RemoteDir::open(tier, work.path(), remote_cache::StoreFiles::PLAIN).unwrap();
    let segments = SegmentStore::open(dir.dir(), Options::default()).unwrap();
    put(&segments, 0..10);
    let err = dir.publish().unwrap_err();
    assert!(
        matches!(
            err,
            remote_cache::Error::Tier(remote_tier::Error::ConditionalPutIgnored { .. })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&url) && err.to_string().contains("single_publisher"),
        "{err}"
    );
    assert_eq!(dir.seq(), 0, "nothing committed");
    let check = RemoteTier::open_with_options(
        &url,
        s3_options(&endpoint),
        small_tier(tier_dir.path(), 1 << 30),
    )
    .unwrap();
    assert!(check.list(remote_cache::COMMITS).unwrap().is_empty());
}

/// Counts the body bytes of every GET that reach the reader.
#[derive(Debug, Default)]
struct BodyBytes(Arc<AtomicU64>);

#[async_trait]
impl Intercept for BodyBytes {
    fn name(&self) -> &'static str {
        "BodyBytes"
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        use futures::StreamExt;
        let got = inner.get_opts(location, options).await?;
        let (meta, range) = (got.meta.clone(), got.range.clone());
        let attributes = got.attributes.clone();
        let seen = Arc::clone(&self.0);
        let body = got.into_stream().map(move |chunk| {
            if let Ok(c) = &chunk {
                seen.fetch_add(c.len() as u64, Ordering::SeqCst);
            }
            chunk
        });
        Ok(object_store::GetResult {
            payload: object_store::GetResultPayload::Stream(Box::pin(body)),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }
}

#[test]
fn an_oversized_commit_record_is_refused_before_its_body_is_read() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "oversized");
    let tier_dir = tempfile::tempdir().unwrap();
    let admin = RemoteTier::open_with_options(
        &url,
        s3_options(&endpoint),
        small_tier(tier_dir.path(), 1 << 30),
    )
    .unwrap();
    // A MiB over the 64 MiB a commit record may have.
    let limit = 64u64 << 20;
    admin
        .put_bytes(
            &remote_cache::commit_name(1),
            vec![b' '; (limit + (1 << 20)) as usize],
        )
        .unwrap();
    let (store, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let counted = Arc::new(Intercepted::new(store, BodyBytes::default()));
    let tier = RemoteTier::with_store(
        counted.clone(),
        prefix,
        &url,
        small_tier(tier_dir.path(), 1 << 30),
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    let err = RemoteDir::open(tier, work.path(), remote_cache::StoreFiles::PLAIN).unwrap_err();
    match &err {
        remote_cache::Error::Tier(remote_tier::Error::TooLarge { name, cap, .. }) => {
            assert_eq!(name, &remote_cache::commit_name(1));
            assert_eq!(*cap, limit);
        }
        other => panic!("expected the commit refused as too large, got {other:?}"),
    }
    let read = counted.hooks.0.load(Ordering::SeqCst);
    assert!(read <= limit + 1, "{read} bytes of the body were read");
}
