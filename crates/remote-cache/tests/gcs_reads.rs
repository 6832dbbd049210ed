//! Every store kind read by a cold reader on `gs://` (fake-gcs-server):
//! segments, shards, memmap arrays and a page file, published to a
//! `file://` bucket and copied object by object onto the GCS emulator
//! through its JSON API. The emulator takes no upload of object_store's
//! (the XML API's `PUT`; see RELIABILITY.md), so publishing itself runs on
//! S3 and Azure only (`stores.rs`, `segments.rs`); here the read path —
//! listing the commit log, reading records, block ranges of large objects —
//! runs on GCS for real.

mod common;

use std::path::Path;

use common::{Backend, Server, build_arrays, keyed, location, small_tier};
use page_alloc::{PageWriter, Value, WriterOptions};
use remote_cache::{ArraysAt, Location, PagesAt, RemoteDir, SegmentsAt, ShardsAt};
use remote_tier::RemoteTier;

/// Copies every file under `dir` onto the GCS emulator's `bucket`, named by
/// its path under `dir`.
fn copy_to_gcs(server: &Server, bucket: &str, dir: &Path, under: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            copy_to_gcs(server, bucket, &path, under);
        } else {
            let name = path.strip_prefix(under).unwrap().to_str().unwrap();
            server.gcs_upload(bucket, name, &std::fs::read(&path).unwrap());
        }
    }
}

fn array_row(i: u64) -> Vec<i32> {
    (0..1024).map(|j| (i * 1024 + j) as i32 * 3).collect()
}

fn blob(i: usize) -> Vec<u8> {
    vec![(i % 251) as u8; 3000 + i % 500]
}

/// Publishes the local cache directory `dir` to `url` as its first commit.
fn publish_dir(url: &str, dir: &Path) {
    let t = tempfile::tempdir().unwrap();
    let no_options: Vec<(String, String)> = Vec::new();
    let tier =
        RemoteTier::open_with_options(url, no_options, small_tier(t.path(), 1 << 30)).unwrap();
    let remote = RemoteDir::open(tier, dir, remote_cache::StoreFiles::PLAIN).unwrap();
    assert_eq!(remote.publish().unwrap().seq, Some(1));
}

#[test]
fn every_store_published_elsewhere_is_read_by_a_cold_reader_on_gcs() {
    let Some(gcs) = Server::find(Backend::Gcs) else {
        return;
    };
    let bucket_dir = tempfile::tempdir().unwrap();
    let file_url = |prefix: &str| format!("file://{}/{prefix}", bucket_dir.path().display());
    let writers = tempfile::tempdir().unwrap();
    let local = |prefix: &str| {
        Location::remote(
            &file_url(prefix),
            small_tier(&writers.path().join(prefix), 1 << 30),
        )
    };

    // Segments: two commits.
    let record = |i: usize| {
        let values: Vec<f32> = (0..16).map(|j| (i * 16 + j) as f32).collect();
        tensor_core::Value::from(tensor_core::Tensor::from_vec([4, 4], values).unwrap())
    };
    let segments = SegmentsAt::open(&local("seg"), segment_store::Options::default()).unwrap();
    segments.put_batch(&keyed("k", 0..100, record)).unwrap();
    assert_eq!(segments.publish().unwrap().seq, Some(1));
    segments.put_batch(&keyed("k", 100..150, record)).unwrap();
    assert_eq!(segments.publish().unwrap().seq, Some(2));
    drop(segments);
    // Shards, generated and uploaded.
    let shard_options = || shard_store::Options::default().shard_items(50);
    let shards = ShardsAt::open_with_source(&local("shards"), shard_options(), || {
        (0..220u64).map(|i| (i, format!("item {i}")))
    })
    .unwrap();
    shards.wait_until_all_cached().unwrap();
    assert_eq!(shards.publish().unwrap().seq, Some(1));
    drop(shards);
    // Memmap arrays (2.4 MB, read by blocks) and a page file.
    let built = build_arrays(600, array_row);
    publish_dir(&file_url("arrays"), built.path());
    let pages_dir = tempfile::tempdir().unwrap();
    let schema = page_alloc::Schema::new().int("label").bytes("blob");
    let options = WriterOptions::default().page_size(64 << 10);
    let mut writer =
        PageWriter::create(pages_dir.path().join("data.pages"), schema, options).unwrap();
    for i in 0..400usize {
        writer
            .append(&[Value::Int(i as i64), Value::Bytes(&blob(i))])
            .unwrap();
    }
    writer.finalize().unwrap();
    publish_dir(&file_url("pages"), pages_dir.path());

    let url = gcs.new_url("rc", "");
    let bucket = url
        .trim_start_matches("gs://")
        .trim_end_matches('/')
        .to_string();
    copy_to_gcs(&gcs, &bucket, bucket_dir.path(), bucket_dir.path());
    let gs = |prefix: &str| format!("gs://{bucket}/{prefix}");
    let readers = tempfile::tempdir().unwrap();
    let on_gcs = |prefix: &str| location(&gcs, &gs(prefix), &readers.path().join(prefix));

    let read_only = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    let segments = SegmentsAt::open(&on_gcs("seg"), read_only).unwrap();
    assert_eq!(segments.remote().unwrap().seq(), 2);
    let keys: Vec<String> = (0..150).map(|i| format!("k{i}")).collect();
    let (records, missing) = segments.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "missing {missing:?}");
    for (i, r) in records.iter().enumerate() {
        assert!(r.as_ref() == Some(&record(i)), "k{i}");
    }

    let shards: ShardsAt<(u64, String)> =
        ShardsAt::open(&on_gcs("shards"), shard_options()).unwrap();
    assert_eq!(shards.len().unwrap(), 220);
    for i in [0i64, 49, 50, 219] {
        assert_eq!(shards.get(i).unwrap(), (i as u64, format!("item {i}")));
    }

    let arrays = ArraysAt::open(&on_gcs("arrays")).unwrap();
    assert!(arrays.remote().unwrap().is_by_blocks("data.bin"));
    common::assert_rows(&arrays, &[0, 17, 300, 599], array_row);

    let pages = PagesAt::open(&on_gcs("pages"), "data.pages").unwrap();
    assert!(pages.remote().unwrap().is_by_blocks("data.pages"));
    assert_eq!(pages.reader().len(), 400);
    for i in [0usize, 1, 199, 399] {
        let s = pages.sample(i).unwrap();
        assert_eq!(s.int(0).unwrap(), i as i64);
        assert_eq!(s.bytes(1).unwrap(), &blob(i)[..], "sample {i}");
    }
}
