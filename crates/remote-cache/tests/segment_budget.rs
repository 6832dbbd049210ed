//! A segment store three times its local tier's budget, read by keys in
//! a random order for three passes: its segments are linked leased, so
//! after every batch the tier's counted bytes stay within the budget plus
//! one batch's rows per reader, the disk (the tier's `objects/`, `tmp/`
//! and the working directories, each file once) holds no more than that
//! plus metadata, and every record read is right. The same with three
//! processes sharing the tier, in lockstep batch by batch. Readers whose
//! reads evict the blocks another reads meanwhile never see a freed block
//! (the reads hold leases). A whole copy made for a mapping (`verify`) is
//! let go once the mapping is, and the tier returns within its budget. A
//! prefetch of a batch's keys warms their rows only, and the batch then
//! reads with no request.
//!
//! Segments are published with a block list in 4 KiB blocks (the segment
//! block size), which the reader's tier takes for them.

mod common;

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{
    Children, Lockstep, new_bucket_url, s3_endpoint, s3_location, s3_options, small_tier,
    spawn_ready_child,
};
use remote_cache::{Location, SegmentsAt};
use remote_tier::{TierConfig, TierStats};
use segment_store::Options;
use tensor_core::{Tensor, Value};

const RECORDS: usize = 1200;
const PER_SEGMENT: usize = 100;
const BATCH: usize = 16;
const PASSES: u64 = 3;
const READERS: usize = 3;
/// The segment block size (`remote_cache`'s, 4 KiB): blocks of the segments' lists.
const BLOCK: u64 = remote_tier::MIN_BLOCK_SIZE;
/// Set in a child's environment: `endpoint \n url \n tier_dir \n budget \n rank`.
const CHILD: &str = "SEGMENT_BUDGET_CHILD";

/// Record `i`: 256 to 2,047 f32s derived from `i` (1 to 8 KiB).
fn record(i: usize) -> Value {
    let len = 256 + (i * 7919) % 1792;
    let base = i as f32 * 0.5;
    Value::from(Tensor::from_vec([len], (0..len).map(|j| base + j as f32).collect()).unwrap())
}

/// The most bytes a record's row holds, and the blocks one can straddle.
const MAX_ROW: u64 = 2048 * 4 + 2 * 4096;

/// A number from `seed` (splitmix64), for the shuffles.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Pass `p`'s order of the records' indices.
fn order(p: u64) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..RECORDS).collect();
    for k in (1..RECORDS).rev() {
        let r = (mix(p * 1_000_003 + k as u64) % (k as u64 + 1)) as usize;
        perm.swap(k, r);
    }
    perm
}

/// Reader `rank`'s (of `of`) batches of pass `p`: its contiguous span of
/// the order, cut into batches.
fn batches(p: u64, rank: usize, of: usize) -> Vec<Vec<usize>> {
    let order = order(p);
    let per = order.len() / of / BATCH * BATCH;
    order[rank * per..(rank + 1) * per]
        .chunks(BATCH)
        .map(<[usize]>::to_vec)
        .collect()
}

/// Publishes the records, `PER_SEGMENT` to a segment; the URL and the
/// segments' bytes.
fn publish(endpoint: &str, name: &str) -> (String, u64) {
    let url = new_bucket_url(endpoint, name);
    let tier = tempfile::tempdir().unwrap();
    let writer = SegmentsAt::open(
        &s3_location(endpoint, &url, tier.path()),
        Options {
            flush_every: PER_SEGMENT,
            ..Options::default()
        },
    )
    .unwrap();
    let records: Vec<(String, Value)> =
        (0..RECORDS).map(|i| (format!("k{i}"), record(i))).collect();
    writer.put_batch(&records).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));
    let dir = writer.remote().unwrap().dir().join("segments");
    let bytes = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| std::fs::metadata(e.path()).unwrap().len())
        .sum();
    (url, bytes)
}

