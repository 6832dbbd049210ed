//! A tier's report, read from its directory alone: the counters of a tier
//! used for real (hits and misses of reads, bytes and requests fetched),
//! the budget its last opener recorded, and its plan records, live and
//! dead, with their progress.
//!
//! The bucket is a `file://` directory: what is under test is the local
//! tier.

mod common;

use std::path::Path;

use common::{sample, small_config};
use remote_tier::{RemoteTier, TierBudget, TierConfig, TierReport, TierStats};

const BUDGET: u64 = 1 << 20;

/// A tier over the bucket directory `bucket` with its local tier in
/// `local`: 64 KiB blocks, objects up to one block fetched whole, and no
/// read-ahead, so each read fetches exactly what it asks for.
fn open(bucket: &Path, local: &Path, budget: u64) -> RemoteTier {
    let mut config: TierConfig = small_config(local, budget);
    config.prefetch_blocks = 0;
    RemoteTier::open(&format!("file://{}/", bucket.display()), config).unwrap()
}

#[test]
fn reads_twice_count_a_miss_then_a_hit_and_the_report_matches_the_tier() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let tier = open(bucket.path(), local.path(), BUDGET);
    let large = sample(300_000, 1); // 5 blocks of 64 KiB
    let small = sample(10_000, 2); // fetched whole on open
    tier.put_bytes("large", large.clone()).unwrap();
    tier.put_bytes("small", small.clone()).unwrap();
    let fresh = tier.stats().unwrap();
    assert_eq!((fresh.hits, fresh.misses, fresh.get_requests), (0, 0, 0));

    // Block-fetched: the first read fetches block 0, the second finds it.
    let file = tier.open_object("large").unwrap();
    let mut buf = vec![0u8; 100];
    file.read_at(1_000, &mut buf).unwrap();
    assert_eq!(buf, large[1_000..1_100]);
    let after_one = tier.stats().unwrap();
    assert_eq!((after_one.hits, after_one.misses), (0, 1));
    assert_eq!(after_one.get_requests, 1);
    assert_eq!(after_one.fetched_bytes, 64 << 10);
    file.read_at(2_000, &mut buf).unwrap();
    assert_eq!(buf, large[2_000..2_100]);
    let after_two = tier.stats().unwrap();
    assert_eq!((after_two.hits, after_two.misses), (1, 1));
    assert_eq!(
        (after_two.get_requests, after_two.fetched_bytes),
        (after_one.get_requests, after_one.fetched_bytes),
        "a hit fetches nothing"
    );
    // A read of two blocks, one of them local: a miss (it fetched one).
    let mut across = vec![0u8; 200];
    file.read_at((64 << 10) - 100, &mut across).unwrap();
    assert_eq!(across, large[(64 << 10) - 100..(64 << 10) + 100]);

    // Fetched whole by its open: the first read waited on that fetch (a
    // miss), the next ones, by this handle or another, are hits.
    let whole = tier.open_object("small").unwrap();
    whole.read_at(0, &mut buf).unwrap();
    whole.read_at(500, &mut buf).unwrap();
    assert_eq!(buf, small[500..600]);
    let again = tier.open_object("small").unwrap();
    again.ensure(0..again.len()).unwrap();

    // Leased reads count the same way.
    let leased = tier.open_leased("large", None).unwrap();
    drop(leased.lease(std::slice::from_ref(&(0..10))).unwrap());
    drop(
        leased
            .lease(std::slice::from_ref(&((4 << 16)..(4 << 16) + 10)))
            .unwrap(),
    );

    let stats = tier.stats().unwrap();
    assert_eq!(stats.hits, 1 + 2 + 1, "{stats:?}");
    assert_eq!(stats.misses, 2 + 1 + 1, "{stats:?}");
    assert_eq!(stats.hit_ratio(), Some(0.5));
    // Block 0, block 1, the small object whole, block 4 (the last, short).
    assert_eq!(stats.get_requests, 4, "{stats:?}");
    let last_block = 300_000 - (4 << 16);
    assert_eq!(
        stats.fetched_bytes,
        2 * (64 << 10) + 10_000 + last_block,
        "{stats:?}"
    );

    let report = TierReport::read(local.path()).unwrap();
    assert_eq!(report.tier_dir, local.path());
    assert_eq!(report.stats, stats, "the report reads what the tier counts");
    assert_eq!(report.stats, TierStats::read(local.path()).unwrap());
    assert_eq!(
        report.budget,
        Some(TierBudget {
            bytes: BUDGET,
            pid: std::process::id()
        })
    );
    assert!(stats.allocated > 0 && stats.allocated <= BUDGET);
    assert_eq!(report.over_budget_bytes(), Some(0));
    assert!(report.plans.is_empty());
}

