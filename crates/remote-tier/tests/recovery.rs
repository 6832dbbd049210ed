//! Readers killed (SIGKILL) mid-fetch, over and over, on one local tier:
//! whatever they left, every byte read afterwards is right.

mod common;

use std::time::Duration;

use common::{s3_endpoint, s3_store, s3_tier, sample, small_config};
use test_support::crash;

const URL_ENV: &str = "REMOTE_TIER_CRASH_URL";
const BUDGET: u64 = 3 << 20;

fn objects() -> Vec<(String, Vec<u8>)> {
    (0..3u64)
        .map(|i| (format!("segments/{i}.arrow"), sample(2 << 20, 50 + i)))
        .collect()
}

/// The child: reads every object through the shared tier (blocks in a
/// seeded order, prefetch on, a budget of half the data so it also
/// evicts) until killed.
#[test]
fn crash_reader_child() {
    let Some(args) = crash::child_args() else {
        return;
    };
    let endpoint = std::env::var("CACHEX_S3_ENDPOINT").unwrap();
    let url = std::env::var(URL_ENV).unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(&args.dir, BUDGET));
    let mut x = args.seed | 1;
    for (name, bytes) in objects() {
        let f = tier.open_object(&name).unwrap();
        for _ in 0..40 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x % (bytes.len() as u64 - 100)) as usize;
            let mut buf = [0u8; 100];
            f.read_at(at as u64, &mut buf).unwrap();
            assert_eq!(buf[..], bytes[at..at + 100]);
        }
        crash::report_commit(&name);
    }
}

#[test]
fn readers_killed_mid_fetch_leave_a_tier_that_reads_right() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "crash");
    let up = tempfile::tempdir().unwrap();
    let writer = s3_tier(&endpoint, &url, small_config(up.path(), 1 << 30));
    for (name, bytes) in objects() {
        writer.put_bytes(&name, bytes).unwrap();
    }
    let tier_dir = tempfile::tempdir().unwrap();
    let mut killed = 0;
    for cycle in 0..crash::cycles(6) as u64 {
        let after = Duration::from_millis(30 + (cycle * 71) % 400);
        let outcome = crash::child("crash_reader_child", "reader", tier_dir.path(), cycle)
            .env(URL_ENV, url.clone())
            .kill_after(after)
            .run();
        killed += u64::from(outcome.killed);
        assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    }
    eprintln!("{killed} of the readers were killed mid-run");
    // Whatever the killed readers left: blocks marked present hold the
    // right bytes (they are not fetched again), the rest is fetched now.
    let tier = s3_tier(&endpoint, &url, small_config(tier_dir.path(), 1 << 30));
    for (name, bytes) in objects() {
        let f = tier.open_object(&name).unwrap();
        let mut got = vec![0u8; bytes.len()];
        f.read_at(0, &mut got).unwrap();
        assert!(got == bytes, "{name} differs after the crashes");
    }
}

/// The block map of the only object read by blocks in `tier_dir`.
fn only_map(tier_dir: &std::path::Path) -> std::path::PathBuf {
    let maps: Vec<_> = std::fs::read_dir(tier_dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "blocks"))
        .collect();
    assert_eq!(maps.len(), 1, "{maps:?}");
    maps.into_iter().next().unwrap()
}

/// A fetch marks its blocks present without an fsync, for this boot
/// only: another process of the boot reads them with no request; after
/// a reboot that lost the page cache (here: the map of that moment with
/// another boot id, and the bytes zeroed) they are fetched again, never
/// served as left. Dropping the last handle makes them durable.
#[test]
fn unsynced_blocks_serve_this_boot_and_are_fetched_again_after_a_reboot() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (store, prefix, url) = s3_store(&endpoint, "unsynced");
    let up = tempfile::tempdir().unwrap();
    let bytes = sample(1 << 20, 7);
    s3_tier(&endpoint, &url, small_config(up.path(), 1 << 30))
        .put_bytes("pages.bin", bytes.clone())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 1 << 30);
    config.prefetch_blocks = 0;
    let (tier, faults) = common::faulty_tier(store.clone(), prefix.clone(), &url, config.clone());
    let f = tier.open_object("pages.bin").unwrap();
    let mut got = vec![0u8; bytes.len()];
    f.read_at(0, &mut got).unwrap();
    assert!(got == bytes);
    let map = only_map(dir.path());
    let unsynced = std::fs::read(&map).unwrap();
    assert_eq!(
        unsynced[8..12],
        3u32.to_le_bytes(),
        "unsynced blocks: map version 3"
    );

    // Another tier of this boot (another process's view): no request.
    let (other, other_faults) =
        common::faulty_tier(store.clone(), prefix.clone(), &url, config.clone());
    let g = other.open_object("pages.bin").unwrap();
    let before = other_faults.gets.load(std::sync::atomic::Ordering::SeqCst);
    let mut again = vec![0u8; bytes.len()];
    g.read_at(0, &mut again).unwrap();
    assert!(again == bytes);
    assert_eq!(
        other_faults.gets.load(std::sync::atomic::Ordering::SeqCst),
        before,
        "blocks another handle of this boot fetched are read locally"
    );
    drop(g);
    drop(f);
    assert!(faults.gets.load(std::sync::atomic::Ordering::SeqCst) > 0);
    let durable = std::fs::read(&map).unwrap();
    assert_eq!(durable[8..12], 1u32.to_le_bytes(), "made durable on close");

    // A reboot that lost the page cache: the map as it was while the
    // blocks were unsynced, written in another boot; the bytes gone.
    let etag_len = u32::from_le_bytes(unsynced[28..32].try_into().unwrap()) as usize;
    let boot_at = 32 + etag_len + 1; // flags; no list digest for this object
    let mut other_boot = unsynced.clone();
    other_boot[boot_at] ^= 0xff;
    std::fs::write(&map, remote_tier::fuzz_entry::reseal(&other_boot)).unwrap();
    let sparse = map.with_extension("sparse");
    let zeros = std::fs::OpenOptions::new()
        .write(true)
        .open(&sparse)
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&zeros, &vec![0u8; bytes.len()], 0).unwrap();
    drop(zeros);
    let (after, after_faults) = common::faulty_tier(store, prefix, &url, config);
    let h = after.open_object("pages.bin").unwrap();
    assert_eq!(
        h.blocks_present().0,
        0,
        "another boot's unsynced blocks are not present"
    );
    let mut read = vec![0u8; bytes.len()];
    h.read_at(0, &mut read).unwrap();
    assert!(read == bytes, "read as left after the reboot");
    assert!(after_faults.gets.load(std::sync::atomic::Ordering::SeqCst) > 0);
}