/// The tier of a reader: the budget, no read-ahead (the keys jump).
fn reader_tier(dir: &Path, budget: u64) -> TierConfig {
    let mut config = small_tier(dir, budget);
    config.prefetch_blocks = 0;
    config
}

/// A read-only reader of `url` on the tier at `tier_dir`.
fn reader(endpoint: &str, url: &str, tier_dir: &Path, budget: u64) -> SegmentsAt {
    let location =
        Location::remote(url, reader_tier(tier_dir, budget)).with_options(s3_options(endpoint));
    let options = Options {
        read_only: true,
        // Records come from the segments every time, not from memory.
        lru_bytes: 0,
        ..Options::default()
    };
    SegmentsAt::open(&location, options).unwrap()
}

/// Reads `batch` through `store` and checks every record.
fn read_checked(store: &SegmentsAt, batch: &[usize], who: &str) {
    let keys: Vec<String> = batch.iter().map(|i| format!("k{i}")).collect();
    let (got, missing) = store.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{who}: {missing:?} missing");
    for (&i, v) in batch.iter().zip(&got) {
        assert_eq!(v.as_ref(), Some(&record(i)), "{who}: record {i}");
    }
}

/// Bytes allocated under the tier's `objects/`, `tmp/` and `work/`, each
/// file once: `(data, metadata)`, data being the copies (`.sparse`,
/// `.whole`) and fetches in flight, metadata the rest (block maps, block
/// clocks, the working directories' index logs and records).
fn physical(tier_dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    let mut seen = HashSet::new();
    let mut dirs: Vec<_> = ["objects", "tmp", "work"]
        .iter()
        .map(|d| tier_dir.join(d))
        .collect();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.is_dir() {
                dirs.push(e.path());
                continue;
            }
            if !m.is_file() || !seen.insert(m.ino()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            let in_tmp = dir.ends_with("tmp");
            let data = in_tmp || name.ends_with(".sparse") || name.ends_with(".whole");
            match data {
                true => out.0 += m.blocks() * 512,
                false => out.1 += m.blocks() * 512,
            }
        }
    }
    out
}

/// What may sit beside the budget: one batch's rows per reader (each
/// row's blocks leased while read), and the blocks a process leaves
/// leased after a read (`remote_tier`'s sticky leases: 4).
fn runs(readers: usize) -> u64 {
    readers as u64 * (BATCH as u64 * MAX_ROW + 4 * BLOCK)
}

