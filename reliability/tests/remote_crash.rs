//! The remote path under SIGKILL: a writer publishing to the S3 test
//! server, and a reader applying commits (its open and its refreshes),
//! each killed at a seeded moment, again and again.
//!
//! After every kill: the remote cache is at a commit boundary (a cold
//! reader sees whole batches, one per commit, every batch the writer was
//! told was published and at most the one in flight), the killed process's
//! working directory opens again, and every committed value reads right.
//! `CACHEX_CRASH_CYCLES` sets the cycles of each loop (CI runs a few).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reliability::remote::{
    cold_read, endpoint, location, new_bucket, publish_batch, reader_options, whole_batches,
    writer_options,
};
use remote_cache::SegmentsAt;
use test_support::crash::{child, child_args, cycles, report_commit, report_error};

/// Where a child finds its cache's URL (the server's endpoint comes from
/// `CACHEX_S3_ENDPOINT`, inherited).
const URL_ENV: &str = "CACHEX_REMOTE_URL";

/// Cycles of each loop when `CACHEX_CRASH_CYCLES` is not set.
const CI_CYCLES: usize = 8;

/// Batches a writer child publishes at most (it is killed long before).
const MAX_BATCHES: usize = 200;

/// Batches published once for the reader's cold opens.
const COLD_BATCHES: usize = 8;

/// A kill moment in `from..from + span` ms, spread over the cycles.
fn kill_after(cycle: u64, from: u64, span: u64) -> Duration {
    Duration::from_millis(from + cycle.wrapping_mul(2_654_435_761) % span)
}

/// The children. A writer publishes batch after batch, reporting each
/// once its publish returned; a reader opens (applying every commit) and
/// refreshes in a loop, reporting the commit it is at.
#[test]
fn child_remote() {
    let Some(args) = child_args() else { return };
    let (Ok(endpoint), Ok(url)) = (std::env::var("CACHEX_S3_ENDPOINT"), std::env::var(URL_ENV))
    else {
        return report_error("the child lacks CACHEX_S3_ENDPOINT or its URL");
    };
    let loc = location(&endpoint, &url, &args.dir);
    match args.role.as_str() {
        "writer" => {
            let store = match SegmentsAt::open(&loc, writer_options()) {
                Ok(s) => s,
                Err(e) => return report_error(&e.to_string()),
            };
            for b in 0..MAX_BATCHES {
                match publish_batch(&store, args.seed, b) {
                    Ok(_) => report_commit(&b.to_string()),
                    Err(e) => return report_error(&e.to_string()),
                }
            }
        }
        "reader" => {
            let store = match SegmentsAt::open(&loc, reader_options()) {
                Ok(s) => s,
                Err(e) => return report_error(&e.to_string()),
            };
            report_commit(&store.remote().map_or(0, |r| r.seq()).to_string());
            // Until killed (the parent always kills it).
            for _ in 0..100_000 {
                match store.refresh() {
                    Ok((r, _)) => report_commit(&r.seq.to_string()),
                    Err(e) => return report_error(&e.to_string()),
                }
            }
        }
        other => report_error(&format!("unknown role {other}")),
    }
}

#[test]
fn sigkill_loop_of_a_publishing_writer() {
    let Some(endpoint) = endpoint() else { return };
    let bucket = new_bucket(&endpoint, "kill-writer");
    let n = cycles(CI_CYCLES);
    let (mut in_flight_landed, mut total_committed) = (0, 0);
    for cycle in 0..n as u64 {
        let tmp = tempfile::tempdir().unwrap();
        let url = format!("{bucket}/c{cycle}");
        let tier = tmp.path().join("writer");
        let out = child("child_remote", "writer", &tier, cycle)
            .env(URL_ENV, url.as_str())
            .kill_after(kill_after(cycle, 100, 900))
            .run();
        assert!(out.errors.is_empty(), "cycle {cycle}: {:?}", out.errors);
        let committed = out.committed.len();
        total_committed += committed;
        let at = |what: &str| format!("cycle {cycle} ({committed} batches published): {what}");

        // The remote cache: whole commits, each reported batch, at most
        // the one in flight besides.
        let (seq, batches) = cold_read(&endpoint, &url, &tmp.path().join("r1"), cycle, MAX_BATCHES)
            .unwrap_or_else(|e| panic!("{}", at(&e)));
        assert_eq!(seq, batches as u64, "{}", at("commits and batches differ"));
        assert!(
            batches == committed || batches == committed + 1,
            "{}",
            at(&format!("a reader sees {batches} batches"))
        );
        in_flight_landed += batches - committed;

        // The killed writer's working directory opens, as the writer, with
        // every published batch (and perhaps the one it flushed last).
        let writer = SegmentsAt::open(&location(&endpoint, &url, &tier), writer_options())
            .unwrap_or_else(|e| panic!("{}", at(&format!("the working directory: {e}"))));
        let local = whole_batches(&writer, cycle, MAX_BATCHES)
            .unwrap_or_else(|e| panic!("{}", at(&format!("the working directory: {e}"))));
        assert!(
            local == batches || local == batches + 1,
            "{}",
            at(&format!("the working directory holds {local} batches"))
        );
        // ... and publishes again: what it flushed and a new batch.
        publish_batch(&writer, cycle, local)
            .unwrap_or_else(|e| panic!("{}", at(&format!("publish after the kill: {e}"))));
        drop(writer);
        let (_, after) = cold_read(&endpoint, &url, &tmp.path().join("r2"), cycle, MAX_BATCHES)
            .unwrap_or_else(|e| panic!("{}", at(&e)));
        assert_eq!(after, local + 1, "{}", at("after publishing again"));
    }
    eprintln!(
        "remote writer SIGKILL loop: {n} cycles, {total_committed} publishes reported, \
         {in_flight_landed} kills after a commit landed but before it was reported"
    );
}

