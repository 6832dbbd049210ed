//! Commits are claimed with conditional puts: each real protocol's
//! put-if-absent (S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`, Azure
//! `If-None-Match: *`) is refused the second time by its emulator, so the
//! probe passes and of two writers one wins; a server that accepts the
//! condition without honouring it is found out before anything is
//! published, and a claimed commit is read back before it is trusted.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use common::{Backend, Server, claim_record, fresh_store, s3_endpoint, s3_store, small_config};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, PutResult};
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

/// The body of a record this test claims.
const OURS: &[u8] = br#"{"writer":"this-test","rows":3}"#;

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
    let err = claim_record(&tier, 1, OURS).unwrap_err();
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
        tier.list("commits").unwrap().is_empty(),
        "nothing published"
    );
    // The probe object is gone again.
    assert!(tier.list("_cachex_probe").unwrap().is_empty());

    // One writer only, said so: publishing is safe without them.
    let mut config = small_config(t.path(), 1 << 30);
    config.single_publisher = true;
    let single = RemoteTier::with_store(ignoring, prefix.clone(), &url, config).unwrap();
    claim_record(&single, 1, OURS).unwrap();

    // The real server honours them: the probe passes, publishing works.
    let honest = RemoteTier::with_store(
        store,
        ObjectPath::from(format!("{prefix}-honest")),
        &url,
        small_config(t.path(), 1 << 30),
    )
    .unwrap();
    claim_record(&honest, 1, OURS).unwrap();
}

/// The server answers the next record's put with success, but the name
/// holds another writer's record (its answer reordered, say).
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
        let record = location.as_ref().contains("commits/");
        if record && matches!(opts.mode, PutMode::Create) && !self.0.swap(true, Ordering::SeqCst) {
            let theirs = br#"{"writer":"another-writer"}"#.to_vec();
            inner.put_opts(location, theirs.into(), opts).await?;
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
fn a_claimed_record_is_read_back_before_it_is_trusted() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (store, prefix, url) = s3_store(&endpoint, "readback");
    let t = tempfile::tempdir().unwrap();
    let wrapped = Arc::new(Intercepted::new(store, AnotherWriterWins::default()));
    let tier =
        RemoteTier::with_store(wrapped, prefix, &url, small_config(t.path(), 1 << 30)).unwrap();
    // Number 1 goes to the other writer: read back, it is not ours.
    let err = claim_record(&tier, 1, OURS).unwrap_err();
    assert!(matches!(err, Error::CommitTaken { .. }), "{err:?}");
    let name = claim_record(&tier, 2, OURS).unwrap();
    assert_eq!(&tier.read_remote_capped(&name, 1 << 20).unwrap()[..], OURS);
    let first = tier
        .read_remote_capped("commits/00000000000000000001.json", 1 << 20)
        .unwrap();
    assert_eq!(&first[..], br#"{"writer":"another-writer"}"#);
}
