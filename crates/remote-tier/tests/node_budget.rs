//! One budget per node, whoever opens the tier: claims for whole copies
//! shared by every store and process; a count that gives back what each
//! copy took, however many copies come and go; no rebuild asked because a
//! second store or process opened the tier; and a soak of several
//! processes and caches on one tier, the count checked against the disk.
//!
//! Buckets are `file://` directories: what is under test is the local
//! tier, which every store shares. Each cache's objects have names of
//! their own, as a commit log's content-addressed objects do: the tier
//! keys its copies by object name.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Rng, env_count, sample, small_config, wait_children};
use remote_tier::{RemoteTier, TierConfig};
use test_support::tier_disk::assert_count_matches_disk;

const BUDGET: u64 = 1 << 20;
/// The soak's budget: room for what its processes hold at once (each a
/// whole-pinned copy, a leased read and its read-ahead).
const SOAK_BUDGET: u64 = 4 << 20;

fn file_url(dir: &Path, prefix: &str) -> String {
    format!("file://{}/{prefix}", dir.display())
}

fn open(bucket: &Path, prefix: &str, config: TierConfig) -> RemoteTier {
    std::fs::create_dir_all(bucket.join(prefix)).unwrap();
    RemoteTier::open(&file_url(bucket, prefix), config).unwrap()
}

