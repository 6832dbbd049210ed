//! shard-store, memmap-array and page-alloc through S3 and Azure Blob:
//! shards generated and uploaded, then read by a cold reader without the
//! source; arrays and page files read by block ranges into sparse local
//! files. (Not on GCS: its emulator refuses object_store's uploads; see
//! RELIABILITY.md.)

mod common;

use common::{Backend, Server, build_arrays, location, small_tier};
use page_alloc::{PageWriter, Value, WriterOptions};
use remote_cache::{ArraysAt, Location, PagesAt, RemoteDir, ShardsAt};
use remote_tier::RemoteTier;
use tempfile::TempDir;

test_support::on_backends!(
    [s3 = S3, azure = Azure]
    shards_generated_and_uploaded_are_read_by_a_cold_reader,
    arrays_are_read_by_block_ranges,
    page_files_are_read_by_block_ranges,
);

fn shards_generated_and_uploaded_are_read_by_a_cold_reader(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "shards");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let options = || shard_store::Options::default().shard_items(50);
    let generator =
        ShardsAt::open_with_source(&location(&server, &url, a.path()), options(), || {
            (0..420u64).map(|i| (i, format!("item {i}")))
        })
        .unwrap();
    assert_eq!(generator.len().unwrap(), 420);
    generator.wait_until_all_cached().unwrap();
    let published = generator.publish().unwrap();
    assert_eq!(published.seq, Some(1));

    let reader: ShardsAt<(u64, String)> =
        ShardsAt::open(&location(&server, &url, b.path()), options()).unwrap();
    assert_eq!(reader.len().unwrap(), 420);
    for i in [0i64, 49, 50, 333, 419, -1] {
        let item = reader.get(i).unwrap();
        let want = if i < 0 { (420 + i) as u64 } else { i as u64 };
        assert_eq!(item.0, want);
        assert_eq!(item.1, format!("item {want}"));
    }
    assert!(reader.all_cached_to_disk().unwrap());
}

/// A publisher of the local cache directory `dir` to `url` (as a build
/// job would have after writing it), with the directory of its tier.
fn publisher(server: &Server, url: &str, dir: &std::path::Path) -> (RemoteDir, TempDir) {
    let t = tempfile::tempdir().unwrap();
    let tier = RemoteTier::open_with_options(url, server.options(), small_tier(t.path(), 1 << 30))
        .unwrap();
    (
        RemoteDir::open(tier, dir, remote_cache::StoreFiles::PLAIN).unwrap(),
        t,
    )
}

/// Publishes the local cache directory `dir` to `url` as its first commit.
fn publish_dir(server: &Server, url: &str, dir: &std::path::Path) {
    let (remote, _tier) = publisher(server, url, dir);
    assert_eq!(remote.publish().unwrap().seq, Some(1));
}

fn array_row(i: u64) -> Vec<i32> {
    (0..1024).map(|j| (i * 1024 + j) as i32).collect()
}

fn arrays_are_read_by_block_ranges(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "arrays");
    let rows = 600u64; // 4 KiB a row: 2.4 MB, 38 blocks of 64 KiB
    let built = build_arrays(rows, array_row);
    publish_dir(&server, &url, built.path());

    let tier_dir = tempfile::tempdir().unwrap();
    let arrays = ArraysAt::open(&location(&server, &url, tier_dir.path())).unwrap();
    let remote = arrays.remote().unwrap();
    assert!(remote.is_by_blocks("data.bin"));
    common::assert_rows(&arrays, &[0, 17, 300, 599], array_row);
    // Only the blocks of those rows (and a block of prefetch after each)
    // were fetched: the sparse file is far from whole.
    let sparse = tier_dir.path().join("objects");
    let allocated: u64 = std::fs::read_dir(&sparse)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sparse"))
        .map(|e| {
            use std::os::unix::fs::MetadataExt;
            e.metadata().unwrap().blocks() * 512
        })
        .sum();
    assert!(
        allocated < rows * 4096 / 2,
        "{allocated} bytes allocated of {}",
        rows * 4096
    );
    // A batch of rows in one call, then every row right.
    arrays.ensure_rows(0..rows).unwrap();
    for i in 0..rows {
        let view = arrays.cache().array(i, "data").unwrap().unwrap();
        assert_eq!(view.as_slice::<i32>().unwrap()[5], (i * 1024 + 5) as i32);
    }
}

