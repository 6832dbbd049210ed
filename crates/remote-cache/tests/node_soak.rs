//! One budget per node, with the stores as users open them: a segment
//! store, a page file, a memmap array and a shard store, each published to
//! a bucket of its own and together three times the budget, read through
//! one local tier by eight processes that start together and open and
//! close the stores in a loop. The parent looks at the tier without pause:
//! its count stays within the budget and the processes' slack at every
//! look (a read may be counted over the budget, within that slack), and after each job the count matches the disk within the copies'
//! allowances; then the same tier serves a second and a third job. Every
//! item read is checked.
//!
//! Buckets are `file://` directories: what is under test is the local
//! tier the stores share.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{build_arrays, small_tier};
use page_alloc::{PageWriter, Value as PageValue, WriterOptions};
use remote_cache::{ArraysAt, Location, PagesAt, RemoteDir, SegmentsAt, ShardsAt, StoreFiles};
use remote_tier::{RemoteTier, TierConfig};
use tensor_core::{Tensor, Value};
use test_support::tier_disk::assert_count_matches_disk;

/// The tier's budget: a third of the four stores' bytes.
const BUDGET: u64 = 4 << 20;
const PROCESSES: u64 = 8;
const JOBS: u64 = 3;
/// Items each step reads from the store it opened.
const ITEMS_PER_STEP: u64 = 6;
/// A process's slack over the budget: the items one step holds leased at
/// once (a page of 64 KiB or a row of up to 8 KiB each, and the blocks
/// they straddle), its fetches in flight and their read-ahead
/// (`parallelism` = 4 blocks of 64 KiB each).
const PROCESS_SLACK: u64 = ITEMS_PER_STEP * (64 << 10) + 2 * 4 * (64 << 10);
/// Set in a child's environment: `bucket \n tier_dir \n seed \n steps`.
const CHILD: &str = "CACHEX_TEST_NODE_SOAK_STORES";

const RECORDS: usize = 1000;
const SAMPLES: usize = 1000;
const ROWS: u64 = 768;
const ITEMS: u64 = 3000;

fn url(bucket: &Path, store: &str) -> String {
    format!("file://{}/{store}", bucket.display())
}

/// A reader's tier: the soak's budget, small blocks, a block of
/// read-ahead once reads are sequential.
fn tier_config(tier_dir: &Path) -> TierConfig {
    small_tier(tier_dir, BUDGET)
}

fn location(bucket: &Path, store: &str, tier_dir: &Path) -> Location {
    std::fs::create_dir_all(bucket.join(store)).unwrap();
    Location::remote(&url(bucket, store), tier_config(tier_dir))
}

/// Record `i` of the segment store: 256 to 2,047 f32s (1 to 8 KiB).
fn record(i: usize) -> Value {
    let len = 256 + (i * 7919) % 1792;
    let base = i as f32 * 0.25;
    Value::from(Tensor::from_vec([len], (0..len).map(|j| base + j as f32).collect()).unwrap())
}

/// Sample `i` of the page file: 1 to 6 KiB.
fn blob(i: usize) -> Vec<u8> {
    let len = 1000 + (i * 7919) % 5000;
    (0..len).map(|k| (i * 31 + k * 7) as u8).collect()
}

/// Row `i` of the memmap array: an i32[1024].
fn row(i: u64) -> Vec<i32> {
    (0..1024).map(|j| (i * 1024 + j) as i32 ^ 0x5a5a).collect()
}

/// Item `i` of the shard store.
fn item(i: u64) -> (u64, String) {
    (i, format!("item {i}: {}", "x".repeat((i % 700) as usize)))
}

fn shard_options() -> shard_store::Options {
    shard_store::Options::default().shard_items(50)
}

/// Publishes `dir` (a store written locally) to `store`'s bucket.
fn publish_dir(bucket: &Path, store: &str, dir: &Path) {
    let writer_tier = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(bucket.join(store)).unwrap();
    let tier =
        RemoteTier::open(&url(bucket, store), small_tier(writer_tier.path(), 1 << 30)).unwrap();
    let remote = RemoteDir::open(tier, dir, StoreFiles::PLAIN).unwrap();
    assert_eq!(remote.publish().unwrap().seq, Some(1));
}

