//! `gs://` against fake-gcs-server, the GCS emulator in the registries, as
//! far as it serves object_store's GCS client: reads (whole, by ranges and
//! checked against a hash), HEAD and listing of objects it holds. It does
//! not serve the writes: object_store uploads with the XML API's
//! `PUT /<bucket>/<object>` (`x-goog-if-generation-match: 0` for a
//! put-if-absent), which fake-gcs-server v1.54 answers `400 invalid
//! uploadType` (its issue #331), so the objects here are put through its
//! JSON API, and publishing — the probe first — fails with that answer
//! instead of giving a verdict. RELIABILITY.md says what real GCS
//! guarantees. When the emulator takes the upload, the last test fails:
//! then add `gcs = Gcs` to the `on_backends!` lists of the round trips.

mod common;

use common::{Backend, Server, cold_reads_are_right, sample, small_config, tier_on};
use remote_tier::Error;

/// A fresh bucket with `objects` put under `caches/`; the tier's URL.
fn seeded(server: &Server, objects: &[(&str, &[u8])]) -> String {
    let url = server.new_url("gcs", "caches");
    let bucket = url
        .trim_start_matches("gs://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    for (name, bytes) in objects {
        server.gcs_upload(&bucket, &format!("caches/{name}"), bytes);
    }
    url
}

#[test]
fn objects_on_gcs_are_read_whole_by_blocks_and_listed() {
    let Some(server) = Server::find(Backend::Gcs) else {
        return;
    };
    let small = sample(10_000, 1);
    let large = sample(1_000_003, 2); // 16 blocks of 64 KiB, the last one short
    let url = seeded(
        &server,
        &[
            ("segments/small.arrow", &small),
            ("segments/large.arrow", &large),
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    let reader = tier_on(&server, &url, small_config(dir.path(), 1 << 30));
    cold_reads_are_right(&reader, &small, &large);
    assert_eq!(
        reader.head("segments/small.arrow").unwrap().size,
        small.len() as u64
    );
    match reader.open_object("segments/nope.arrow") {
        Err(Error::NotFound { name, .. }) => assert_eq!(name, "segments/nope.arrow"),
        other => panic!("expected NotFound, got {other:?}"),
    }
}

#[test]
fn the_gcs_emulator_refuses_object_store_uploads_and_so_the_probe() {
    let Some(server) = Server::find(Backend::Gcs) else {
        return;
    };
    let url = seeded(&server, &[]);
    let dir = tempfile::tempdir().unwrap();
    let tier = tier_on(&server, &url, small_config(dir.path(), 1 << 30));
    let err = tier
        .put_bytes("segments/a.arrow", sample(100, 3))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("invalid uploadType"),
        "fake-gcs-server answered object_store's upload otherwise than measured \
         (400 invalid uploadType): if it takes uploads now, run the round trips on GCS: {text}"
    );
    // The probe's first put is refused the same way: no verdict, an error
    // that names the probe, never `ConditionalPutIgnored`.
    let err = tier.commit("commits/1", &b"ours"[..]).unwrap_err();
    assert!(
        !matches!(
            err,
            Error::ConditionalPutIgnored { .. } | Error::CommitTaken { .. }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("conditional put probe") && text.contains("invalid uploadType"),
        "{text}"
    );
}