fn page_files_are_read_by_block_ranges(backend: Backend) {
    let Some(server) = Server::find(backend) else {
        return;
    };
    let url = server.new_url("rc", "pages");
    let built = tempfile::tempdir().unwrap();
    let schema = page_alloc::Schema::new().int("label").bytes("blob");
    let mut writer = PageWriter::create(
        built.path().join("data.pages"),
        schema,
        WriterOptions::default().page_size(64 << 10),
    )
    .unwrap();
    let blob = |i: usize| vec![(i % 251) as u8; 3000 + i % 500];
    for i in 0..400usize {
        writer
            .append(&[Value::Int(i as i64), Value::Bytes(&blob(i))])
            .unwrap();
    }
    writer.finalize().unwrap();
    publish_dir(&server, &url, built.path());

    let tier_dir = tempfile::tempdir().unwrap();
    let location: Location = location(&server, &url, tier_dir.path());
    let pages = PagesAt::open(&location, "data.pages").unwrap();
    assert!(pages.remote().unwrap().is_by_blocks("data.pages"));
    assert_eq!(pages.reader().len(), 400);
    for i in [0usize, 1, 199, 399] {
        let s = pages.sample(i).unwrap();
        assert_eq!(s.int(0).unwrap(), i as i64);
        assert_eq!(s.bytes(1).unwrap(), &blob(i)[..], "sample {i}");
    }
    let all: Vec<usize> = (0..400).collect();
    pages.ensure_samples(&all).unwrap();
    for i in all {
        assert_eq!(
            pages.reader().sample(i).unwrap().bytes(1).unwrap(),
            &blob(i)[..]
        );
    }
}

#[test]
fn an_open_page_file_reads_its_own_bytes_after_a_replacement_and_eviction() {
    let Some(server) = Server::find(Backend::S3) else {
        return;
    };
    let url = server.new_url("rc", "replaced");
    let built = tempfile::tempdir().unwrap();
    let path = built.path().join("data.pages");
    // Two versions of one page file: the same layout, other bytes.
    let blob = |i: usize, version: u8| vec![(i % 251) as u8 ^ version; 3000 + i % 500];
    // Written aside and renamed over the old one (a new inode, as a
    // rebuild would leave it).
    let write = |version: u8| {
        let aside = built.path().join("next.pages.tmp");
        let schema = page_alloc::Schema::new().bytes("blob");
        let options = WriterOptions::default().page_size(64 << 10);
        let mut writer = PageWriter::create(&aside, schema, options).unwrap();
        for i in 0..400usize {
            writer.append(&[Value::Bytes(&blob(i, version))]).unwrap();
        }
        writer.finalize().unwrap();
        std::fs::rename(&aside, &path).unwrap();
    };
    let (publisher, _tier) = publisher(&server, &url, built.path());
    write(1);
    assert_eq!(publisher.publish().unwrap().seq, Some(1));

    // A one-byte budget: every fetch evicts whatever no reader holds.
    let tier_dir = tempfile::tempdir().unwrap();
    let location =
        Location::remote(&url, small_tier(tier_dir.path(), 1)).with_options(server.options());
    let pages = PagesAt::open(&location, "data.pages").unwrap();
    assert_eq!(pages.sample(0).unwrap().bytes(0).unwrap(), &blob(0, 1)[..]);

    // The file is replaced; the reader's commit log learns it (its link
    // now names the new copy) and the tier evicts what it can.
    write(2);
    assert_eq!(publisher.publish().unwrap().seq, Some(2));
    let remote = pages.remote().unwrap();
    assert_eq!(remote.refresh().unwrap().seq, 2);
    remote.tier().evict().unwrap();
    // The open reader maps the first version: its blocks come from that
    // object, never zeros, never the second version's.
    for i in (0..400).rev() {
        let got = pages.sample(i).unwrap();
        let got = got.bytes(0).unwrap();
        assert!(got == &blob(i, 1)[..], "sample {i}: {:?}…", &got[..8]);
    }
    // A reader opened now reads the second version.
    drop(pages);
    let again = PagesAt::open(&location, "data.pages").unwrap();
    assert_eq!(
        again.sample(399).unwrap().bytes(0).unwrap(),
        &blob(399, 2)[..]
    );
}

