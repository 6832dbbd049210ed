//! Commits are claimed with conditional puts: each real protocol's
//! put-if-absent (S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`, Azure
//! `If-None-Match: *`) is refused the second time by its emulator, so the
//! probe passes and of two writers one wins; a server that accepts the
//! condition without honouring it is found out before anything is
//! published, and a claimed commit is read back before it is trusted.
//! (Records here are snapshots of the older push layout, which the tier
//! still reads.)

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use common::{Backend, Server, fresh_store, s3_endpoint, s3_store, small_config, write_snapshot};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, PutResult};
use remote_tier::legacy_manifest::{Manifest, latest_manifest, pull_dir};
use remote_tier::{Error, PROBE_DIR, RemoteTier};
use test_support::intercept::{Intercept, Intercepted};

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
        if matches!(opts.mode, PutMode::Create) {
            opts.mode = PutMode::Overwrite;
        }
        inner.put_opts(location, payload, opts).await
    }
}

/// A snapshot to publish: two small files.
fn cache_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.bin"), vec![1u8; 5000]).unwrap();
    std::fs::write(dir.path().join("meta.json"), br#"{"rows":3}"#).unwrap();
    dir
}

/// The emulator's answer to a second put-if-absent of one name, through
/// the protocol as `object_store` speaks it, then through the tier: the
/// probe passes, the first claim of a commit wins and the second is
/// [`Error::CommitTaken`], and the probe object is gone.
fn the_server_refuses_a_second_create(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let (store, prefix, url) = fresh_store(&server, "probe");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let raw = prefix.clone().join("raw");
    let create = |body: &'static [u8]| {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        runtime.block_on(store.put_opts(&raw, PutPayload::from_static(body), opts))
    };
    create(b"first").unwrap();
    let second = create(b"second").unwrap_err();
    assert!(
        matches!(second, object_store::Error::AlreadyExists { .. }),
        "{}: {second:?}",
        backend.name()
    );
    let kept = runtime
        .block_on(async {
            store
                .get_opts(&raw, Default::default())
                .await?
                .bytes()
                .await
        })
        .unwrap();
    assert_eq!(
        &kept[..],
        b"first",
        "{}: the refused put wrote",
        backend.name()
    );

    let t = tempfile::tempdir().unwrap();
    let open = |dir: &str| {
        let config = small_config(&t.path().join(dir), 1 << 30);
        RemoteTier::open_with_options(&url, server.options(), config).unwrap()
    };
    let (ours, theirs) = (open("ours"), open("theirs"));
    ours.commit("commits/1", &b"ours"[..]).unwrap();
    let err = theirs.commit("commits/1", &b"theirs"[..]).unwrap_err();
    assert!(matches!(err, Error::CommitTaken { .. }), "{err:?}");
    theirs.commit("commits/2", &b"theirs"[..]).unwrap();
    assert!(
        ours.list(PROBE_DIR).unwrap().is_empty(),
        "probe left behind"
    );
}

// Not on GCS: fake-gcs-server (the one GCS emulator in the registries)
// refuses object_store's object upload, the XML API's `PUT /<bucket>/<object>`
// (see `gcs_emulator_refuses_xml_uploads` and RELIABILITY.md).
test_support::on_backends!(
    [s3 = S3, azure = Azure]
    the_server_refuses_a_second_create,
    publishing_refuses_a_server_that_ignores_conditional_puts
);

fn publishing_refuses_a_server_that_ignores_conditional_puts(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let (store, prefix, url) = fresh_store(&server, "ignores");
    let t = tempfile::tempdir().unwrap();
    let ignoring = Arc::new(Intercepted::new(Arc::clone(&store), IgnoresCreate));
    let tier = RemoteTier::with_store(
        ignoring.clone(),
        prefix.clone(),
        &url,
        small_config(t.path(), 1 << 30),
    )
    .unwrap();
    let local = cache_dir();
    let err = write_snapshot(&tier, local.path(), 1).unwrap_err();
    assert!(
        matches!(err, Error::ConditionalPutIgnored { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&url) && text.contains("single_publisher"),
        "names the server and the option: {text}"
    );
    assert!(
        latest_manifest(&tier).unwrap().is_none(),
        "nothing published"
    );
    // The probe object is gone again.
    assert!(tier.list("_cachex_probe").unwrap().is_empty());

    // One writer only, said so: publishing is safe without them.
    let mut config = small_config(t.path(), 1 << 30);
    config.single_publisher = true;
    let single = RemoteTier::with_store(ignoring, prefix.clone(), &url, config).unwrap();
    assert_eq!(write_snapshot(&single, local.path(), 1).unwrap().seq, 1);

    // The real server honours them: the probe passes, publishing works.
    let honest = RemoteTier::with_store(
        store,
        ObjectPath::from(format!("{prefix}-honest")),
        &url,
        small_config(t.path(), 1 << 30),
    )
    .unwrap();
    assert_eq!(write_snapshot(&honest, local.path(), 1).unwrap().seq, 1);
}

/// The server answers the next manifest put with success, but the name
/// holds another writer's manifest (its answer reordered, say).
#[derive(Debug, Default)]
struct AnotherWriterWins(AtomicBool);

#[async_trait]
impl Intercept for AnotherWriterWins {
    fn name(&self) -> &'static str {
        "AnotherWriterWins"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let manifest = location.as_ref().contains("manifests/");
        if manifest && matches!(opts.mode, PutMode::Create) && !self.0.swap(true, Ordering::SeqCst)
        {
            let name = location.filename().unwrap_or_default();
            let seq: u64 = name.trim_end_matches(".json").parse().unwrap();
            let theirs = Manifest {
                version: 1,
                seq,
                writer: "another-writer".into(),
                files: Vec::new(),
            };
            let bytes = serde_json::to_vec(&theirs).unwrap();
            inner.put_opts(location, bytes.into(), opts).await?;
            return inner
                .put_opts(
                    &ObjectPath::from("unrelated"),
                    payload,
                    PutOptions::default(),
                )
                .await;
        }
        inner.put_opts(location, payload, opts).await
    }
}

#[test]
fn a_claimed_manifest_is_read_back_before_it_is_trusted() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (store, prefix, url) = s3_store(&endpoint, "readback");
    let t = tempfile::tempdir().unwrap();
    let wrapped = Arc::new(Intercepted::new(store, AnotherWriterWins::default()));
    let tier =
        RemoteTier::with_store(wrapped, prefix, &url, small_config(t.path(), 1 << 30)).unwrap();
    let local = cache_dir();
    // Number 1 goes to the other writer: read back, it is not ours.
    let err = write_snapshot(&tier, local.path(), 1).unwrap_err();
    assert!(matches!(err, Error::CommitTaken { .. }), "{err:?}");
    write_snapshot(&tier, local.path(), 2).unwrap();
    let latest = latest_manifest(&tier).unwrap().unwrap();
    assert_eq!((latest.seq, latest.files.len()), (2, 2));
    let dest = tempfile::tempdir().unwrap();
    pull_dir(&tier, dest.path()).unwrap().unwrap();
    assert_eq!(
        std::fs::read(dest.path().join("meta.json")).unwrap(),
        br#"{"rows":3}"#
    );
}
