//! Shared by the remote-cache integration tests: the S3 test server that
//! `scripts/test` starts (found through `CACHEX_S3_ENDPOINT`), a fresh
//! bucket per test, and locations on it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use remote_cache::Location;
use remote_tier::TierConfig;
pub use test_support::s3::{endpoint as s3_endpoint, options as s3_options};

/// Creates a bucket no other test uses; returns `s3://<bucket>/<prefix>`.
/// The test server accepts unsigned requests, so a bare `PUT /<bucket>` does.
pub fn new_bucket_url(endpoint: &str, prefix: &str) -> String {
    format!(
        "s3://{}/{prefix}",
        test_support::s3::new_bucket(endpoint, "rc")
    )
}

/// Small blocks so that tests cover many of them without much data.
pub fn small_tier(dir: &Path, budget: u64) -> TierConfig {
    let mut config = TierConfig::new(dir, budget);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 1;
    config.parallelism = 4;
    config.retry.backoff = Duration::from_millis(5);
    config
}

/// The S3 location `url` with a local tier in `tier_dir` (and the working
/// directory inside it).
pub fn s3_location(endpoint: &str, url: &str, tier_dir: &Path) -> Location {
    Location::remote(url, small_tier(tier_dir, 1 << 30)).with_options(s3_options(endpoint))
}