#[test]
fn the_last_opener_records_its_budget() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let first = open(bucket.path(), local.path(), BUDGET);
    let budget = |dir: &Path| TierReport::read(dir).unwrap().budget.map(|b| b.bytes);
    assert_eq!(budget(local.path()), Some(BUDGET));
    let second = open(bucket.path(), local.path(), 3 * BUDGET);
    assert_eq!(budget(local.path()), Some(3 * BUDGET));
    // Each process still keeps to its own: the record is the last word.
    assert_eq!(first.config().tier_budget, BUDGET);
    assert_eq!(second.config().tier_budget, 3 * BUDGET);
    let small = open(bucket.path(), local.path(), 1000);
    small.put_bytes("x", sample(50_000, 3)).unwrap();
    let x = small.open_object("x").unwrap();
    let report = TierReport::read(local.path()).unwrap();
    assert_eq!(report.budget.map(|b| b.bytes), Some(1000));
    assert!(report.stats.allocated >= 50_000, "{report:?}");
    assert_eq!(
        report.over_budget_bytes(),
        Some(report.stats.allocated - 1000),
        "an open whole copy is kept over a budget smaller than it"
    );
    drop(x);
}

#[test]
fn plans_show_their_registrant_liveness_and_progress_and_nothing_is_removed() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let tier = open(bucket.path(), local.path(), BUDGET);
    tier.put_bytes("large", sample(300_000, 4)).unwrap();
    let file = tier.open_object("large").unwrap();
    let handle = file
        .set_plan(&[(0..10, 0), (70_000..70_010, 1), (200_000..200_010, 5)], 4)
        .unwrap();
    handle.advance(3).unwrap();

    // A record whose registrant is gone: a copy no process holds locked.
    let plans = local.path().join("plans");
    let dead_name = "gone-host-999999-1-0.plan";
    std::fs::copy(handle.path(), plans.join(dead_name)).unwrap();
    // And one that is no record of this version.
    std::fs::write(plans.join("odd-1-2-3.plan"), b"not a plan record").unwrap();

    let report = TierReport::read(local.path()).unwrap();
    let live_name = handle.path().file_name().unwrap().to_str().unwrap();
    let find = |name: &str| {
        report
            .plans
            .iter()
            .find(|p| p.file == name)
            .unwrap_or_else(|| panic!("{name} in {:?}", report.plans))
    };
    assert_eq!(report.plans.len(), 3);
    let live = find(live_name);
    assert!(live.alive);
    assert_eq!(live.pid, Some(std::process::id()));
    assert!(live.host.as_deref().is_some_and(|h| !h.is_empty()));
    assert_eq!(
        (live.progress, live.epoch_len, live.objects),
        (Some(3), Some(4), Some(1))
    );
    assert_eq!(live.problem, None);
    let dead = find(dead_name);
    assert!(!dead.alive);
    assert_eq!(
        (dead.host.as_deref(), dead.pid),
        (Some("gone-host"), Some(999_999))
    );
    assert_eq!(dead.progress, Some(3), "the copy holds the progress too");
    let odd = find("odd-1-2-3.plan");
    assert!(!odd.alive);
    assert_eq!((odd.progress, odd.epoch_len), (None, None));
    assert!(
        odd.problem
            .as_deref()
            .is_some_and(|p| p.contains("shorter")),
        "{odd:?}"
    );
    assert!(
        plans.join(dead_name).exists(),
        "a report removes nothing (the tier's next reader does)"
    );

    handle.advance(6).unwrap();
    let moved = TierReport::read(local.path()).unwrap();
    assert_eq!(
        moved
            .plans
            .iter()
            .find(|p| p.file == live_name)
            .unwrap()
            .progress,
        Some(6)
    );
    drop(handle);
    let names: Vec<String> = TierReport::read(local.path())
        .unwrap()
        .plans
        .into_iter()
        .map(|p| p.file)
        .collect();
    assert_eq!(
        names,
        [dead_name, "odd-1-2-3.plan"],
        "a dropped plan is gone"
    );
}
