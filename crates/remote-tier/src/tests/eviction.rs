//! Eviction through a whole tier: the touch clocks a lease leaves, and
//! how often the count makes a fetch scan the tier.

use std::sync::atomic::Ordering;

use crate::constants::TOUCH_GROUP;
use crate::local::LocalDir;
use crate::{RemoteTier, TierConfig};

/// A tier over a fresh in-memory store, 64 KiB blocks, no read-ahead.
fn tier(dir: &std::path::Path, budget: u64) -> RemoteTier {
    let mut config = TierConfig::new(dir, budget);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 0;
    let url = format!("memory:///evict-{}", crate::open_files::new_id());
    RemoteTier::open(&url, config).unwrap()
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn blocks_share_a_touch_clock_by_group() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path(), 1 << 30);
    let block = 64u64 << 10;
    let blocks = 2 * TOUCH_GROUP + 8;
    tier.put_bytes("o", bytes((blocks * block) as usize, 3))
        .unwrap();
    let f = tier.open_leased("o", None).unwrap();
    let at = |b: u64| b * block + 5..b * block + 10;
    // Block 0, then 17 (the second group), then 1 (the first again).
    for b in [0, TOUCH_GROUP + 1, 1] {
        drop(f.lease(&[at(b)]).unwrap());
    }
    let key = LocalDir::key("o");
    let clocks = tier.inner.dir.read_touch(&key, blocks);
    let (first, second) = (clocks[0], clocks[TOUCH_GROUP as usize]);
    assert!(first > second && second > 0, "{clocks:?}");
    for (b, &c) in clocks.iter().enumerate() {
        let want = match b as u64 / TOUCH_GROUP {
            0 => first,
            1 => second,
            _ => 0,
        };
        assert_eq!(c, want, "block {b}");
    }
    // A clock a group: 8 bytes for each of the three.
    let len = std::fs::metadata(tier.inner.dir.touch(&key)).unwrap().len();
    assert_eq!(len, 8 * 2, "the third group was never touched");
    // Counted: a page of map, of clocks and of extent tree.
    assert_eq!(crate::state::meta_bytes(blocks, 32), 3 * 4096);
    // 1 TiB of 4 KiB blocks: 128 MiB of clocks (2 GiB at 8 bytes a
    // block), beside 64 MiB of map (2 bits a block) and the page.
    let map = crate::state::units(0..512 + 32 + (1 << 26));
    assert_eq!(
        crate::state::meta_bytes(1 << 28, 32),
        map + (128 << 20) + 4096
    );
}

#[test]
fn fetches_within_the_budget_scan_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let tier = tier(dir.path(), 1 << 30);
    let data = bytes(4 << 20, 1);
    tier.put_bytes("big", data.clone()).unwrap();
    let f = tier.open_object("big").unwrap();
    let before = tier.inner.dir.scans.load(Ordering::Relaxed);
    let mut buf = vec![0u8; 100];
    for b in 0..64u64 {
        f.read_at(b * (64 << 10) + 7, &mut buf).unwrap();
        assert_eq!(buf, data[(b * (64 << 10) + 7) as usize..][..100]);
    }
    let scans = tier.inner.dir.scans.load(Ordering::Relaxed) - before;
    let stats = tier.stats().unwrap();
    // No scan: the new tier's count was made when it opened.
    assert_eq!(
        (scans, stats.rebuilds),
        (0, 1),
        "64 fetches within the budget"
    );
    assert_eq!(stats.get_requests, 64);
    assert_eq!(stats.fetched_bytes, 4 << 20);
    let usage = tier.local_usage().unwrap();
    assert!(
        stats.allocated >= usage && stats.allocated <= usage + (64 << 10),
        "counted {} for {usage} on disk",
        stats.allocated
    );
}

#[test]
fn a_tier_over_budget_scans_once_per_slack_not_per_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 1 << 20;
    let tier = tier(dir.path(), budget);
    // 48 idle objects of 64 KiB (fetched whole), three budgets' worth.
    let mut fetches = 0u64;
    let mut scans = 0;
    for i in 0..48u8 {
        let name = format!("o{i}");
        let data = bytes(60 << 10, i);
        tier.put_bytes(&name, data.clone()).unwrap();
        let before = tier.inner.dir.scans.load(Ordering::Relaxed);
        let f = tier.open_object(&name).unwrap();
        let mut got = vec![0u8; data.len()];
        f.read_at(0, &mut got).unwrap();
        scans += tier.inner.dir.scans.load(Ordering::Relaxed) - before;
        assert!(got == data);
        fetches += 1;
        let stats = tier.stats().unwrap();
        assert!(stats.allocated <= budget, "{stats:?}");
        assert!(tier.local_usage().unwrap() <= budget);
    }
    // Each pass frees a sixteenth of the budget beyond the fetch (here
    // one more object): one pass per two fetches once full, and none
    // before (the first scan is the count's rebuild).
    assert!(
        scans <= fetches / 2 + 2,
        "{scans} scans for {fetches} fetches"
    );
    let stats = tier.stats().unwrap();
    assert!(
        stats.evicted_bytes > 0 && stats.over_budget == 0,
        "{stats:?}"
    );
}