/// Publishes batches `from..` of stream `seed` to `url` until `stop`;
/// returns the next batch number.
fn publish_until(store: &SegmentsAt, seed: u64, from: usize, stop: &AtomicBool) -> usize {
    let mut b = from;
    while !stop.load(Ordering::SeqCst) {
        publish_batch(store, seed, b).unwrap_or_else(|e| panic!("publish batch {b}: {e}"));
        b += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    b
}

/// The reader's working directory after its kill: it opens, applies every
/// commit published, and holds exactly `published` exact batches.
fn check_reader_dir(endpoint: &str, url: &str, tier: &Path, seed: u64, published: usize, at: &str) {
    let reader = SegmentsAt::open(&location(endpoint, url, tier), reader_options())
        .unwrap_or_else(|e| panic!("{at}: the working directory does not open: {e}"));
    let batches = whole_batches(&reader, seed, published + 2)
        .unwrap_or_else(|e| panic!("{at}: the working directory: {e}"));
    assert_eq!(batches, published, "{at}: batches after reopening");
    assert_eq!(
        reader.remote().map_or(0, |r| r.seq()),
        published as u64,
        "{at}: commits applied after reopening"
    );
}

#[test]
fn sigkill_loop_of_a_reader_applying_commits() {
    let Some(endpoint) = endpoint() else { return };
    let bucket = new_bucket(&endpoint, "kill-reader");
    let scratch = tempfile::tempdir().unwrap();
    let seed = 77;

    // Cold opens: a fresh working directory applying COLD_BATCHES commits.
    let cold_url = format!("{bucket}/cold");
    let cold_writer = SegmentsAt::open(
        &location(&endpoint, &cold_url, &scratch.path().join("cold-writer")),
        writer_options(),
    )
    .unwrap();
    for b in 0..COLD_BATCHES {
        publish_batch(&cold_writer, seed, b).unwrap();
    }
    drop(cold_writer);

    // Warm opens and refreshes: one working directory, killed again and
    // again, while a writer publishes.
    let warm_url = format!("{bucket}/warm");
    let warm_writer = SegmentsAt::open(
        &location(&endpoint, &warm_url, &scratch.path().join("warm-writer")),
        writer_options(),
    )
    .unwrap();
    publish_batch(&warm_writer, seed, 0).unwrap();
    let mut next = 1;
    let warm_tier = scratch.path().join("warm-reader");

    let n = cycles(CI_CYCLES);
    let mut reports = 0;
    for cycle in 0..n as u64 {
        let at = format!("cycle {cycle}");
        if cycle % 2 == 0 {
            let tmp = tempfile::tempdir().unwrap();
            let tier = tmp.path().join("reader");
            let out = child("child_remote", "reader", &tier, cycle)
                .env(URL_ENV, cold_url.as_str())
                .kill_after(kill_after(cycle, 30, 500))
                .run();
            assert!(out.errors.is_empty(), "{at}: {:?}", out.errors);
            reports += out.committed.len();
            check_reader_dir(&endpoint, &cold_url, &tier, seed, COLD_BATCHES, &at);
        } else {
            let stop = AtomicBool::new(false);
            let from = next;
            let out = std::thread::scope(|s| {
                let writer = s.spawn(|| publish_until(&warm_writer, seed, from, &stop));
                let out = child("child_remote", "reader", &warm_tier, cycle)
                    .env(URL_ENV, warm_url.as_str())
                    .kill_after(kill_after(cycle, 30, 700))
                    .run();
                stop.store(true, Ordering::SeqCst);
                next = writer.join().unwrap();
                out
            });
            assert!(out.errors.is_empty(), "{at}: {:?}", out.errors);
            reports += out.committed.len();
            let seen: Vec<u64> = out
                .committed
                .iter()
                .filter_map(|s| s.parse().ok())
                .collect();
            assert!(
                seen.windows(2).all(|w| w[0] <= w[1]) && seen.iter().all(|&s| s <= next as u64),
                "{at}: the reader reported commits {seen:?} of {next}"
            );
            check_reader_dir(&endpoint, &warm_url, &warm_tier, seed, next, &at);
        }
    }
    eprintln!(
        "remote reader SIGKILL loop: {n} cycles (half cold opens of {COLD_BATCHES} commits, \
         half warm opens and refreshes of one working directory while {next} batches were \
         published), {reports} applied states reported"
    );
}
