//! Shared by the remote-cache integration tests: the S3 test server that
//! `scripts/test` starts (found through `CACHEX_S3_ENDPOINT`), a fresh
//! bucket per test, and locations on it.
#![allow(dead_code)]

use std::ops::Range;
use std::path::Path;
use std::time::Duration;
use tensor_core::Value;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetResult, MultipartUpload, ObjectStore, PutMultipartOptions, PutOptions,
    PutPayload, PutResult,
};
use remote_cache::Location;
use remote_tier::{RemoteTier, TierConfig};
use test_support::intercept::Intercept;
#[allow(unused_imports)]
pub use test_support::s3::{endpoint as s3_endpoint, options as s3_options};
#[allow(unused_imports)]
pub use test_support::servers::{Backend, Server};

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

/// The location `url` on `server` with a local tier in `tier_dir` (and the
/// working directory inside it).
pub fn location(server: &Server, url: &str, tier_dir: &Path) -> Location {
    Location::remote(url, small_tier(tier_dir, 1 << 30)).with_options(server.options())
}

/// Spawns this test binary as a child writer process that runs only the
/// test `child_test`; that test finds its cache through
/// [`child_writer`]`(env, ..)`. Its stdout is piped to the parent.
pub fn spawn_child_writer(
    child_test: &str,
    env: &str,
    (endpoint, url, dir): (&str, &str, &Path),
    stderr: std::process::Stdio,
) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(env, test_support::s3::child_env(endpoint, url, dir, &[]))
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// In a child spawned by [`spawn_child_writer`] with `env`: the remote
/// segment store it was told to write, as writer `writer_id`. `None` when
/// this process is not that child (the test then does nothing).
pub fn child_writer(env: &str, writer_id: u32) -> Option<remote_cache::SegmentsAt> {
    let fields = test_support::s3::child_fields(env)?;
    let (endpoint, url, dir) = (&*fields[0], &*fields[1], &*fields[2]);
    let options = segment_store::Options {
        writer_id: Some(writer_id),
        ..segment_store::Options::default()
    };
    Some(
        remote_cache::SegmentsAt::open(&s3_location(endpoint, url, Path::new(dir)), options)
            .unwrap(),
    )
}

/// The batch of keys `{prefix}{i}` for `i` in `range`, each with `record(i)`.
pub fn keyed(
    prefix: &str,
    range: Range<usize>,
    record: impl Fn(usize) -> Value,
) -> Vec<(String, Value)> {
    range.map(|i| (format!("{prefix}{i}"), record(i))).collect()
}

/// A finalized memmap-array cache of `rows` rows `row(i)` (an i32[1024],
/// 4 KiB a row, in array `data`) in a fresh directory.
pub fn build_arrays(rows: u64, row: impl Fn(u64) -> Vec<i32>) -> tempfile::TempDir {
    use memmap_array::{NewRow, RowWriter, Schema};
    let built = tempfile::tempdir().unwrap();
    let schema = Schema::builder()
        .array("data", tensor_core::DType::I32, [1024])
        .build()
        .unwrap();
    let mut writer = RowWriter::create_or_resume(built.path(), &schema, "v1").unwrap();
    for i in 0..rows {
        let t = tensor_core::Tensor::from_vec([1024], row(i)).unwrap();
        let source = format!("s{i}");
        writer
            .write(&NewRow::new(&source).array("data", t.view()))
            .unwrap();
    }
    writer.finalize().unwrap();
    built
}

/// Rows `rows` of array `data` of a remote memmap-array cache built by
/// [`build_arrays`] read back as `row(i)`.
pub fn assert_rows(arrays: &remote_cache::ArraysAt, rows: &[u64], row: impl Fn(u64) -> Vec<i32>) {
    for &i in rows {
        let view = arrays.array(i, "data").unwrap().unwrap();
        assert_eq!(view.as_slice::<i32>().unwrap(), &row(i)[..], "row {i}");
    }
}

/// A tier on `url` in `dir` (1 GiB budget, small blocks).
pub fn tier(endpoint: &str, url: &str, dir: &Path) -> RemoteTier {
    RemoteTier::open_with_options(url, s3_options(endpoint), small_tier(dir, 1 << 30)).unwrap()
}

/// Refuses the next `n` conditional puts (commit records), as if the
/// writer died between its uploads and its commit.
#[derive(Debug, Default)]
pub struct RefuseCreates(pub AtomicU64);

