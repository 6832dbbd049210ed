//! Shared by the remote-tier integration tests: the S3 test server that
//! `scripts/test` starts, a fresh bucket per test, sample bytes, and a
//! wrapper store that counts and breaks requests.
#![allow(dead_code)]

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetResult, ObjectStore, PutOptions, PutPayload, PutResult};
use remote_tier::{RemoteTier, TierConfig, build_store};
use test_support::intercept::{Intercept, Intercepted};
#[allow(unused_imports)]
pub use test_support::s3::{endpoint as s3_endpoint, options as s3_options};
#[allow(unused_imports)]
pub use test_support::servers::{Backend, Server};

/// Creates a bucket no other test uses and returns its name.
pub fn new_bucket(endpoint: &str) -> String {
    test_support::s3::new_bucket(endpoint, "tier")
}

/// The S3 store of a fresh bucket (and the URL prefix inside it).
pub fn s3_store(endpoint: &str, prefix: &str) -> (Arc<dyn ObjectStore>, ObjectPath, String) {
    let server = Server {
        backend: Backend::S3,
        endpoint: endpoint.to_string(),
    };
    fresh_store(&server, prefix)
}

/// The store of a fresh root on `server` (and the URL prefix inside it).
pub fn fresh_store(server: &Server, prefix: &str) -> (Arc<dyn ObjectStore>, ObjectPath, String) {
    let url = server.new_url("tier", prefix);
    let (store, path) = build_store(&url, server.options())
        .unwrap_or_else(|e| panic!("build the {} store: {e}", server.backend.name()));
    (store, path, url)
}

/// A tier over the S3 URL `url` with a local tier in `dir`.
pub fn s3_tier(endpoint: &str, url: &str, config: TierConfig) -> RemoteTier {
    RemoteTier::open_with_options(url, s3_options(endpoint), config).expect("open the S3 tier")
}

/// A tier over `url` on `server`, its local tier as `config` says.
pub fn tier_on(server: &Server, url: &str, config: TierConfig) -> RemoteTier {
    RemoteTier::open_with_options(url, server.options(), config)
        .unwrap_or_else(|e| panic!("open the {} tier: {e}", server.backend.name()))
}

/// Small blocks so that tests cover many of them without much data.
pub fn small_config(dir: &std::path::Path, budget: u64) -> TierConfig {
    let mut config = TierConfig::new(dir, budget);
    config.block_size = 64 << 10;
    config.whole_file_max = 64 << 10;
    config.prefetch_blocks = 2;
    config.parallelism = 4;
    config.retry.backoff = Duration::from_millis(5);
    config
}

/// `len` bytes that differ from object to object and from block to block.
pub fn sample(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What the faulty store of [`faulty_tier`] does to the next requests.
#[derive(Debug, Default)]
pub struct Faults {
    /// Fail this many of the next GETs (a transient server error).
    pub fail_gets: AtomicU64,
    /// Make this many of the next GETs hang past any timeout.
    pub hang_gets: AtomicU64,
    /// Cut the body of this many of the next GETs short by one byte.
    pub truncate_gets: AtomicU64,
    /// Fail this many of the next conditional puts before they are sent.
    pub fail_creates: AtomicU64,
    /// Perform this many of the next conditional puts, then answer with an
    /// error as if the answer were lost.
    pub lose_put_answers: AtomicU64,
    /// GET requests (not HEAD) that reached the store, ranged or not.
    pub gets: AtomicU64,
    /// Every GET range served, for checks of what was fetched.
    pub ranges: Mutex<Vec<Option<Range<u64>>>>,
}

fn take(counter: &AtomicU64) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn injected(what: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected fault: {what}").into(),
    }
}

/// Counts GETs and injects the faults asked for (shared with the test).
#[async_trait]
impl Intercept for Faults {
    fn name(&self) -> &'static str {
        "FaultyStore"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        // Faults of commits, not of the tier's check that the server
        // honours conditional puts (its probe objects).
        let conditional = matches!(opts.mode, object_store::PutMode::Create)
            && !location.as_ref().contains(remote_tier::PROBE_DIR);
        if conditional && take(&self.fail_creates) {
            return Err(injected("commit refused"));
        }
        let result = inner.put_opts(location, payload, opts).await;
        if conditional && result.is_ok() && take(&self.lose_put_answers) {
            return Err(injected("answer lost after the put"));
        }
        result
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        if options.head {
            return inner.get_opts(location, options).await;
        }
        self.gets.fetch_add(1, Ordering::SeqCst);
        if take(&self.fail_gets) {
            return Err(injected("server error"));
        }
        if take(&self.hang_gets) {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let range = match &options.range {
            Some(object_store::GetRange::Bounded(r)) => Some(r.clone()),
            _ => None,
        };
        self.ranges.lock().unwrap().push(range);
        if !take(&self.truncate_gets) {
            return inner.get_opts(location, options).await;
        }
        let got = inner.get_opts(location, options).await?;
        let meta = got.meta.clone();
        let attributes = got.attributes.clone();
        let range = got.range.clone();
        let mut bytes = got.bytes().await?;
        bytes.truncate(bytes.len().saturating_sub(1));
        let body = futures::stream::once(async move { Ok(bytes) });
        Ok(GetResult {
            payload: object_store::GetResultPayload::Stream(Box::pin(body)),
            meta,
            range,
            attributes,
            extensions: Default::default(),
        })
    }
}