/// Writes and publishes the four stores into `bucket`.
fn publish_stores(bucket: &Path) {
    let writer_tier = tempfile::tempdir().unwrap();
    let segments = SegmentsAt::open(
        &location(bucket, "segments", writer_tier.path()),
        segment_store::Options {
            flush_every: 100,
            ..segment_store::Options::default()
        },
    )
    .unwrap();
    let records: Vec<(String, Value)> =
        (0..RECORDS).map(|i| (format!("k{i}"), record(i))).collect();
    segments.put_batch(&records).unwrap();
    assert_eq!(segments.publish().unwrap().seq, Some(1));
    drop(segments);

    let pages = tempfile::tempdir().unwrap();
    let schema = page_alloc::Schema::new().int("label").bytes("blob");
    let mut writer = PageWriter::create(
        pages.path().join("data.pages"),
        schema,
        WriterOptions::default().page_size(64 << 10),
    )
    .unwrap();
    for i in 0..SAMPLES {
        writer
            .append(&[PageValue::Int(i as i64), PageValue::Bytes(&blob(i))])
            .unwrap();
    }
    writer.finalize().unwrap();
    publish_dir(bucket, "pages", pages.path());

    let arrays = build_arrays(ROWS, row);
    publish_dir(bucket, "arrays", arrays.path());

    let shard_tier = tempfile::tempdir().unwrap();
    let shards = ShardsAt::open_with_source(
        &location(bucket, "shards", shard_tier.path()),
        shard_options(),
        || (0..ITEMS).map(item),
    )
    .unwrap();
    shards.wait_until_all_cached().unwrap();
    assert_eq!(shards.publish().unwrap().seq, Some(1));
}

/// A number from `seed` (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The child half of `four_kinds_of_store_in_eight_processes_stay_within_one_budget`:
/// `steps` times, opens one of the four stores on the shared tier, reads
/// and checks a few random items, and closes it.
#[test]
fn soak_child() {
    let Ok(fields) = std::env::var(CHILD) else {
        return;
    };
    let fields: Vec<&str> = fields.split('\n').collect();
    let (bucket, tier_dir) = (Path::new(fields[0]), Path::new(fields[1]));
    let mut rng = Rng(fields[2].parse::<u64>().unwrap() | 1);
    let steps: u64 = fields[3].parse().unwrap();
    for step in 0..steps {
        match rng.below(4) {
            0 => {
                let store = SegmentsAt::open(
                    &location(bucket, "segments", tier_dir),
                    segment_store::Options {
                        read_only: true,
                        lru_bytes: 0,
                        ..segment_store::Options::default()
                    },
                )
                .unwrap();
                let batch: Vec<usize> = (0..ITEMS_PER_STEP)
                    .map(|_| rng.below(RECORDS as u64) as usize)
                    .collect();
                let keys: Vec<String> = batch.iter().map(|i| format!("k{i}")).collect();
                let (got, missing) = store.get_batch(&keys).unwrap();
                assert!(missing.is_empty(), "step {step}: {missing:?} missing");
                for (&i, v) in batch.iter().zip(&got) {
                    assert_eq!(v.as_ref(), Some(&record(i)), "step {step}: record {i}");
                }
            }
            1 => {
                let pages =
                    PagesAt::open(&location(bucket, "pages", tier_dir), "data.pages").unwrap();
                for _ in 0..ITEMS_PER_STEP {
                    let i = rng.below(SAMPLES as u64) as usize;
                    let s = pages.sample(i).unwrap();
                    assert_eq!(s.int(0).unwrap(), i as i64);
                    assert!(
                        s.bytes(1).unwrap() == &blob(i)[..],
                        "step {step}: sample {i}"
                    );
                }
            }
            2 => {
                let arrays = ArraysAt::open(&location(bucket, "arrays", tier_dir)).unwrap();
                for _ in 0..ITEMS_PER_STEP {
                    let i = rng.below(ROWS);
                    let view = arrays.array(i, "data").unwrap().unwrap();
                    assert!(
                        view.as_slice::<i32>().unwrap() == &row(i)[..],
                        "step {step}: row {i}"
                    );
                }
            }
            _ => {
                let shards: ShardsAt<(u64, String)> =
                    ShardsAt::open(&location(bucket, "shards", tier_dir), shard_options()).unwrap();
                for _ in 0..ITEMS_PER_STEP {
                    let i = rng.below(ITEMS);
                    assert_eq!(*shards.get(i as i64).unwrap(), item(i), "step {step}");
                }
            }
        }
    }
    println!("\nDONE");
}

