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
