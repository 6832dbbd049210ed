//! Descriptors that do not grow with the segment count: a remote segment
//! store of 100,000 segments (a `file://` bucket) and one of 2,000 (the S3
//! test server) are opened cold, read at random, appended to, refreshed
//! and opened warm again under the soft `RLIMIT_NOFILE` of 1,024 that most
//! distributions set, counting `/proc/self/fd` at every step.
//!
//! `CACHEX_SCALE_SEGMENTS` sets the larger count (default 100,000).

mod common;

use std::path::Path;

use common::{keyed, new_bucket_url, s3_endpoint, s3_options, small_tier};
use remote_cache::{Location, SegmentsAt};
use tensor_core::{Tensor, Value};

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// One test at a time: the descriptors counted are the process's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The soft limit the tests run under.
const SOFT_LIMIT: u64 = 1024;

/// The most descriptors the process may hold at any step: a fixed set
/// (the test harness, the runtime, the tier's few, at most 64 local
/// copies, the store's maps), whatever the number of segments.
const MOST_OPEN: usize = 256;

/// Sets the soft limit on descriptors of this process to [`SOFT_LIMIT`]
/// (the hard limit is kept).
fn limit_descriptors() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit write/read the one struct passed, which
    // lives for the call.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        limit.rlim_cur = SOFT_LIMIT.min(limit.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
    }
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Asserts the process holds few descriptors now, after `step`.
fn check_descriptors(step: &str) {
    let open = open_descriptors();
    eprintln!(
        "{step}: {open} descriptors open ({:?})",
        START.get_or_init(std::time::Instant::now).elapsed()
    );
    assert!(
        open < MOST_OPEN,
        "{step}: {open} descriptors open, the bound is {MOST_OPEN}"
    );
}

fn record(i: usize) -> Value {
    Value::from(Tensor::from_vec([4], vec![i as i32, 1, 2, 3]).unwrap())
}

fn key(i: usize) -> String {
    format!("k{i}")
}

/// A tier in `dir` that keeps everything fetched (budget far above use).
fn location(url: &str, dir: &Path, options: Vec<(&'static str, String)>) -> Location {
    let mut tier = small_tier(dir, 1 << 34);
    tier.prefetch_blocks = 0;
    Location::remote(url, tier).with_options(options)
}

/// Fills `writer` with records `from..to`, one segment each, published
/// in commits of `per_commit` segments.
fn append(writer: &SegmentsAt, from: usize, to: usize, per_commit: usize) {
    let mut at = from;
    while at < to {
        let end = (at + per_commit).min(to);
        writer.put_batch(&keyed("k", at..end, record)).unwrap();
        writer.publish().unwrap();
        at = end;
    }
}

/// Reads `count` keys of `0..n` spread over the whole store, and checks
/// them.
fn read_spread(reader: &SegmentsAt, n: usize, count: usize, seed: usize) {
    let keys: Vec<String> = (0..count)
        .map(|j| key((seed.wrapping_mul(7919) + j * (n / count).max(1) * 13) % n))
        .collect();
    for chunk in keys.chunks(64) {
        let (records, missing) = reader.get_batch(chunk).unwrap();
        assert!(missing.is_empty(), "missing {missing:?}");
        for (k, r) in chunk.iter().zip(records) {
            let i: usize = k[1..].parse().unwrap();
            assert!(r.as_ref() == Some(&record(i)), "{k}");
        }
    }
}

/// The whole run at `n` segments on `url`.
fn run(
    url: &str,
    n: usize,
    per_commit: usize,
    options: Vec<(&'static str, String)>,
    scratch: &Path,
) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    limit_descriptors();
    check_descriptors("start");
    let writer = SegmentsAt::open(
        &location(url, &scratch.join("writer"), options.clone()),
        segment_store::Options {
            flush_every: 1,
            ..segment_store::Options::default()
        },
    )
    .unwrap();
    append(&writer, 0, n, per_commit);
    check_descriptors("written and published");

    let reader_options = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    let reader_at = location(url, &scratch.join("reader"), options.clone());
    let reader = SegmentsAt::open(&reader_at, reader_options.clone()).unwrap();
    assert_eq!(reader.len(), n);
    check_descriptors("cold open");

    read_spread(&reader, n, 128, 1);
    check_descriptors("random reads by ranges");
    // Read whole (the store maps segments): bounded by the store's maps.
    let keys: Vec<String> = (0..32).map(|j| key(j * (n / 32).max(1) + 5)).collect();
    let (records, missing) = reader.store().get_batch(&keys).unwrap();
    assert!(missing.is_empty() && records.iter().all(|r| r.is_some()));
    check_descriptors("reads of whole segments");

    append(&writer, n, n + 2 * per_commit, per_commit);
    let total = n + 2 * per_commit;
    check_descriptors("appended");
    let (log, gained) = reader.refresh().unwrap();
    assert!(log.commits >= 1 && gained > 0);
    assert_eq!(reader.len(), total);
    read_spread(&reader, total, 64, 2);
    check_descriptors("refreshed and read");
    drop(reader);

    // Warm: every segment linked again.
    let reader = SegmentsAt::open(&reader_at, reader_options).unwrap();
    assert_eq!(reader.len(), total);
    read_spread(&reader, total, 64, 3);
    check_descriptors("warm open and read");
}

/// A scratch directory on a memory file system where there is one: the
/// fsyncs of 100,000 segments cost nothing there, the descriptors the
/// same.
fn scratch() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").unwrap(),
        false => tempfile::tempdir().unwrap(),
    }
}

#[test]
fn a_store_of_100_000_segments_on_a_file_url_stays_within_1024_descriptors() {
    let n: usize = std::env::var("CACHEX_SCALE_SEGMENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let dir = scratch();
    let bucket = dir.path().join("bucket");
    std::fs::create_dir_all(&bucket).unwrap();
    let url = format!("file://{}", bucket.display());
    run(&url, n, 5_000, Vec::new(), dir.path());
}

#[test]
fn a_store_of_2_000_segments_on_s3_stays_within_1024_descriptors() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = new_bucket_url(&endpoint, "caches/scale");
    let dir = scratch();
    run(&url, 2_000, 1_200, s3_options(&endpoint), dir.path());
}