#[test]
fn a_segment_store_three_times_the_budget_read_in_random_order_stays_within_it() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (url, size) = publish(&endpoint, "segment-budget");
    let budget = size / 3 / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let store = reader(&endpoint, &url, tier_dir.path(), budget);
    let bound = budget + runs(1);
    let (mut most_counted, mut most_data, mut most_meta) = (0u64, 0u64, 0u64);
    for p in 0..PASSES {
        let before = TierStats::read(tier_dir.path()).unwrap();
        for (j, batch) in batches(p, 0, 1).iter().enumerate() {
            read_checked(&store, batch, &format!("pass {p} batch {j}"));
            let counted = TierStats::read(tier_dir.path()).unwrap().allocated;
            let (data, meta) = physical(tier_dir.path());
            assert!(
                counted <= bound,
                "pass {p} batch {j}: the tier counts {counted} bytes, over {budget} + {}",
                bound - budget
            );
            assert!(
                data <= counted,
                "pass {p} batch {j}: the copies hold {data} bytes, the tier counts {counted}"
            );
            (most_counted, most_data) = (most_counted.max(counted), most_data.max(data));
            most_meta = most_meta.max(meta);
        }
        let after = TierStats::read(tier_dir.path()).unwrap();
        eprintln!(
            "pass {p}: fetched {} bytes ({:.3} of the segments' {size}), punched {} blocks, \
             most counted {most_counted}, most in copies {most_data} (and {most_meta} of \
             metadata), budget {budget}, over budget {}",
            after.fetched_bytes - before.fetched_bytes,
            (after.fetched_bytes - before.fetched_bytes) as f64 / size as f64,
            after.punched_blocks - before.punched_blocks,
            after.over_budget
        );
        // Three times the budget: the tier had to free blocks of open
        // segments to stay within it.
        assert!(after.punched_blocks > before.punched_blocks, "pass {p}");
    }
    assert!(most_data <= bound, "{most_data} bytes in copies at most");

    // A prefetch of a batch's keys warms their rows, not whole segments:
    // the batch then reads with no fetch, and the tier stays within it.
    let next = &batches(PASSES, 0, 1)[0];
    let keys: Vec<String> = next.iter().map(|i| format!("k{i}")).collect();
    let warming = store.prefetch(&keys);
    assert!(warming.wait(std::time::Duration::from_secs(120)));
    assert_eq!(warming.failed(), 0);
    let before = TierStats::read(tier_dir.path()).unwrap();
    assert!(
        before.allocated <= bound,
        "after a prefetch: {}",
        before.allocated
    );
    read_checked(&store, next, "the prefetched batch");
    let after = TierStats::read(tier_dir.path()).unwrap();
    assert_eq!(after.get_requests, before.get_requests);

    // The store's own whole read (verify maps every segment) makes each
    // segment whole for the mapping, and lets go of it after: the next
    // reads bring the tier back within the budget.
    assert!(store.store().verify().is_empty());
    for (j, batch) in batches(0, 0, 1).iter().take(8).enumerate() {
        read_checked(&store, batch, &format!("after verify, batch {j}"));
    }
    let counted = TierStats::read(tier_dir.path()).unwrap().allocated;
    assert!(
        counted <= bound,
        "after verify: the tier counts {counted} bytes, over {budget} + {}",
        bound - budget
    );
}

/// Two caches (train and validation sets), each 0.7 of the tier's
/// budget, read side by side on one tier: each alone would be kept whole,
/// together they may not. The tier grants room for one; the other reads
/// by ranges, and the tier stays within its budget (plus one batch's rows
/// per cache) after every batch, never reading over it.
#[test]
fn two_caches_each_under_the_budget_stay_within_it_together() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (train_url, size) = publish(&endpoint, "two-caches-train");
    let (valid_url, other) = publish(&endpoint, "two-caches-valid");
    assert_eq!(size, other);
    let budget = (size * 10 / 7) / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let train = reader(&endpoint, &train_url, tier_dir.path(), budget);
    let valid = reader(&endpoint, &valid_url, tier_dir.path(), budget);
    let bound = budget + runs(2);
    let mut most = 0u64;
    for p in 0..2 {
        for (j, batch) in batches(p, 0, 1).iter().enumerate() {
            read_checked(&train, batch, &format!("train, pass {p} batch {j}"));
            read_checked(&valid, batch, &format!("valid, pass {p} batch {j}"));
            let stats = TierStats::read(tier_dir.path()).unwrap();
            most = most.max(stats.allocated);
            assert!(
                stats.allocated <= bound,
                "pass {p} batch {j}: two caches hold {} bytes on a tier of {budget}: {stats:?}",
                stats.allocated
            );
        }
    }
    let stats = TierStats::read(tier_dir.path()).unwrap();
    assert_eq!(stats.over_budget, 0, "{stats:?}");
    eprintln!("two caches of {size} bytes on {budget}: most counted {most}, {stats:?}");
    // Once the cache kept whole is closed, the other may be (asked
    // again a second after its last refusal).
    drop(train);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert!(valid.remote().unwrap().may_keep_whole());
}

