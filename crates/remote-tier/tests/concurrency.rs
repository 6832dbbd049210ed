//! One local tier shared by threads and by processes: a block fetched
//! once serves all; two writers racing for one commit name, one wins.

mod common;

use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use common::{faulty_tier, s3_endpoint, s3_options, s3_store, sample, small_config};
use remote_tier::{Error, RemoteTier, build_store};

const CHILD_ENV: &str = "REMOTE_TIER_SHARED_CHILD";

/// The objects both processes read: 3 whole, 2 by blocks.
fn objects() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..3u64 {
        out.push((format!("small/{i}"), sample(20_000, i)));
    }
    for i in 0..2u64 {
        out.push((format!("large/{i}"), sample(700_000, 10 + i)));
    }
    out
}

/// Reads every object through the tier at `dir`, checks every byte and
/// returns how many GETs this process sent.
fn read_all(endpoint: &str, url: &str, dir: &std::path::Path) -> u64 {
    let (store, prefix) = build_store(url, s3_options(endpoint)).unwrap();
    let (tier, faults) = faulty_tier(store, prefix, url, small_config(dir, 1 << 30));
    for (name, bytes) in objects() {
        let f = tier.open_object(&name).unwrap();
        let mut got = vec![0u8; bytes.len()];
        f.read_at(0, &mut got).unwrap();
        assert!(got == bytes, "{name}");
    }
    // Prefetches may still be running: they only fetch blocks not yet
    // local, which the reads above already made local.
    faults.gets.load(Ordering::SeqCst)
}

/// The child half of `two_processes_share_one_local_tier` (does nothing
/// unless spawned by it).
#[test]
fn shared_tier_child() {
    let Some(fields) = test_support::s3::child_fields(CHILD_ENV) else {
        return;
    };
    let (endpoint, url, dir) = (&*fields[0], &*fields[1], &*fields[2]);
    let gets = read_all(endpoint, url, std::path::Path::new(dir));
    println!("\nGETS={gets}");
}

#[test]
fn two_processes_share_one_local_tier() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "shared");
    let up = tempfile::tempdir().unwrap();
    let writer = common::s3_tier(&endpoint, &url, small_config(up.path(), 1 << 30));
    for (name, bytes) in objects() {
        writer.put_bytes(&name, bytes).unwrap();
    }
    let shared = tempfile::tempdir().unwrap();
    let spawn = || {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "shared_tier_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(
                CHILD_ENV,
                test_support::s3::child_env(&endpoint, &url, shared.path(), &[]),
            )
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(spawn);
        let b = s.spawn(spawn);
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut gets = 0;
    for out in [&a, &b] {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n: u64 = stdout
            .lines()
            .find_map(|l| l.split("GETS=").nth(1))
            .unwrap_or_else(|| panic!("no GETS line in:\n{stdout}"))
            .parse()
            .unwrap();
        gets += n;
    }
    // Each whole object crossed the network once, for both; each object
    // read by blocks too, in one request (its adjacent 64 KiB blocks in
    // one run of at most 8 MiB, fetched under the run's lock, which the
    // other process waits for and then finds every block present).
    let requests: u64 = objects()
        .iter()
        .map(|(_, b)| (b.len() as u64).div_ceil(8 << 20))
        .sum();
    assert_eq!(gets, requests, "GETs of both processes together");
    // A third reader on the same tier needs no GET at all.
    assert_eq!(read_all(&endpoint, &url, shared.path()), 0);
}

#[test]
fn threads_reading_one_block_fetch_it_once() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (store, prefix, url) = s3_store(&endpoint, "t");
    let dir = tempfile::tempdir().unwrap();
    let mut config = small_config(dir.path(), 1 << 30);
    config.prefetch_blocks = 0;
    let (tier, faults) = faulty_tier(store, prefix, &url, config);
    let bytes = sample(500_000, 7);
    tier.put_bytes("x", bytes.clone()).unwrap();
    let f = tier.open_object("x").unwrap();
    let barrier = Arc::new(Barrier::new(8));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (f, barrier, bytes) = (f.clone(), Arc::clone(&barrier), &bytes);
            s.spawn(move || {
                barrier.wait();
                let mut buf = vec![0u8; 1000];
                f.read_at(200_000, &mut buf).unwrap();
                assert_eq!(buf, bytes[200_000..201_000]);
            });
        }
    });
    assert_eq!(
        faults.gets.load(Ordering::SeqCst),
        1,
        "eight readers, one block, one GET"
    );
    let mut got = vec![0u8; bytes.len()];
    f.file()
        .unwrap()
        .read_exact_at(&mut got[..1000], 200_000)
        .unwrap();
}

#[test]
fn two_writers_racing_for_one_commit_name_one_wins() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let (_, _, url) = s3_store(&endpoint, "commits");
    let dir = tempfile::tempdir().unwrap();
    let tiers: Vec<RemoteTier> = (0..2)
        .map(|_| common::s3_tier(&endpoint, &url, small_config(dir.path(), 1 << 30)))
        .collect();
    for round in 0..20 {
        let name = format!("index/commit_{round:06}.json");
        let barrier = Barrier::new(2);
        let results: Vec<Result<(), Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = tiers
                .iter()
                .enumerate()
                .map(|(w, tier)| {
                    let (name, barrier) = (&name, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        tier.commit(name, format!("{{\"writer\":{w}}}"))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let winners: Vec<usize> = (0..2).filter(|&w| results[w].is_ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let loser = 1 - winners[0];
        assert!(
            matches!(results[loser], Err(Error::CommitTaken { .. })),
            "{results:?}"
        );
        let record = tiers[0].read_remote(&name).unwrap();
        assert_eq!(
            &record[..],
            format!("{{\"writer\":{}}}", winners[0]).as_bytes()
        );
    }
}