#[async_trait]
impl Intercept for RefuseCreates {
    fn name(&self) -> &'static str {
        "RefusingStore"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if matches!(opts.mode, object_store::PutMode::Create)
            && self
                .0
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(object_store::Error::Generic {
                store: "RefusingStore",
                source: "injected fault: commit refused".into(),
            });
        }
        inner.put_opts(location, payload, opts).await
    }
}

/// Every request sent: (`get`, `head`, `list`, `put`), object path.
#[derive(Debug, Default)]
pub struct Requests(Mutex<Vec<(&'static str, String)>>);

/// A request log shared with the store that writes it.
pub type RequestLog = Arc<Requests>;

impl Requests {
    pub fn note(&self, op: &'static str, path: &ObjectPath) {
        self.0.lock().unwrap().push((op, path.to_string()));
    }

    pub fn all(&self) -> Vec<(&'static str, String)> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "RecordingStore"
    }

    async fn put(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.note("put", location);
        inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.note("put", location);
        inner.put_multipart_opts(location, opts).await
    }

    async fn get(
        &self,
        inner: &dyn ObjectStore,
        location: &ObjectPath,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.note(if options.head { "head" } else { "get" }, location);
        inner.get_opts(location, options).await
    }

    fn list(&self, prefix: Option<&ObjectPath>) {
        self.note("list", &prefix.cloned().unwrap_or_default());
    }
}

/// A child process of a test and the lines of its stdout.
pub type ChildLines = (
    std::process::Child,
    std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
);

/// A test's child processes (see [`spawn_ready_child`]); each is killed
/// (by its pid) and waited for if the test ends before they do.
pub struct Children(pub Vec<ChildLines>);

impl Drop for Children {
    fn drop(&mut self) {
        for (child, _) in &mut self.0 {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Children {
    /// One step in lockstep: tells every child `go` and reads each one's
    /// `done <counted>` (`who` and its index name a child that answers
    /// otherwise); the largest count.
    pub fn step(&mut self, who: &str) -> u64 {
        use std::io::Write;
        for (child, _) in &mut self.0 {
            writeln!(child.stdin.as_mut().unwrap(), "go").unwrap();
        }
        let mut most = 0;
        for (r, (_, lines)) in self.0.iter_mut().enumerate() {
            let line = lines.next().unwrap().unwrap();
            let counted: u64 = line
                .strip_prefix("done ")
                .unwrap_or_else(|| panic!("{who} {r}: {line}"))
                .parse()
                .unwrap();
            most = most.max(counted);
        }
        most
    }
}

/// A lockstep child's side of [`Children::step`]: says `READY`, waits
/// for each `go`, answers `done <allocated bytes of the tier>`, and ends
/// when its parent closes its stdin.
pub struct Lockstep {
    stdin: std::io::Lines<std::io::BufReader<std::io::Stdin>>,
    out: std::io::Stdout,
}

impl Lockstep {
    /// Tells the parent this child is ready.
    pub fn ready() -> Lockstep {
        use std::io::{BufRead, Write};
        let mut out = std::io::stdout();
        writeln!(out, "\nREADY").unwrap();
        Lockstep {
            stdin: std::io::BufReader::new(std::io::stdin()).lines(),
            out,
        }
    }

    /// Waits for the parent's next `go`.
    pub fn go(&mut self) {
        assert_eq!(self.stdin.next().unwrap().unwrap(), "go");
    }

    /// Answers a step with what the tier at `tier_dir` counts now.
    pub fn done(&mut self, tier_dir: &Path) {
        use std::io::Write;
        let stats = remote_tier::TierStats::read(tier_dir).unwrap();
        writeln!(self.out, "done {}", stats.allocated).unwrap();
    }

    /// Waits to be told to stop (stdin closing).
    pub fn end(mut self) {
        assert!(self.stdin.next().is_none());
    }
}

/// Spawns this test binary running only the test `child_test`, with
/// `value` in the environment variable `env`, stdin and stdout piped,
/// and waits for it to print `READY` (`who` names it if it does not).
pub fn spawn_ready_child(child_test: &str, env: &str, value: String, who: &str) -> ChildLines {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child_test, "--nocapture", "--test-threads=1"])
        .env(env, value)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l == "READY")),
        "{who} started"
    );
    (child, lines)
}