#[test]
fn readers_whose_reads_evict_each_others_blocks_read_right_records() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (url, size) = publish(&endpoint, "segment-budget-evict");
    // A budget of a tenth: every batch of one reader frees blocks the
    // other may be about to read.
    let budget = size / 10 / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let stores: Vec<SegmentsAt> = (0..2)
        .map(|_| reader(&endpoint, &url, tier_dir.path(), budget))
        .collect();
    std::thread::scope(|s| {
        for (r, store) in stores.iter().enumerate() {
            s.spawn(move || {
                for p in 0..2 {
                    for (j, batch) in batches(p + 10 * r as u64, 0, 1).iter().enumerate() {
                        read_checked(store, batch, &format!("reader {r} pass {p} batch {j}"));
                    }
                }
            });
        }
    });
    let stats = TierStats::read(tier_dir.path()).unwrap();
    assert!(stats.punched_blocks > 0, "{stats:?}");
    assert!(
        stats.allocated <= budget + runs(2),
        "the tier counts {} bytes, over {budget} + {}",
        stats.allocated,
        runs(2)
    );
}

/// The child half of
/// `a_segment_store_three_times_the_budget_read_by_three_processes` (does
/// nothing unless spawned by it): reader `rank` reads its batches of every
/// pass, one when told `go`, and answers `done <allocated>`.
#[test]
fn segment_budget_child() {
    let Ok(args) = std::env::var(CHILD) else {
        return;
    };
    let args: Vec<&str> = args.split('\n').collect();
    let (endpoint, url, tier_dir) = (args[0], args[1], Path::new(args[2]));
    let budget: u64 = args[3].parse().unwrap();
    let rank: usize = args[4].parse().unwrap();
    let store = reader(endpoint, url, tier_dir, budget);
    let mut parent = Lockstep::ready();
    for p in 0..PASSES {
        for (j, batch) in batches(p, rank, READERS).iter().enumerate() {
            parent.go();
            read_checked(&store, batch, &format!("rank {rank} pass {p} batch {j}"));
            parent.done(tier_dir);
        }
    }
    parent.end();
}

#[test]
fn a_segment_store_three_times_the_budget_read_by_three_processes() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (url, size) = publish(&endpoint, "segment-budget-procs");
    let budget = size / 3 / BLOCK * BLOCK;
    let tier_dir = tempfile::tempdir().unwrap();
    let args = format!("{endpoint}\n{url}\n{}\n{budget}", tier_dir.path().display());
    let mut readers = Children(
        (0..READERS)
            .map(|r| {
                spawn_ready_child(
                    "segment_budget_child",
                    CHILD,
                    format!("{args}\n{r}"),
                    &format!("reader {r}"),
                )
            })
            .collect(),
    );
    let bound = budget + runs(READERS);
    let batches_per_pass = batches(0, 0, READERS).len();
    let (mut most_counted, mut most_data) = (0u64, 0u64);
    for p in 0..PASSES {
        for j in 0..batches_per_pass {
            most_counted = most_counted.max(readers.step("reader"));
            // Every reader between batches: what the tier holds now.
            let now = TierStats::read(tier_dir.path()).unwrap();
            let (data, _) = physical(tier_dir.path());
            assert!(
                data <= now.allocated,
                "pass {p} batch {j}: the copies hold {data} bytes, the tier counts {}",
                now.allocated
            );
            assert!(
                now.allocated <= bound,
                "pass {p} batch {j}: the tier counts {} bytes, over {budget} + {}",
                now.allocated,
                bound - budget
            );
            most_counted = most_counted.max(now.allocated);
            most_data = most_data.max(data);
        }
    }
    for (child, _) in &mut readers.0 {
        drop(child.stdin.take());
    }
    for (r, (child, _)) in readers.0.iter_mut().enumerate() {
        assert!(child.wait().unwrap().success(), "reader {r}");
    }
    let stats = TierStats::read(tier_dir.path()).unwrap();
    eprintln!(
        "three processes: most counted {most_counted}, most in copies {most_data}, budget \
         {budget} (+ {}), fetched {} bytes ({:.3} of {size} per pass), punched {} blocks",
        bound - budget,
        stats.fetched_bytes,
        stats.fetched_bytes as f64 / size as f64 / PASSES as f64,
        stats.punched_blocks
    );
    assert!(
        most_counted <= bound,
        "the tier counted {most_counted} bytes at most, over {budget} + {}",
        bound - budget
    );
    assert!(stats.punched_blocks > 0);
}
