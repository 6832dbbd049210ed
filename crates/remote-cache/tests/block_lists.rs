//! Block lists in commit records: files readers read by blocks are
//! published with the BLAKE3 of each block, and readers check each block
//! as it arrives — a block corrupted on the server is a typed error and
//! never kept; a malformed list is a corrupt commit; a file published
//! without a list (one too large for a list) reads, checked by size and
//! etag.

mod common;

use std::os::unix::fs::FileExt;

use common::{build_arrays, new_bucket_url, s3_endpoint, s3_location, s3_options, small_tier};
use remote_cache::commit_name;
use remote_cache::{ArraysAt, Commit, Error, RemoteDir};
use remote_tier::RemoteTier;

/// Rows of 4 KiB: 16 to a 64 KiB block of the test tiers.
fn array_row(i: u64) -> Vec<i32> {
    (0..1024).map(|j| (i * 1024 + j) as i32 ^ 0x3c).collect()
}

fn tier(endpoint: &str, url: &str, dir: &std::path::Path) -> RemoteTier {
    RemoteTier::open_with_options(url, s3_options(endpoint), small_tier(dir, 1 << 30)).unwrap()
}

/// Publishes `rows` rows of arrays to a fresh bucket the way a build job
/// does (a plain commit log that reads nothing by blocks); returns the
/// URL and commit 1.
fn published_arrays(endpoint: &str, name: &str, rows: u64) -> (String, Commit) {
    let url = new_bucket_url(endpoint, name);
    let built = build_arrays(rows, array_row);
    let t = tempfile::tempdir().unwrap();
    let remote = RemoteDir::open(
        tier(endpoint, &url, t.path()),
        built.path(),
        remote_cache::StoreFiles::PLAIN,
    )
    .unwrap();
    assert_eq!(remote.publish().unwrap().seq, Some(1));
    let bytes = remote.tier().read_remote(&commit_name(1)).unwrap();
    (url, serde_json::from_slice(&bytes).unwrap())
}

fn data_bin(commit: &Commit) -> &remote_cache::Piece {
    commit.pieces.iter().find(|p| p.path == "data.bin").unwrap()
}

/// The rows of block `b` (64 KiB blocks of 4 KiB rows).
fn rows_of_block(b: u64) -> std::ops::Range<u64> {
    b * 16..(b + 1) * 16
}

#[test]
fn arrays_are_published_with_a_hash_per_block_and_read_back() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let rows = 600u64; // 2.4 MB: 38 blocks of 64 KiB, the last one short
    let (url, commit) = published_arrays(&endpoint, "lists", rows);
    let piece = data_bin(&commit);
    let list = piece.blocks.as_ref().expect("data.bin has a block list");
    assert_eq!((list.version, list.block_size), (1, 64 << 10));
    assert_eq!(list.blake3.len(), 38);
    let small: Vec<_> = commit
        .pieces
        .iter()
        .filter(|p| p.size <= 64 << 10)
        .collect();
    assert!(!small.is_empty() && small.iter().all(|p| p.blocks.is_none()));

    let tier_dir = tempfile::tempdir().unwrap();
    let location = s3_location(&endpoint, &url, tier_dir.path());
    let arrays = ArraysAt::open(&location).unwrap();
    common::assert_rows(&arrays, &[0, 17, 300, 599], array_row);
    let work = arrays.remote().unwrap().dir().to_path_buf();
    let kept = work
        .join(".cachex-remote/blocks")
        .join(format!("{}.json", piece.blake3));
    assert!(kept.is_file(), "the list is kept for the next open");
    drop(arrays);

    // Opened again (the file linked again from the kept list): all rows.
    let arrays = ArraysAt::open(&location).unwrap();
    arrays.ensure_rows(0..rows).unwrap();
    for i in 0..rows {
        let view = arrays.cache().array(i, "data").unwrap().unwrap();
        assert!(
            view.as_slice::<i32>().unwrap() == &array_row(i)[..],
            "row {i}"
        );
    }
    drop(arrays);

    // Without its kept list the file is not silently read unchecked.
    std::fs::remove_file(&kept).unwrap();
    match ArraysAt::open(&location) {
        Err(Error::Corrupt { name, .. }) => assert!(name.ends_with(".json"), "{name}"),
        Err(other) => panic!("expected the missing list named, got {other}"),
        Ok(_) => panic!("a linked file opened without its block list"),
    }
}

