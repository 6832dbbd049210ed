//! Plans through a whole tier: what [`RemoteFile::set_plan`] and
//! [`set_plans`] record, and how eviction and read-ahead follow a plan.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use crate::local::LocalDir;
use crate::plans::next_uses;
use crate::plans::record::{BlockUse, NONE, PlanRecord};
use crate::{RemoteFile, RemoteTier, TierConfig, set_plans};

/// A tier at `url` (`memory://`) in `local`, of 64 KiB blocks, which
/// fetches only objects of one block whole.
fn block_tier(local: &Path, url: &str) -> RemoteTier {
    let mut config = TierConfig::new(local, 64 << 20);
    config.block_size = 1 << 16;
    config.whole_file_max = 1 << 16;
    RemoteTier::open(url, config).unwrap()
}

#[test]
fn set_plan_records_each_blocks_first_last_and_next_use() {
    let local = tempfile::tempdir().unwrap();
    let tier = block_tier(local.path(), "memory:///plans/set");
    tier.put_bytes("pages", vec![7u8; 300_000]).unwrap();
    let file = tier.open_object("pages").unwrap();
    let b = 1u64 << 16;
    let handle = file
        .set_plan(
            &[
                (0..10, 3),
                (b - 1..b + 1, 1),
                (0..1, 0),
                (4 * b..4 * b + 5, 6),
                (5..5, 0),
            ],
            4,
        )
        .unwrap();
    let uses = next_uses(local.path());
    let key = LocalDir::key("pages");
    assert_eq!(
        [0, 1, 2, 3, 4].map(|i| uses.distance(&key, i)),
        [Some(0), Some(1), None, None, Some(6)]
    );
    let bytes = std::fs::read(handle.path()).unwrap();
    let record = PlanRecord::decode(&bytes).unwrap();
    assert_eq!(
        record.objects[0].uses,
        [
            BlockUse {
                block: 0,
                first: 0,
                last: 3,
                next_first: NONE
            },
            BlockUse {
                block: 1,
                first: 1,
                last: 1,
                next_first: NONE
            },
            BlockUse {
                block: 4,
                first: NONE,
                last: NONE,
                next_first: 6
            },
        ]
    );
    assert!(
        file.set_plan(&[(0..300_001, 0)], 4).is_err(),
        "past the end"
    );
    assert!(
        file.set_plan(&[(0..1, 8)], 4).is_err(),
        "past the next epoch"
    );
    drop(handle);
    assert_eq!(next_uses(local.path()).keys().count(), 0);
}

#[test]
fn set_plans_records_several_objects_in_one_record() {
    let local = tempfile::tempdir().unwrap();
    let tier = block_tier(local.path(), "memory:///plans/many");
    let b = 1u64 << 16;
    for name in ["a", "b"] {
        tier.put_bytes(name, vec![1u8; 3 << 16]).unwrap();
    }
    let (a, bf) = (
        tier.open_object("a").unwrap(),
        tier.open_object("b").unwrap(),
    );
    let a_uses = [(0..10, 2), (2 * b..2 * b + 1, 5)];
    let b_uses = [(b..b + 1, 1)];
    let a_again = [(0..1, 1)];
    let handle = set_plans(
        &[(&a, &a_uses[..]), (&bf, &b_uses[..]), (&a, &a_again[..])],
        4,
    )
    .unwrap();
    let record = PlanRecord::decode(&std::fs::read(handle.path()).unwrap()).unwrap();
    assert_eq!(record.objects.len(), 2, "one entry per object");
    let uses = next_uses(local.path());
    let (ka, kb) = (LocalDir::key("a"), LocalDir::key("b"));
    // a's block 0: both lists' uses (first 1, last 2); block 2 next epoch.
    assert_eq!(record.objects[0].uses[0].first, 1);
    assert_eq!(record.objects[0].uses[0].last, 2);
    assert_eq!(
        [0, 1, 2].map(|i| uses.distance(&ka, i)),
        [Some(1), None, Some(5)]
    );
    assert_eq!(
        [0, 1, 2].map(|i| uses.distance(&kb, i)),
        [None, Some(1), None]
    );
    assert!(set_plans(&[], 4).is_err(), "a plan of nothing");
    let other = tempfile::tempdir().unwrap();
    let elsewhere = block_tier(other.path(), "memory:///plans/many-other");
    elsewhere.put_bytes("c", vec![1u8; 10]).unwrap();
    let c = elsewhere.open_object("c").unwrap();
    let err = set_plans(&[(&a, &a_uses[..]), (&c, &[(0..1, 0)][..])], 4).unwrap_err();
    assert!(err.to_string().contains("two local tiers"), "{err}");
    drop(handle);
    assert_eq!(next_uses(local.path()).keys().count(), 0);
}