/// A tier over `store` behind [`Faults`]; returns the tier and its faults.
pub fn faulty_tier(
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    url: &str,
    config: TierConfig,
) -> (RemoteTier, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let wrapped = Arc::new(Intercepted::new(store, Arc::clone(&faults)));
    let tier = RemoteTier::with_store(wrapped, prefix, url, config).expect("open the tier");
    (tier, faults)
}

/// Waits for the forked child `pid` and asserts it exited 0; a child
/// still running after a minute hung (on its parent's runtime, say): it is
/// killed and the test fails with `hung`.
pub fn expect_child_ok(pid: libc::pid_t, hung: &str) {
    use std::time::Instant;
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break status;
        }
        if Instant::now() > deadline {
            // SAFETY: our own child, which we then reap.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("{hung}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child read wrong bytes or failed (status {status:#x})"
    );
}

/// Claims record `seq` at `tier`'s URL with a conditional put (as a
/// commit log claims a commit's number): `commits/<seq>.json` holding
/// `body`, read back before it is trusted. Returns the record's name.
pub fn claim_record(tier: &RemoteTier, seq: u64, body: &[u8]) -> remote_tier::Result<String> {
    let name = format!("commits/{seq:020}.json");
    tier.commit(&name, body.to_vec())?;
    Ok(name)
}

/// What a cold reader (`reader`, an empty local tier) must find of the
/// objects `segments/small.arrow` (`small`, fetched whole) and
/// `segments/large.arrow` (`large`, fetched by blocks): their bytes, read
/// by ranges and whole against their hash, and both listed.
pub fn cold_reads_are_right(reader: &RemoteTier, small: &[u8], large: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = reader.open_object("segments/small.arrow").unwrap();
    assert!(f.is_complete() && f.len() == small.len() as u64);
    let mut got = vec![0u8; small.len()];
    f.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert_eq!(got, small);

    let f = reader.open_object("segments/large.arrow").unwrap();
    assert_eq!(f.len(), large.len() as u64);
    assert!(
        !f.is_complete(),
        "a large object is fetched by blocks, on demand"
    );
    for (start, len) in [
        (0usize, 10usize),
        (65_530, 20),
        (999_990, 13),
        (300_000, 200_000),
    ] {
        let mut buf = vec![0u8; len];
        f.read_at(start as u64, &mut buf).unwrap();
        assert_eq!(buf, large[start..start + len], "bytes {start}..+{len}");
    }
    // Only the blocks read (and their prefetch window) are local.
    assert!(reader.local_usage().unwrap() < large.len() as u64);

    let expected = remote_tier::Expected {
        size: Some(large.len() as u64),
        blake3: Some(*blake3::hash(large).as_bytes()),
    };
    let all = reader.fetch("segments/large.arrow", &expected).unwrap();
    assert!(all.is_complete());
    let mut got = vec![0u8; large.len()];
    all.file().unwrap().read_exact_at(&mut got, 0).unwrap();
    assert!(got == large, "large object read back differs");

    let names: Vec<_> = reader
        .list("segments")
        .unwrap()
        .into_iter()
        .map(|o| (o.name, o.size))
        .collect();
    assert_eq!(
        names,
        [
            ("segments/large.arrow".to_string(), large.len() as u64),
            ("segments/small.arrow".to_string(), small.len() as u64)
        ]
    );
}

/// A small xorshift, so the tests need no RNG crate.
pub struct Rng(pub u64);

impl Rng {
    /// The next number below `n` (below 1 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A count a test takes from the environment variable `var` (to run it
/// at a larger size by hand), else `default`.
pub fn env_count(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits for each of `children` (test binaries re-run as children, their
/// stdout piped) to end, within `bound` in all: each must succeed and
/// have printed DONE; one past the bound is ended by its pid, reaped, and
/// fails the test. `who` names a child in the messages.
pub fn wait_children(children: &mut [std::process::Child], bound: Duration, who: &str) {
    use std::io::{BufRead, BufReader};
    let deadline = std::time::Instant::now() + bound;
    for child in children.iter_mut() {
        let out = child.stdout.take().unwrap();
        // Read to the end: a pipe closed early would fail the child.
        let lines: Vec<String> = BufReader::new(out).lines().map_while(|l| l.ok()).collect();
        let done = lines.iter().any(|l| l == "DONE");
        loop {
            match child.try_wait().unwrap() {
                Some(status) => {
                    assert!(status.success() && done, "a {who} failed: {status}");
                    break;
                }
                None if std::time::Instant::now() > deadline => {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    panic!("{who} {} hung", child.id());
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}