#[test]
fn a_block_corrupted_on_the_server_is_refused_and_never_kept() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let rows = 200u64; // 13 blocks
    let (url, commit) = published_arrays(&endpoint, "corrupt", rows);
    let piece = data_bin(&commit);
    let object = format!("objects/{}", piece.blake3);
    let admin_dir = tempfile::tempdir().unwrap();
    let admin = tier(&endpoint, &url, admin_dir.path());
    let good = admin.read_remote(&object).unwrap().to_vec();
    // The same size, one byte of block 5 changed: what a bad disk or a
    // proxy would serve.
    let mut bad = good.clone();
    bad[5 * (64 << 10) + 999] ^= 0x10;
    admin.put_bytes(&object, bad).unwrap();

    let tier_dir = tempfile::tempdir().unwrap();
    let location = s3_location(&endpoint, &url, tier_dir.path());
    let arrays = ArraysAt::open(&location).unwrap();
    let row = rows_of_block(5).start + 3;
    let err = match arrays.array(row, "data") {
        Err(e) => e,
        Ok(_) => panic!("row {row} of a corrupt block was served"),
    };
    match &err {
        Error::Tier(remote_tier::Error::BlockMismatch(m)) => {
            let remote_tier::BlockMismatch {
                name,
                block,
                start,
                end,
                expected,
                ..
            } = &**m;
            assert_eq!(name, &object);
            assert_eq!((*block, *start, *end), (5, 5 << 16, 6 << 16));
            assert_eq!(expected, &piece.blocks.as_ref().unwrap().blake3[5]);
        }
        other => panic!("expected a block mismatch, got {other:?}"),
    }
    assert!(err.to_string().contains(&url), "{err}");
    // Rows of other blocks read; block 5 is not in the local copy.
    let view = arrays
        .array(rows_of_block(7).start, "data")
        .unwrap()
        .unwrap();
    assert_eq!(
        view.as_slice::<i32>().unwrap(),
        &array_row(rows_of_block(7).start)[..]
    );
    let object_file = arrays.remote().unwrap().object("data.bin").unwrap();
    let mut local = vec![1u8; 64 << 10];
    object_file
        .file()
        .unwrap()
        .read_exact_at(&mut local, 5 << 16)
        .unwrap();
    assert!(local.iter().all(|&b| b == 0), "no corrupt byte in the tier");

    // The server is repaired: the same reader reads the row.
    admin.put_bytes(&object, good).unwrap();
    let view = arrays.array(row, "data").unwrap().unwrap();
    assert_eq!(view.as_slice::<i32>().unwrap(), &array_row(row)[..]);
}

#[test]
fn a_file_linked_again_on_open_is_still_checked() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (url, commit) = published_arrays(&endpoint, "relinked", 200);
    let object = format!("objects/{}", data_bin(&commit).blake3);
    let tier_dir = tempfile::tempdir().unwrap();
    let location = s3_location(&endpoint, &url, tier_dir.path());
    let arrays = ArraysAt::open(&location).unwrap();
    let view = arrays.array(0, "data").unwrap().unwrap();
    assert_eq!(view.as_slice::<i32>().unwrap(), &array_row(0)[..]);
    drop(view);
    drop(arrays);

    let admin_dir = tempfile::tempdir().unwrap();
    let admin = tier(&endpoint, &url, admin_dir.path());
    let mut bad = admin.read_remote(&object).unwrap().to_vec();
    bad[9 * (64 << 10)] ^= 1;
    admin.put_bytes(&object, bad).unwrap();
    // The commit is applied already: the list comes from the working
    // directory, not from the commit.
    let arrays = ArraysAt::open(&location).unwrap();
    match arrays.array(rows_of_block(9).start, "data") {
        Err(Error::Tier(remote_tier::Error::BlockMismatch(m))) if m.block == 9 => {}
        Err(other) => panic!("expected a mismatch in block 9, got {other}"),
        Ok(_) => panic!("a corrupt block was served after a reopen"),
    }
}

/// Commit 1 of a fresh bucket is `commit` changed by `edit`; opening it is
/// a corrupt commit whose message has `problem`.
fn refused(
    endpoint: &str,
    commit: &Commit,
    edit: impl FnOnce(&mut serde_json::Value),
    problem: &str,
) {
    let url = new_bucket_url(endpoint, "malformed");
    let t = tempfile::tempdir().unwrap();
    let admin = tier(endpoint, &url, t.path());
    let mut json = serde_json::to_value(commit).unwrap();
    edit(&mut json);
    // Sealed with its checksum as a publisher would: the block list, not
    // the checksum, is what is wrong.
    admin
        .commit(&commit_name(1), remote_cache::record::seal(json).unwrap())
        .unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    match ArraysAt::open(&s3_location(endpoint, &url, tier_dir.path())) {
        Err(Error::Corrupt {
            name, problem: p, ..
        }) => {
            assert_eq!(name, commit_name(1));
            assert!(
                p.contains("data.bin") && p.contains(problem),
                "{p} lacks {problem}"
            );
        }
        Err(other) => panic!("expected a corrupt commit ({problem}), got {other}"),
        Ok(_) => panic!("a commit with a malformed block list opened ({problem})"),
    }
}

