//! A single open object larger than the budget, read through
//! `open_leased`: the tier frees blocks inside it (hole-punched) so that
//! its allocated bytes stay within the budget after every read, in one
//! process and in several, while every byte read is right. Also: a holder
//! of `tier.lock` killed mid-change makes the next one rebuild the count;
//! a handle never writes back a block another handle's eviction freed.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::Duration;

use common::{Rng, s3_endpoint, s3_store, s3_tier, sample, small_config, wait_children};
use remote_tier::{RemoteFile, RemoteTier, TierStats};

/// Bytes allocated under `objects/` and `tmp/` (what the disk holds).
fn physical(tier_dir: &Path) -> u64 {
    ["objects", "tmp"]
        .iter()
        .flat_map(|d| std::fs::read_dir(tier_dir.join(d)).into_iter().flatten())
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.blocks() * 512)
        .sum()
}

/// Reads `len` bytes at `at` under a lease and checks them.
fn read_checked(f: &RemoteFile, data: &[u8], at: u64, len: u64) {
    let lease = f.lease(std::slice::from_ref(&(at..at + len))).unwrap();
    let mut got = vec![0u8; len as usize];
    f.file().unwrap().read_exact_at(&mut got, at).unwrap();
    drop(lease);
    assert!(
        got == data[at as usize..(at + len) as usize],
        "bytes {at}..{} wrong",
        at + len
    );
}

const BUDGET: u64 = 1 << 20;
/// The longest read: at most three 64 KiB blocks.
const MAX_READ: u64 = 100_000;
/// Block maps, touch clocks, extent trees: a few pages.
const META: u64 = 64 << 10;

#[test]
fn one_open_object_three_times_the_budget_stays_within_it() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "budget");
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), BUDGET);
    let parallelism = config.parallelism as u64;
    let tier = s3_tier(&endpoint, &url, config);
    let data = sample(3 * BUDGET as usize + 12_345, 7);
    tier.put_bytes("pages.bin", data.clone()).unwrap();
    let f = tier.open_leased("pages.bin", None).unwrap();
    assert!(f.is_leased());
    let mut rng = Rng(0x5EED);
    let mut max_physical = 0;
    for pass in 0..3 {
        for _ in 0..200 {
            let len = 1 + rng.below(MAX_READ);
            let at = rng.below(data.len() as u64 - len);
            read_checked(&f, &data, at, len);
            let held = physical(dir.path());
            let stats = tier.stats().unwrap();
            max_physical = max_physical.max(held);
            assert!(
                held <= BUDGET + parallelism * MAX_READ + META,
                "pass {pass}: {held} bytes on disk, budget {BUDGET}"
            );
            let slack = BUDGET / 16;
            assert!(
                stats.allocated + slack >= held,
                "pass {pass}: counted {} for {held} on disk",
                stats.allocated
            );
        }
    }
    let stats = tier.stats().unwrap();
    println!("max physical {max_physical} for a budget of {BUDGET}: {stats:?}");
    assert!(stats.punched_blocks > 0, "{stats:?}");
    assert!(stats.fetched_bytes > data.len() as u64, "{stats:?}");
}

const READER_CHILD: &str = "CACHEX_TEST_BUDGET_READER";

/// The child half of `processes_reading_one_leased_object_share_the_budget`
/// (does nothing unless spawned by it): reads random leased ranges of
/// the object, checking each, then says DONE.
#[test]
fn reading_child() {
    let Some(fields) = test_support::s3::child_fields(READER_CHILD) else {
        return;
    };
    let (endpoint, url, dir) = (&*fields[0], &*fields[1], &*fields[2]);
    let seed: u64 = fields[3].parse().unwrap();
    let tier = s3_tier(endpoint, url, small_config(Path::new(dir), BUDGET));
    let f = tier.open_leased("pages.bin", None).unwrap();
    let data = sample(3 * BUDGET as usize + 12_345, 7);
    let mut rng = Rng(seed);
    for _ in 0..150 {
        let len = 1 + rng.below(MAX_READ);
        let at = rng.below(data.len() as u64 - len);
        read_checked(&f, &data, at, len);
    }
    println!("\nDONE");
}

#[test]
fn processes_reading_one_leased_object_share_the_budget() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "shared");
    let dir = tempfile::tempdir().unwrap();
    let config = small_config(dir.path(), BUDGET);
    let parallelism = config.parallelism as u64;
    let tier = s3_tier(&endpoint, &url, config);
    let data = sample(3 * BUDGET as usize + 12_345, 7);
    tier.put_bytes("pages.bin", data.clone()).unwrap();
    let mut children: Vec<std::process::Child> = (0..3u64)
        .map(|i| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "reading_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(
                    READER_CHILD,
                    test_support::s3::child_env(
                        &endpoint,
                        &url,
                        dir.path(),
                        &[&(1000 + i).to_string()],
                    ),
                )
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let f = tier.open_leased("pages.bin", None).unwrap();
    let mut rng = Rng(99);
    let processes = 4;
    let mut max_physical = 0;
    for _ in 0..150 {
        let len = 1 + rng.below(MAX_READ);
        let at = rng.below(data.len() as u64 - len);
        read_checked(&f, &data, at, len);
        let held = physical(dir.path());
        max_physical = max_physical.max(held);
        // Each process: its read, its sticky leases, its fetches in flight.
        let bound = BUDGET + processes * (parallelism * MAX_READ + 4 * (64 << 10)) + META;
        assert!(held <= bound, "{held} bytes on disk, budget {BUDGET}");
    }
    wait_children(&mut children, Duration::from_secs(120), "reader");
    let stats = tier.stats().unwrap();
    println!("max physical {max_physical} for a budget of {BUDGET}, 4 processes: {stats:?}");
    assert!(stats.punched_blocks > 0, "{stats:?}");
}