#[test]
fn under_a_plan_a_prefetch_frees_a_quarter_of_a_reads_slack() {
    let local = tempfile::tempdir().unwrap();
    let b = 1u64 << 16;
    let mut config = TierConfig::new(local.path(), 64 * b);
    config.block_size = b;
    config.whole_file_max = b;
    config.prefetch_blocks = 0;
    let tier = RemoteTier::open("memory:///plans/slack", config).unwrap();
    let blocks = 640u64;
    tier.put_bytes("o", vec![3u8; (blocks * b) as usize])
        .unwrap();
    let file = tier.open_leased("o", None).unwrap();
    // Block i is read at batch i, this epoch and the next: the epoch
    // reads 640 blocks on a budget of 64, so the slack of a read is
    // (640 - 64) blocks / 64, capped at the LRU's four blocks, and a
    // prefetch's a quarter of that, one block.
    let uses: Vec<(Range<u64>, u64)> = (0..blocks)
        .flat_map(|i| [(i * b..i * b + 1, i), (i * b..i * b + 1, blocks + i)])
        .collect();
    let plan = file.set_plan(&uses, blocks).unwrap();
    let mut buf = [0u8; 1];
    for i in 0..63u64 {
        file.read_at(i * b, &mut buf).unwrap();
        plan.advance(i + 1).unwrap();
    }
    let evicted = || tier.stats().unwrap().evicted_bytes;
    // Full (63 blocks and the maps): a prefetch frees its block and
    // its slack, two blocks (those read furthest ahead); the next
    // prefetch then fits.
    let state = file.state();
    let before = evicted();
    assert!(state.prefetch_block(64, 1).unwrap());
    assert_eq!(evicted() - before, 2 * b, "a block and its slack");
    let before = evicted();
    assert!(state.prefetch_block(65, 2).unwrap());
    assert_eq!(evicted() - before, 0, "room left by the first");
    // A read frees its block and the slack.
    plan.advance(64).unwrap();
    let before = evicted();
    file.read_at(66 * b, &mut buf).unwrap();
    let freed = evicted() - before;
    assert_eq!(freed, 5 * b, "the read's block and the slack");
    let before = evicted();
    file.read_at(67 * b, &mut buf).unwrap();
    assert_eq!(
        evicted() - before,
        0,
        "the slack made room for the next read"
    );
    assert!(tier.stats().unwrap().allocated <= 64 * b);
}

#[test]
fn under_a_plan_read_ahead_fetches_only_the_blocks_read_soon() {
    let local = tempfile::tempdir().unwrap();
    let tier = block_tier(local.path(), "memory:///plans/ahead");
    let b = 1u64 << 16;
    for name in ["planned", "unplanned"] {
        tier.put_bytes(name, vec![7u8; 16 << 16]).unwrap();
    }
    let present = |file: &RemoteFile, blocks: std::ops::Range<u64>| -> Vec<bool> {
        blocks.map(|i| file.state().has(i)).collect()
    };
    let settled = |file: &RemoteFile, want: std::ops::Range<u64>| {
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while want.clone().any(|i| !file.state().has(i)) && std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Let any other read-ahead land too.
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut buf = [0u8; 10];

    // No plan: a read that jumps reads nothing ahead; the next read,
    // which continues it, the four blocks after it.
    let file = tier.open_object("unplanned").unwrap();
    file.read_at(7 * b, &mut buf).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(present(&file, 7..9), [true, false]);
    file.read_at(8 * b, &mut buf).unwrap();
    settled(&file, 9..13);
    assert_eq!(
        present(&file, 7..14),
        [true, true, true, true, true, true, false]
    );

    // A plan reading block 2 next batch and block 3 ten batches on:
    // only block 2 of the window 1..5 is read ahead.
    let file = tier.open_object("planned").unwrap();
    let _plan = file
        .set_plan(
            &[(0..1, 0), (2 * b..2 * b + 1, 1), (3 * b..3 * b + 1, 10)],
            16,
        )
        .unwrap();
    file.read_at(0, &mut buf).unwrap();
    settled(&file, 2..3);
    assert_eq!(
        present(&file, 0..6),
        [true, false, true, false, false, false]
    );
}