#[test]
fn a_malformed_block_list_is_a_corrupt_commit() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, commit) = published_arrays(&endpoint, "malformed-src", 40);
    let at = commit
        .pieces
        .iter()
        .position(|p| p.path == "data.bin")
        .unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: [(Edit, &str); 6] = [
        (
            |list| drop(list["blake3"].as_array_mut().unwrap().pop()),
            "2 block hashes for 163840 bytes",
        ),
        (
            |list| list["blake3"][1] = "abc".into(),
            "block 1: `abc` is not a BLAKE3 hash",
        ),
        (
            |list| list["version"] = 2.into(),
            "block list version 2, this build reads 1",
        ),
        (
            |list| list["block_size"] = 100.into(),
            "block size 100 outside",
        ),
        (|list| list["block_size"] = 0.into(), "block size 0 outside"),
        (
            |list| list["blake3"][0] = "f".repeat(66).into(),
            "block 0: ",
        ),
    ];
    for (edit, problem) in cases {
        refused(
            &endpoint,
            &commit,
            |j| edit(&mut j["pieces"][at]["blocks"]),
            problem,
        );
    }
    refused(
        &endpoint,
        &commit,
        |j| j["pieces"][at]["offset"] = 4096.into(),
        "a block list on bytes that do not start the file",
    );
}
#[test]
fn a_file_without_a_block_list_reads_checked_by_size_and_etag() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let rows = 200u64;
    let (url, mut commit) = published_arrays(&endpoint, "no-lists", rows);
    // Commit 1 without lists, as a publisher writes a file too large for
    // one.
    for p in &mut commit.pieces {
        p.blocks = None;
    }
    let json = remote_cache::record::encode_record(&commit).unwrap();
    assert!(!String::from_utf8_lossy(&json).contains("blocks"));
    let t = tempfile::tempdir().unwrap();
    tier(&endpoint, &url, t.path())
        .put_bytes(&commit_name(1), json)
        .unwrap();

    let tier_dir = tempfile::tempdir().unwrap();
    let location = s3_location(&endpoint, &url, tier_dir.path());
    let arrays = ArraysAt::open(&location).unwrap();
    assert!(arrays.remote().unwrap().is_by_blocks("data.bin"));
    arrays.ensure_rows(0..rows).unwrap();
    for i in 0..rows {
        let view = arrays.cache().array(i, "data").unwrap().unwrap();
        assert!(
            view.as_slice::<i32>().unwrap() == &array_row(i)[..],
            "row {i}"
        );
    }
    let work = arrays.remote().unwrap().dir().to_path_buf();
    assert!(!work.join(".cachex-remote/blocks").exists());
    drop(arrays);
    let again = ArraysAt::open(&location).unwrap();
    let view = again.array(rows - 1, "data").unwrap().unwrap();
    assert_eq!(view.as_slice::<i32>().unwrap(), &array_row(rows - 1)[..]);
}

#[test]
fn the_list_of_a_replaced_file_is_dropped_from_the_working_directory() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "pruned");
    let rows = 100u64;
    let built = build_arrays(rows, array_row);
    let t = tempfile::tempdir().unwrap();
    let publisher = RemoteDir::open(
        tier(&endpoint, &url, t.path()),
        built.path(),
        remote_cache::StoreFiles::PLAIN,
    )
    .unwrap();
    assert_eq!(publisher.publish().unwrap().seq, Some(1));

    let tier_dir = tempfile::tempdir().unwrap();
    let arrays = ArraysAt::open(&s3_location(&endpoint, &url, tier_dir.path())).unwrap();
    let remote = arrays.remote().unwrap();
    let kept_lists = || -> Vec<String> {
        let dir = remote.dir().join(".cachex-remote/blocks");
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let hash = |bytes: &[u8]| format!("{}.json", blake3::hash(bytes).to_hex());
    let first = std::fs::read(built.path().join("data.bin")).unwrap();
    assert_eq!(kept_lists(), [hash(&first)]);

    // data.bin rebuilt (the same size, other bytes, a new inode).
    let second = vec![0x5au8; first.len()];
    let aside = built.path().join("data.bin.next");
    std::fs::write(&aside, &second).unwrap();
    std::fs::rename(&aside, built.path().join("data.bin")).unwrap();
    assert_eq!(publisher.publish().unwrap().seq, Some(2));
    assert_eq!(remote.refresh().unwrap().seq, 2);
    assert_eq!(kept_lists(), [hash(&second)]);
    // The open arrays still read their own (first) version.
    let view = arrays.array(rows - 1, "data").unwrap().unwrap();
    assert_eq!(view.as_slice::<i32>().unwrap(), &array_row(rows - 1)[..]);
}

#[test]
fn a_commit_declaring_a_1_gib_block_size_is_refused() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, commit) = published_arrays(&endpoint, "huge-blocks", 40);
    let at = commit
        .pieces
        .iter()
        .position(|p| p.path == "data.bin")
        .unwrap();
    // One hash for the whole file: a list that fits its 1 GiB blocks.
    refused(
        &endpoint,
        &commit,
        |j| {
            let list = &mut j["pieces"][at]["blocks"];
            list["block_size"] = (1u64 << 30).into();
            list["blake3"].as_array_mut().unwrap().truncate(1);
        },
        "block size 1073741824 outside",
    );
}