const DYING_CHILD: &str = "CACHEX_TEST_BUDGET_DYING";

/// The child half of `a_holder_killed_mid_change_makes_the_next_rebuild`:
/// fetches a block, then takes `tier.lock` and starts a change of the
/// count as the tier does (dirty = its pid, bytes added), says so and
/// waits to be killed.
#[test]
fn dying_child() {
    let Some(fields) = test_support::s3::child_fields(DYING_CHILD) else {
        return;
    };
    let (endpoint, url, dir) = (&*fields[0], &*fields[1], &*fields[2]);
    let dir = Path::new(dir);
    let tier = s3_tier(endpoint, url, small_config(dir, BUDGET));
    let f = tier.open_leased("pages.bin", None).unwrap();
    f.ensure(0..10).unwrap();
    let _lock = durable_fs::FileLock::exclusive(&dir.join("tier.lock")).unwrap();
    let state = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .open(dir.join("tier.state"))
        .unwrap();
    // The layout of tier.state: allocated at 32, dirty at 48.
    let counted = tier.stats().unwrap().allocated;
    state
        .write_all_at(&u64::from(std::process::id()).to_le_bytes(), 48)
        .unwrap();
    state
        .write_all_at(&(counted + (5 << 20)).to_le_bytes(), 32)
        .unwrap();
    println!("\nMID-CHANGE");
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_holder_killed_mid_change_makes_the_next_rebuild() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "dying");
    let dir = tempfile::tempdir().unwrap();
    let tier = s3_tier(&endpoint, &url, small_config(dir.path(), BUDGET));
    tier.put_bytes("pages.bin", sample(300_000, 3)).unwrap();
    let f = tier.open_leased("pages.bin", None).unwrap();
    f.ensure(100_000..200_000).unwrap();
    tier.evict().unwrap();
    let before = tier.stats().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "dying_child", "--nocapture", "--test-threads=1"])
        .env(
            DYING_CHILD,
            test_support::s3::child_env(&endpoint, &url, dir.path(), &[]),
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let reached = lines.any(|l| l.is_ok_and(|l| l == "MID-CHANGE"));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(reached, "the child reached its change");
    let mid = TierStats::read(dir.path()).unwrap();
    assert!(mid.allocated >= before.allocated + (5 << 20), "{mid:?}");
    // The next holder of tier.lock finds the dead one's mark: a scan.
    tier.evict().unwrap();
    let after = tier.stats().unwrap();
    assert_eq!(after.rebuilds, before.rebuilds + 1, "{after:?}");
    // The rebuilt count: what the copy's blocks take, and the allowance
    // of its metadata (three pages for an object of five blocks), of
    // which the disk holds a page or two.
    let disk = tier.local_usage().unwrap();
    assert!(
        after.allocated >= disk && after.allocated - disk <= 3 * 4096,
        "{after:?}, {disk} bytes on disk"
    );
}

/// The present blocks of `name` as a fresh handle reads its map.
fn present(tier: &RemoteTier, name: &str) -> u64 {
    tier.open_leased(name, None).unwrap().blocks_present().0
}

/// A fresh bucket holding `pages.bin` (1 MiB of `sample(_, seed)`) and two
/// tiers on one directory: a reader with room for everything, and an
/// evictor with no room at all, whose `evict` frees all it may.
fn reader_and_evictor(
    endpoint: &str,
    tag: &str,
    seed: u64,
) -> (tempfile::TempDir, RemoteTier, RemoteTier, Vec<u8>) {
    let (_, _, url) = s3_store(endpoint, tag);
    let dir = tempfile::tempdir().unwrap();
    let reader = s3_tier(endpoint, &url, small_config(dir.path(), 1 << 30));
    let evictor = s3_tier(endpoint, &url, small_config(dir.path(), 0));
    let data = sample(1 << 20, seed);
    reader.put_bytes("pages.bin", data.clone()).unwrap();
    (dir, reader, evictor, data)
}

#[test]
fn a_freed_block_is_never_written_back_by_another_handle() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_dir, reader, evictor, data) = reader_and_evictor(&endpoint, "resurrect", 11);
    let block = 64 << 10;
    // Two handles of one object: separate states, one map in memory each.
    let h1 = reader.open_leased("pages.bin", None).unwrap();
    let h2 = reader.open_leased("pages.bin", None).unwrap();
    for h in [&h1, &h2] {
        for b in 0..8u64 {
            h.ensure_exact(std::slice::from_ref(&(b * block..b * block + 10)))
                .unwrap();
        }
    }
    assert_eq!(h2.blocks_present().0, 8);
    let report = evictor.evict().unwrap();
    // The four blocks released last stay leased a while (sticky).
    assert_eq!(report.punched, 4, "{report:?}");
    assert_eq!(present(&reader, "pages.bin"), 4);
    // h1 believes all 8 unsynced; its sync promotes only what is left.
    h1.sync().unwrap();
    assert_eq!(
        present(&reader, "pages.bin"),
        4,
        "sync revived freed blocks"
    );
    // h2, whose map in memory still has all 8 (a background fetch does
    // not look at the generation), marks a new block: the freed ones
    // stay freed on disk.
    let warming = h2.warm(
        std::slice::from_ref(&(12 * block..12 * block + 10)),
        1 << 20,
    );
    assert!(warming.wait(Duration::from_secs(60)));
    assert_eq!((warming.fetched(), warming.failed()), (1, 0));
    assert_eq!(
        present(&reader, "pages.bin"),
        5,
        "a mark revived freed blocks"
    );
    // And every byte read through either handle is right (fetched again).
    for h in [&h1, &h2] {
        for b in 0..8u64 {
            read_checked(h, &data, b * block, block);
        }
    }
}