/// Waits for every child to end within `bound` in all, each successful
/// and having said DONE; one past the bound is killed by its pid (every
/// child is reaped whatever happens) and fails the test.
fn wait_children(children: &mut [Child], bound: Duration) {
    use std::io::Read;
    let deadline = Instant::now() + bound;
    let mut failed = Vec::new();
    for child in children.iter_mut() {
        let status = loop {
            match child.try_wait().unwrap() {
                Some(status) => break Some(status),
                None if Instant::now() > deadline => {
                    child.kill().ok();
                    child.wait().unwrap();
                    break None;
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out).ok();
        match status {
            Some(s) if s.success() && out.lines().any(|l| l == "DONE") => {}
            Some(s) => failed.push(format!("child {} failed: {s}", child.id())),
            None => failed.push(format!("child {} hung", child.id())),
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

/// Eight processes that start together open and close the four kinds of
/// store on one tier (a third of their bytes) in a loop, for three jobs,
/// while the parent checks the tier at every look. `CACHEX_TEST_SOAK_STEPS`
/// sets each process's steps (store opens) per job (default 40).
#[test]
fn four_kinds_of_store_in_eight_processes_stay_within_one_budget() {
    let steps: u64 = std::env::var("CACHEX_TEST_SOAK_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let bucket = tempfile::tempdir().unwrap();
    let tier_dir = tempfile::tempdir().unwrap();
    publish_stores(bucket.path());
    let stored: u64 = walkdir(bucket.path());
    assert!(
        stored >= 3 * BUDGET,
        "the stores ({stored} bytes) fit the budget"
    );
    // Any handle of the tier sees its count: the pages' bucket's.
    let watcher =
        RemoteTier::open(&url(bucket.path(), "pages"), tier_config(tier_dir.path())).unwrap();
    let bound = BUDGET + PROCESSES * PROCESS_SLACK;
    for job in 0..JOBS {
        let mut children: Vec<Child> = (0..PROCESSES)
            .map(|p| {
                Command::new(std::env::current_exe().unwrap())
                    .args(["--exact", "soak_child", "--nocapture", "--test-threads=1"])
                    .env(
                        CHILD,
                        format!(
                            "{}\n{}\n{}\n{steps}",
                            bucket.path().display(),
                            tier_dir.path().display(),
                            1 + 31 * job + p
                        ),
                    )
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let (mut looks, mut peak) = (0u64, 0u64);
        let watched = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
                let stats = watcher.stats().unwrap();
                peak = peak.max(stats.allocated);
                assert!(
                    stats.allocated <= bound,
                    "job {job}: {} bytes counted, the budget {BUDGET} and slack {}: {stats:?}",
                    stats.allocated,
                    bound - BUDGET
                );
                looks += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
        // Every child ends, by its pid if need be, whatever happened above.
        wait_children(&mut children, Duration::from_secs(600));
        if let Err(panic) = watched {
            std::panic::resume_unwind(panic);
        }
        watcher.evict().unwrap();
        let stats = watcher.stats().unwrap();
        // A process may end with a read-ahead (a block) in flight.
        let unmarked = PROCESSES * 4 * (64 << 10);
        assert_count_matches_disk(
            tier_dir.path(),
            stats.allocated,
            &format!("after job {job}"),
            unmarked,
        );
        println!(
            "job {job}: {looks} looks, peak {peak} of {BUDGET} ({:.3}x): {stats:?}",
            peak as f64 / BUDGET as f64
        );
    }
    // Reads counted over the budget (`over_budget`) may happen: a read
    // that finds every byte held by the other processes' leases goes over
    // by its own bytes, within its process's slack, which the bound above
    // holds at every look.
    let stats = watcher.stats().unwrap();
    println!("over the budget: {} reads", stats.over_budget);
}

/// The bytes of every file under `dir`.
fn walkdir(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        total += match m.is_dir() {
            true => walkdir(&e.path()),
            false => m.len(),
        };
    }
    total
}