fn spawn_child(test: &str, var: &str, value: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(var, value)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

const CLAIM_CHILD: &str = "CACHEX_TEST_NODE_CLAIM";

/// The child half of `claims_of_every_store_and_process_share_one_budget`:
/// claims 900 KiB of the tier, says so and waits to be killed.
#[test]
fn claiming_child() {
    let Ok(fields) = std::env::var(CLAIM_CHILD) else {
        return;
    };
    let (bucket, local) = fields.split_once('\n').unwrap();
    let tier = open(
        Path::new(bucket),
        "child",
        small_config(Path::new(local), BUDGET),
    );
    let claim = tier.claim_whole(900 << 10).unwrap();
    assert!(claim.is_some(), "no room for the child's claim");
    println!("\nCLAIMED");
    std::thread::sleep(Duration::from_secs(600));
}

/// Two caches of 700 KiB on a 1 MiB tier cannot both be kept whole: the
/// second is refused until the first lets go; a process's claims count
/// for every other process, and end with it.
#[test]
fn claims_of_every_store_and_process_share_one_budget() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let train = open(bucket.path(), "train", small_config(local.path(), BUDGET));
    let valid = open(bucket.path(), "valid", small_config(local.path(), BUDGET));
    let first = train.claim_whole(700 << 10).unwrap().expect("room for one");
    assert!(
        valid.claim_whole(700 << 10).unwrap().is_none(),
        "two caches of 700 KiB were both granted a 1 MiB tier"
    );
    let rest = valid.claim_whole(300 << 10).unwrap().expect("room left");
    drop(first);
    let second = valid.claim_whole(700 << 10).unwrap().expect("room freed");
    drop((rest, second));

    let mut child = spawn_child(
        "claiming_child",
        CLAIM_CHILD,
        &format!("{}\n{}", bucket.path().display(), local.path().display()),
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let claimed = lines.any(|l| l.is_ok_and(|l| l == "CLAIMED"));
    assert!(claimed, "the child did not claim");
    assert!(
        train.claim_whole(200 << 10).unwrap().is_none(),
        "another process's claim was not counted"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        train.claim_whole(1 << 20).unwrap().is_some(),
        "a dead process's claim outlived it"
    );
}

/// Copies made and evicted give back exactly what they took: the count
/// tracks the disk (within the allowances of the copies present) after
/// every read, over thousands of copies, and no read is counted over the
/// budget. `CACHEX_TEST_COPIES` sets how many copies (default 2,000).
#[test]
fn the_count_follows_copies_made_and_evicted() {
    let copies: u64 = env_count("CACHEX_TEST_COPIES", 2_000);
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    // No read-ahead: a fetch still in flight when the count is checked
    // would be counted (reserved) and not yet on disk.
    let mut config = small_config(local.path(), BUDGET);
    config.prefetch_blocks = 0;
    let tier = open(bucket.path(), "c", config);
    // 200 objects of 70 KB (sparse: above the whole-file size), 14 MB in
    // all, read in turn a few bytes of their first block (64 KiB) each:
    // the budget holds about a dozen such copies, so every read makes a
    // copy and evicts the least recently read one whole.
    let objects = 200u64;
    for i in 0..objects {
        tier.put_bytes(&format!("o{i}"), sample(70_000, i)).unwrap();
    }
    let mut buf = [0u8; 16];
    for n in 0..copies {
        let i = n % objects;
        let at = 1000 + (n % 1000);
        {
            let f = tier.open_object(&format!("o{i}")).unwrap();
            f.read_at(at, &mut buf).unwrap();
            let want = sample(70_000, i);
            assert_eq!(buf[..], want[at as usize..at as usize + 16], "copy {n}");
        }
        let stats = tier.stats().unwrap();
        assert_count_matches_disk(local.path(), stats.allocated, &format!("copy {n}"), 0);
    }
    let stats = tier.stats().unwrap();
    assert_eq!(stats.over_budget, 0, "{stats:?}");
    assert!(stats.allocated <= BUDGET, "{stats:?}");
    // Every read made a new copy (none was still there from the object's
    // last read), and all but the copies the budget holds were evicted.
    assert_eq!(stats.get_requests, copies, "{stats:?}");
    let block = 64u64 << 10;
    assert!(
        stats.evicted_bytes >= copies.saturating_sub(BUDGET / block) * block,
        "{stats:?}"
    );
    println!("{copies} copies: {stats:?}");
}

/// A second store opened in the process, or a second process, asks for
/// no rebuild of the count: only a dead holder mid-change, another boot
/// or a new file does.
#[test]
fn opening_more_stores_asks_for_no_rebuild() {
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let first = open(bucket.path(), "a", small_config(local.path(), BUDGET));
    first.put_bytes("x", sample(200_000, 1)).unwrap();
    let mut buf = [0u8; 8];
    first
        .open_object("x")
        .unwrap()
        .read_at(150_000, &mut buf)
        .unwrap();
    let rebuilds = first.stats().unwrap().rebuilds;
    assert_eq!(rebuilds, 1, "the new tier's first count");
    for i in 0..5 {
        let other = open(
            bucket.path(),
            &format!("b{i}"),
            small_config(local.path(), BUDGET),
        );
        other.put_bytes("y", sample(100_000, 2)).unwrap();
        other
            .open_object("y")
            .unwrap()
            .read_at(99_000, &mut buf)
            .unwrap();
    }
    let stats = first.stats().unwrap();
    assert_eq!(stats.rebuilds, rebuilds, "{stats:?}");
    assert_count_matches_disk(local.path(), stats.allocated, "after five more stores", 0);
}

const SOAK_CHILD: &str = "CACHEX_TEST_NODE_SOAK";
const SOAK_PROCESSES: u64 = 8;
const SOAK_CACHES: u64 = 4;
/// A process's slack over the budget: its fetches in flight (a read and
/// its read-ahead, `parallelism` blocks) and its sticky leases.
const PROCESS_SLACK: u64 = (4 + 4) * (64 << 10);

/// The child half of `a_node_of_processes_and_caches_stays_within_one_budget`:
/// opens the soak's caches on the shared tier and, step after step, reads
/// a random range of a random object of a random cache — leased (a page
/// file's or a segment's way), whole-pinned (a mapped array's), or fetched
/// whole (a small file's) — or claims room for whole copies and lets it
/// go; every byte read is checked.
#[test]
fn soaking_child() {
    let Ok(fields) = std::env::var(SOAK_CHILD) else {
        return;
    };
    let fields: Vec<&str> = fields.split('\n').collect();
    let (bucket, local) = (Path::new(fields[0]), Path::new(fields[1]));
    let seed: u64 = fields[2].parse().unwrap();
    let steps: u64 = fields[3].parse().unwrap();
    let caches: Vec<RemoteTier> = (0..SOAK_CACHES)
        .map(|c| {
            open(
                bucket,
                &format!("cache{c}"),
                small_config(local, SOAK_BUDGET),
            )
        })
        .collect();
    let bigs: Vec<Vec<u8>> = (0..SOAK_CACHES)
        .map(|c| sample(3 * BUDGET as usize, 100 + c))
        .collect();
    let mut rng = Rng(seed | 1);
    let mut claims = Vec::new();
    for _ in 0..steps {
        let c = rng.below(SOAK_CACHES);
        let tier = &caches[c as usize];
        match rng.below(8) {
            0..=3 => {
                let data = &bigs[c as usize];
                let f = tier.open_leased(&format!("c{c}-big"), None).unwrap();
                let len = 1 + rng.below(100_000);
                let at = rng.below(data.len() as u64 - len);
                let lease = f.lease(std::slice::from_ref(&(at..at + len))).unwrap();
                let mut got = vec![0u8; len as usize];
                f.file().unwrap().read_exact_at(&mut got, at).unwrap();
                drop(lease);
                assert!(got == data[at as usize..(at + len) as usize]);
            }
            4 | 5 => {
                let i = rng.below(16);
                let data = sample(150_000, 1000 * c + i);
                let f = tier.open_object(&format!("c{c}-mid{i}")).unwrap();
                let at = rng.below(149_000);
                let mut got = [0u8; 1000];
                f.read_at(at, &mut got).unwrap();
                assert!(got[..] == data[at as usize..at as usize + 1000]);
            }
            6 => {
                let i = rng.below(16);
                let data = sample(30_000, 2000 * c + i);
                let f = tier.open_object(&format!("c{c}-small{i}")).unwrap();
                let mut got = [0u8; 100];
                f.read_at(29_000, &mut got).unwrap();
                assert!(got[..] == data[29_000..29_100]);
            }
            _ => {
                if claims.len() > 1 || rng.below(2) == 0 {
                    claims.clear();
                } else if let Some(claim) = tier.claim_whole(200 << 10).unwrap() {
                    claims.push(claim);
                }
            }
        }
    }
    println!("\nDONE");
}

/// Eight processes that start together, each with four caches on one
/// tier, read and claim in a loop while the parent checks the tier after
/// every look: allocated bytes within the budget and the processes'
/// slack, the count within the allowances of the disk, no read over the
/// budget; then the same tier serves a second and a third job. `CACHEX_TEST_SOAK_STEPS` sets each
/// process's steps (default 150).
#[test]
fn a_node_of_processes_and_caches_stays_within_one_budget() {
    let steps: u64 = env_count("CACHEX_TEST_SOAK_STEPS", 150);
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    for c in 0..SOAK_CACHES {
        let tier = open(
            bucket.path(),
            &format!("cache{c}"),
            small_config(local.path(), SOAK_BUDGET),
        );
        tier.put_bytes(&format!("c{c}-big"), sample(3 * BUDGET as usize, 100 + c))
            .unwrap();
        for i in 0..16 {
            tier.put_bytes(&format!("c{c}-mid{i}"), sample(150_000, 1000 * c + i))
                .unwrap();
            tier.put_bytes(&format!("c{c}-small{i}"), sample(30_000, 2000 * c + i))
                .unwrap();
        }
    }
    let watcher = open(
        bucket.path(),
        "cache0",
        small_config(local.path(), SOAK_BUDGET),
    );
    let bound = SOAK_BUDGET + SOAK_PROCESSES * PROCESS_SLACK;
    for job in 0..3u64 {
        let mut children: Vec<Child> = (0..SOAK_PROCESSES)
            .map(|p| {
                spawn_child(
                    "soaking_child",
                    SOAK_CHILD,
                    &format!(
                        "{}\n{}\n{}\n{steps}",
                        bucket.path().display(),
                        local.path().display(),
                        1 + 31 * job + p
                    ),
                )
            })
            .collect();
        let mut looks = 0u64;
        let mut peak = 0u64;
        while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
            let stats = watcher.stats().unwrap();
            peak = peak.max(stats.allocated);
            assert!(
                stats.allocated <= bound,
                "job {job}: {} bytes counted, the budget {SOAK_BUDGET} and slack {}: {stats:?}",
                stats.allocated,
                bound - SOAK_BUDGET
            );
            looks += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
        wait_children(&mut children, Duration::from_secs(300), "child");
        // A process that ended with a read-ahead in flight left its
        // reservation counted; the next pass (or the next process to
        // open the tier) takes it off with the process's pin record.
        watcher.evict().unwrap();
        let stats = watcher.stats().unwrap();
        // A process ends with its read-ahead (2 blocks) in flight.
        let unmarked = SOAK_PROCESSES * 2 * (64 << 10);
        assert_count_matches_disk(
            local.path(),
            stats.allocated,
            &format!("after job {job}"),
            unmarked,
        );
        println!("job {job}: {looks} looks, peak {peak} of {SOAK_BUDGET}: {stats:?}");
    }
    // Reads counted over the budget (`over_budget`) may happen: one that
    // finds every byte held by the other processes' leases, pins and
    // claims goes over by its own bytes, within its process's slack, which
    // the bound above holds at every look.
    let stats = watcher.stats().unwrap();
    println!("over the budget: {} reads", stats.over_budget);
}

const EVICTING_CHILD: &str = "CACHEX_TEST_NODE_EVICTING";
const STARTING_CHILD: &str = "CACHEX_TEST_NODE_STARTING";
/// Processes started at once in `first_opens_beside_an_evicting_process_never_fail`.
const STARTS_AT_ONCE: u64 = 8;

/// The evicting half of `first_opens_beside_an_evicting_process_never_fail`:
/// reads leased ranges of an object three times the budget, so that every
/// read evicts, and runs an eviction pass (which looks for dead processes'
/// records) after each, until the parent kills it.
#[test]
fn evicting_child() {
    let Ok(fields) = std::env::var(EVICTING_CHILD) else {
        return;
    };
    let (bucket, local) = fields.split_once('\n').unwrap();
    let tier = open(
        Path::new(bucket),
        "starts",
        small_config(Path::new(local), BUDGET),
    );
    let data = sample(3 * BUDGET as usize, 7);
    let mut rng = Rng(11);
    println!("\nEVICTING");
    // Bounded: the parent ends it long before.
    let until = std::time::Instant::now() + Duration::from_secs(3600);
    while std::time::Instant::now() < until {
        let at = rng.below(data.len() as u64 - 200_000);
        let mut got = vec![0u8; 200_000];
        let f = tier.open_leased("big", None).unwrap();
        let lease = f.lease(std::slice::from_ref(&(at..at + 200_000))).unwrap();
        f.file().unwrap().read_exact_at(&mut got, at).unwrap();
        drop(lease);
        assert!(got == data[at as usize..at as usize + 200_000]);
        tier.evict().unwrap();
    }
}

/// The starting half of `first_opens_beside_an_evicting_process_never_fail`:
/// opens the tier (its first open in this process: a new pin record) and
/// reads a small object.
#[test]
fn starting_child() {
    let Ok(fields) = std::env::var(STARTING_CHILD) else {
        return;
    };
    let (bucket, local) = fields.split_once('\n').unwrap();
    let tier = open(
        Path::new(bucket),
        "starts",
        small_config(Path::new(local), BUDGET),
    );
    let mut got = [0u8; 100];
    tier.open_object("small")
        .unwrap()
        .read_at(1000, &mut got)
        .unwrap();
    assert!(got[..] == sample(30_000, 8)[1000..1100]);
    println!("\nDONE");
}

/// Processes that start together (eight at a time) beside a process that
/// evicts without pause, and so looks for dead processes' pin records all
/// the time: every first open succeeds and reads right. Its record is
/// made where no look finds it before it is locked.
/// `CACHEX_TEST_PROCESS_STARTS` sets how many processes start (default
/// 200).
#[test]
fn first_opens_beside_an_evicting_process_never_fail() {
    let starts = env_count("CACHEX_TEST_PROCESS_STARTS", 200);
    let bucket = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let tier = open(bucket.path(), "starts", small_config(local.path(), BUDGET));
    tier.put_bytes("big", sample(3 * BUDGET as usize, 7))
        .unwrap();
    tier.put_bytes("small", sample(30_000, 8)).unwrap();
    let fields = format!("{}\n{}", bucket.path().display(), local.path().display());
    let mut evicting = spawn_child("evicting_child", EVICTING_CHILD, &fields);
    let mut lines = BufReader::new(evicting.stdout.take().unwrap()).lines();
    let ready = lines.any(|l| l.is_ok_and(|l| l == "EVICTING"));
    let mut started = 0;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(ready, "the evicting process did not start");
        while started < starts {
            let mut children: Vec<Child> = (0..STARTS_AT_ONCE.min(starts - started))
                .map(|_| spawn_child("starting_child", STARTING_CHILD, &fields))
                .collect();
            started += children.len() as u64;
            wait_children(&mut children, Duration::from_secs(120), "first open");
        }
    }));
    // Ended by its pid whatever happened above.
    let alive = evicting.try_wait().unwrap().is_none();
    evicting.kill().ok();
    evicting.wait().unwrap();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert!(alive, "the evicting process ended early");
    let stats = tier.stats().unwrap();
    println!("{started} processes started beside eviction: {stats:?}");
    assert_eq!(stats.over_budget, 0, "{stats:?}");
}
