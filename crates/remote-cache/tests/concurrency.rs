//! Reads do not wait for a refresh's requests: a refresh held up on the
//! server (its GET of the next commit answered only when the test says)
//! leaves a reader of keys already local answering meanwhile. On the S3
//! test server (`CACHEX_S3_ENDPOINT`).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{keyed, new_bucket_url, s3_endpoint, s3_location, s3_options, small_tier};
use futures::channel::oneshot;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetResult, ObjectStore};
use remote_cache::{RemoteDir, SegmentsAt, StoreFiles, StoreKind};
use remote_tier::{RemoteTier, build_store};
use segment_store::Options;
use tensor_core::{Tensor, Value};
use test_support::intercept::{Intercept, Intercepted};

/// How long the test waits for what must happen before it calls it
/// stuck (never a timing assertion: the read either answers while the
/// refresh is held, or the test fails instead of hanging).
const BOUND: Duration = Duration::from_secs(30);

fn record(i: usize) -> Value {
    Value::from(Tensor::from_vec([8], vec![i as u32; 8]).unwrap())
}

/// Holds every GET of a commit record while armed, until released; tells
/// the test when one is held.
#[derive(Debug, Default)]
struct HoldCommits {
    armed: AtomicBool,
    held: Mutex<Vec<oneshot::Sender<()>>>,
    entered: Mutex<Option<Sender<String>>>,
}

impl HoldCommits {
    fn release(&self) {
        self.armed.store(false, Ordering::SeqCst);
        for tx in self.held.lock().unwrap().drain(..) {
            let _ = tx.send(());
        }
    }
}

/// Releases the held requests however the test ends, so nothing waits on
/// after it.
struct Release<'a>(&'a HoldCommits);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

#[async_trait]
impl Intercept for HoldCommits {
    fn name(&self) -> &'static str {
        "HoldCommits"
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if self.armed.load(Ordering::SeqCst) && location.as_ref().contains("/commits/") {
            let (tx, rx) = oneshot::channel();
            self.held.lock().unwrap().push(tx);
            if let Some(entered) = &*self.entered.lock().unwrap() {
                let _ = entered.send(location.to_string());
            }
            // Re-checked after queueing: a release in between sent nothing.
            if self.armed.load(Ordering::SeqCst) {
                let _ = rx.await;
            }
        }
        inner.get_opts(location, options).await
    }
}

#[test]
fn a_read_of_local_keys_answers_while_a_refresh_waits_for_the_server() {
    let Some(endpoint) = s3_endpoint() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CACHEX_S3_ENDPOINT is not set under CI"
        );
        return;
    };
    let url = new_bucket_url(&endpoint, "held");
    let (w, r) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let writer =
        SegmentsAt::open(&s3_location(&endpoint, &url, w.path()), Options::default()).unwrap();
    writer.put_batch(&keyed("k", 0..20, record)).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    let hold = Arc::new(HoldCommits::default());
    let (inner, prefix) = build_store(&url, s3_options(&endpoint)).unwrap();
    let store = Arc::new(Intercepted::new(inner, Arc::clone(&hold)));
    let tier = RemoteTier::with_store(
        store,
        prefix,
        &url,
        small_tier(&r.path().join("tier"), 1 << 30),
    )
    .unwrap();
    let remote = RemoteDir::open_unapplied(
        tier,
        &r.path().join("work"),
        StoreFiles::for_kind(StoreKind::SegmentStore),
    )
    .unwrap();
    let options = Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    let reader = SegmentsAt::with_unapplied(remote, options).unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    // Every key read once: its blocks are local from now on.
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty() && got[3].as_ref() == Some(&record(3)));

    writer.put_batch(&keyed("k", 20..30, record)).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(2));

    let (entered_tx, entered) = channel();
    *hold.entered.lock().unwrap() = Some(entered_tx);
    hold.armed.store(true, Ordering::SeqCst);
    let release = Release(&hold);
    std::thread::scope(|s| {
        let refreshing = s.spawn(|| reader.refresh());
        let asked = entered
            .recv_timeout(BOUND)
            .expect("the refresh never asked for the next commit");
        assert!(
            asked.ends_with("commits/00000000000000000002.json"),
            "{asked}"
        );

        // The refresh now waits for the server. A read of local keys:
        let (read_tx, read) = channel();
        let keys = &keys;
        let reader = &reader;
        s.spawn(move || {
            let _ = read_tx.send(reader.get_batch(keys).map(|(got, _)| got));
        });
        let got = read.recv_timeout(BOUND);
        // What the read found, known before the refresh may go on.
        let refresh_still_held = !refreshing.is_finished();
        drop(release);
        let got = got.expect("a read of local keys waited for the refresh's request");
        assert!(
            refresh_still_held,
            "the refresh finished before the read answered"
        );
        let got = got.unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, v)| v.as_ref() == Some(&record(i)))
        );
        let (report, gained) = refreshing.join().unwrap().unwrap();
        assert_eq!((report.seq, report.commits), (2, 1));
        assert!(gained > 0);
    });
    assert_eq!(reader.len(), 30);
    let (got, _) = reader.get_batch(&["k25"]).unwrap();
    assert!(got[0].as_ref() == Some(&record(25)));
}
