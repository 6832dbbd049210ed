//! Round trips through the S3 and Azure Blob test servers: whole and
//! block-ranged objects, multipart uploads, a cold reader with an empty
//! local tier, listing. (Not on GCS: its emulator refuses object_store's
//! uploads; see RELIABILITY.md.)

mod common;

use std::os::unix::fs::FileExt;

use common::{Backend, Server, cold_reads_are_right, fresh_store, sample, small_config, tier_on};
use remote_tier::{Error, Expected, RemoteTier, TierConfig};

test_support::on_backends!(
    [s3 = S3, azure = Azure]
    whole_and_block_ranged_objects_round_trip,
    large_files_upload_in_parts_and_read_back_by_blocks,
    missing_objects_and_bad_ranges_are_typed_errors,
);

fn whole_and_block_ranged_objects_round_trip(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let (_, _, url) = fresh_store(&server, "caches/a");
    let writer_dir = tempfile::tempdir().unwrap();
    let writer = tier_on(&server, &url, small_config(writer_dir.path(), 1 << 30));
    let small = sample(10_000, 1);
    let large = sample(1_000_003, 2); // 16 blocks of 64 KiB, the last one short
    writer
        .put_bytes("segments/small.arrow", small.clone())
        .unwrap();
    writer
        .put_bytes("segments/large.arrow", large.clone())
        .unwrap();

    // A cold reader: its own, empty local tier.
    let reader_dir = tempfile::tempdir().unwrap();
    let reader = tier_on(&server, &url, small_config(reader_dir.path(), 1 << 30));
    assert_eq!(reader.local_usage().unwrap(), 0);

    cold_reads_are_right(&reader, &small, &large);
}

fn large_files_upload_in_parts_and_read_back_by_blocks(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let (_, _, url) = fresh_store(&server, "pages");
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 1 << 30);
    config.part_size = 5 << 20; // the S3 minimum
    let tier = tier_on(&server, &url, config);
    let bytes = sample(12 << 20, 3); // three parts
    let local = dir.path().join("pages.beton");
    std::fs::write(&local, &bytes).unwrap();
    assert_eq!(
        tier.put_file("pages.beton", &local).unwrap(),
        bytes.len() as u64
    );
    assert_eq!(tier.head("pages.beton").unwrap().size, bytes.len() as u64);

    let cold = tempfile::tempdir().unwrap();
    let reader = tier_on(&server, &url, small_config(cold.path(), 1 << 30));
    let expected = Expected {
        size: Some(bytes.len() as u64),
        blake3: Some(*blake3::hash(&bytes).as_bytes()),
    };
    let f = reader.fetch("pages.beton", &expected).unwrap();
    let mut got = vec![0u8; bytes.len()];
    f.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert!(got == bytes, "multipart upload read back differs");
    // The uploaded file stays where it was: the tier never takes the only copy.
    assert_eq!(std::fs::read(&local).unwrap(), bytes);
}

fn missing_objects_and_bad_ranges_are_typed_errors(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let (_, _, url) = fresh_store(&server, "p");
    let dir = tempfile::tempdir().unwrap();
    let tier = tier_on(&server, &url, small_config(dir.path(), 1 << 30));
    match tier.open_object("nope.arrow") {
        Err(Error::NotFound { url: u, name }) => {
            assert_eq!(name, "nope.arrow");
            assert_eq!(u, url);
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    tier.put_bytes("big", sample(200_000, 4)).unwrap();
    let f = tier.open_object("big").unwrap();
    let err = f.ensure(199_000..200_001).unwrap_err();
    assert!(
        matches!(err, Error::OutOfRange { size: 200_000, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("big"), "{err}");
    let err = tier.open_object("../escape").unwrap_err();
    assert!(matches!(err, Error::BadName { .. }), "{err}");
}

#[test]
fn memory_and_file_urls_take_the_same_path() {
    let remote = tempfile::tempdir().unwrap();
    let urls = [
        "memory:///caches/x".to_string(),
        format!("file://{}/caches/x", remote.path().display()),
    ];
    for url in urls {
        let dir = tempfile::tempdir().unwrap();
        let tier = RemoteTier::open(&url, small_config(dir.path(), 1 << 30)).unwrap();
        let bytes = sample(300_000, 5);
        tier.put_bytes("shards/0.100.shard.pickle", bytes.clone())
            .unwrap();
        tier.commit("COMMIT", "one").unwrap();
        assert!(
            matches!(tier.commit("COMMIT", "two"), Err(Error::CommitTaken { .. })),
            "{url}"
        );
        let f = tier
            .fetch("shards/0.100.shard.pickle", &Expected::default())
            .unwrap();
        let mut got = vec![0u8; bytes.len()];
        f.file().unwrap().read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, bytes, "{url}");
        assert_eq!(&tier.read_remote("COMMIT").unwrap()[..], b"one");
    }
    let _ = TierConfig::new("x", 1);
}