#[test]
fn open_arrays_read_their_own_bytes_after_a_replacement_and_eviction() {
    let Some(server) = Server::find(Backend::S3) else {
        return;
    };
    let url = server.new_url("rc", "arrays-replaced");
    let rows = 200u64;
    let built = build_arrays(rows, array_row);
    let (publisher, _tier) = publisher(&server, &url, built.path());
    assert_eq!(publisher.publish().unwrap().seq, Some(1));

    // A one-byte budget: every fetch evicts whatever no reader holds.
    let tier_dir = tempfile::tempdir().unwrap();
    let location =
        Location::remote(&url, small_tier(tier_dir.path(), 1)).with_options(server.options());
    let arrays = ArraysAt::open(&location).unwrap();
    let first = arrays.array(0, "data").unwrap().unwrap();
    assert_eq!(first.as_slice::<i32>().unwrap(), &array_row(0)[..]);

    // data.bin replaced (same size, other bytes, a new inode), the
    // reader's log refreshed, the tier evicted.
    let aside = built.path().join("data.bin.next");
    std::fs::write(&aside, vec![0x5a; (rows * 4096) as usize]).unwrap();
    std::fs::rename(&aside, built.path().join("data.bin")).unwrap();
    assert_eq!(publisher.publish().unwrap().seq, Some(2));
    let remote = arrays.remote().unwrap();
    assert_eq!(remote.refresh().unwrap().seq, 2);
    remote.tier().evict().unwrap();
    for i in (0..rows).rev() {
        let view = arrays.array(i, "data").unwrap().unwrap();
        assert!(
            view.as_slice::<i32>().unwrap() == &array_row(i)[..],
            "row {i}"
        );
    }
}

#[test]
fn arrays_refreshed_before_their_first_read_read_their_own_bytes() {
    let Some(server) = Server::find(Backend::S3) else {
        return;
    };
    let url = server.new_url("rc", "arrays-unread");
    let rows = 100u64;
    let built = build_arrays(rows, array_row);
    let (publisher, _tier) = publisher(&server, &url, built.path());
    assert_eq!(publisher.publish().unwrap().seq, Some(1));
    let tier_dir = tempfile::tempdir().unwrap();
    let arrays = ArraysAt::open(&location(&server, &url, tier_dir.path())).unwrap();

    // data.bin replaced and the reader refreshed before it read a row:
    // its link names the new object now, its handle the first.
    let aside = built.path().join("data.bin.next");
    std::fs::write(&aside, vec![0x5a; (rows * 4096) as usize]).unwrap();
    std::fs::rename(&aside, built.path().join("data.bin")).unwrap();
    assert_eq!(publisher.publish().unwrap().seq, Some(2));
    assert_eq!(arrays.remote().unwrap().refresh().unwrap().seq, 2);
    for i in [rows - 1, 0, 50] {
        let view = arrays.array(i, "data").unwrap().unwrap();
        assert!(
            view.as_slice::<i32>().unwrap() == &array_row(i)[..],
            "row {i}: not the bytes of the version opened"
        );
    }
}
