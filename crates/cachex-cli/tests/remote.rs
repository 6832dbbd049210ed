//! `cachex push`, `pull`, `gc` and `du` against the S3 test
//! server that `scripts/test` starts (CACHEX_S3_ENDPOINT), as real
//! processes.

use std::path::Path;
use std::process::{Command, Output};
use tensor_core::Value;

use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

/// The S3 test server, or `None` (said on stderr) outside CI.
fn s3_endpoint() -> Option<String> {
    test_support::s3::endpoint()
}

/// A fresh bucket (the test server takes an unsigned `PUT /<bucket>`).
fn new_bucket(endpoint: &str) -> String {
    test_support::s3::new_bucket(endpoint, "cli")
}

fn cachex(endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachex"))
        .args(args)
        .env("AWS_ENDPOINT", endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "cachex-test")
        .env("AWS_SECRET_ACCESS_KEY", "cachex-test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("spawn cachex")
}

fn ok(endpoint: &str, args: &[&str]) -> String {
    let out = cachex(endpoint, args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "cachex {args:?} failed: {}\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn push_then_pull_through_s3_gives_a_sound_cache() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = format!("s3://{}/caches/features", new_bucket(&endpoint));
    let local = tempfile::tempdir().unwrap();
    let store = SegmentStore::open(local.path(), Options::default()).unwrap();
    for batch in 0..4 {
        let items: Vec<(String, Value)> = (0..20)
            .map(|i| {
                let n = batch * 20 + i;
                let t = Tensor::from_vec([4], vec![n as f32; 4]).unwrap();
                (format!("k{n}"), Value::from(t))
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
    drop(store);

    let text = ok(&endpoint, &["push", p(local.path()), &url]);
    assert!(text.contains("as commit 1"), "{text}");
    let dest = tempfile::tempdir().unwrap();
    let pulled = dest.path().join("features");
    let text = ok(&endpoint, &["pull", &url, p(&pulled)]);
    assert!(text.contains("pulled commit 1"), "{text}");
    let text = ok(&endpoint, &["verify", p(&pulled)]);
    assert!(text.contains("sound"), "{text}");
    let text = ok(&endpoint, &["get", p(&pulled), "k77", "--json"]);
    assert!(text.contains("77"), "{text}");
    // Pulling again finds everything right and writes nothing.
    let text = ok(&endpoint, &["pull", &url, p(&pulled)]);
    assert!(
        text.contains("0 commits and 0 checkpoints applied, 0 files written"),
        "{text}"
    );
    // Pushing again with nothing changed publishes nothing.
    let text = ok(&endpoint, &["push", p(local.path()), &url]);
    assert!(text.contains("nothing pushed"), "{text}");

    // Nothing published at another prefix: a problem (exit 1), named.
    let elsewhere = dest.path().join("elsewhere");
    let out = cachex(&endpoint, &["pull", &format!("{url}-none"), p(&elsewhere)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing published"));
    // A directory pulled from one URL does not take another's commits.
    let out = cachex(&endpoint, &["pull", &format!("{url}-none"), p(&pulled)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds a pull of"));
    // A URL no store opens: a usage error (exit 2).
    let out = cachex(&endpoint, &["push", p(local.path()), "ftp://host/x"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn inspect_verify_and_get_read_a_cache_at_its_url() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let bucket = new_bucket(&endpoint);
    let url = format!("s3://{bucket}/live/features");
    // A writer publishes through remote-cache (a commit log).
    let work = tempfile::tempdir().unwrap();
    let location =
        remote_cache::Location::remote(&url, remote_tier::TierConfig::new(work.path(), 1 << 30))
            .with_options([
                ("aws_endpoint", endpoint.as_str()),
                ("aws_allow_http", "true"),
                ("aws_access_key_id", "cachex-test"),
                ("aws_secret_access_key", "cachex-test"),
                ("aws_region", "us-east-1"),
            ]);
    let store = remote_cache::SegmentsAt::open(&location, Options::default()).unwrap();
    let items: Vec<(String, Value)> = (0..30)
        .map(|n| {
            let t = Tensor::from_vec([4], vec![n as f32; 4]).unwrap();
            (format!("k{n}"), Value::from(t))
        })
        .collect();
    store.put_batch(&items).unwrap();
    assert_eq!(store.publish().unwrap().seq, Some(1));

    let text = ok(&endpoint, &["inspect", &url, "--json"]);
    assert!(text.contains("segment-store"), "{text}");
    let text = ok(&endpoint, &["verify", &url]);
    assert!(text.contains("sound"), "{text}");
    let text = ok(&endpoint, &["get", &url, "k17", "--json"]);
    assert!(text.contains("17"), "{text}");
    let out = cachex(&endpoint, &["get", &url, "nope"]);
    assert_eq!(out.status.code(), Some(1));

    // A push snapshot reads the same way.
    let snap = format!("s3://{bucket}/snap");
    ok(&endpoint, &["push", p(store.store().dir()), &snap]);
    let text = ok(&endpoint, &["get", &snap, "k29", "--json"]);
    assert!(text.contains("29"), "{text}");
    // Nothing published at a URL: a problem, named.
    let out = cachex(&endpoint, &["inspect", &format!("s3://{bucket}/none")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing published"));
}

fn segment_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn put_rounds(dir: &Path, rounds: usize) {
    let store = SegmentStore::open(dir, Options::default()).unwrap();
    for round in 0..rounds {
        let items: Vec<(String, Value)> = (0..40)
            .map(|n| {
                let t = Tensor::from_vec([256], vec![(n + round) as f32; 256]).unwrap();
                (format!("k{n}"), Value::from(t))
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
}

#[test]
fn a_compacted_cache_pushed_again_removes_its_old_segments_and_gc_frees_them() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = format!("s3://{}/pushed", new_bucket(&endpoint));
    let local = tempfile::tempdir().unwrap();
    put_rounds(local.path(), 3);
    ok(&endpoint, &["push", p(local.path()), &url]);
    let dest = tempfile::tempdir().unwrap();
    ok(&endpoint, &["pull", &url, p(dest.path())]);
    let old = segment_names(dest.path());

    let text = ok(&endpoint, &["compact", p(local.path())]);
    assert!(text.contains("compacted"), "{text}");
    let text = ok(&endpoint, &["push", p(local.path()), &url]);
    assert!(text.contains("as commit 2"), "{text}");
    assert!(text.contains(&format!("{} removed", old.len())), "{text}");
    let text = ok(&endpoint, &["pull", &url, p(dest.path())]);
    assert!(text.contains(&format!("{} removed", old.len())), "{text}");
    let now = segment_names(dest.path());
    assert_eq!(now, segment_names(local.path()));
    assert!(old.iter().all(|s| !now.contains(s)), "{old:?} {now:?}");
    let text = ok(&endpoint, &["get", p(dest.path()), "k7", "--json"]);
    assert!(text.contains("9"), "{text}");

    // The listing's times are whole seconds: past them, the first push's
    // commit is out of a window of 0s, and its objects past a grace of 0s.
    std::thread::sleep(std::time::Duration::from_secs(2));

    let du: serde_json::Value =
        serde_json::from_str(&ok(&endpoint, &["du", &url, "--keep", "0s", "--json"])).unwrap();
    assert_eq!(du["seq"], 2, "{du}");
    assert!(du["garbage_bytes"].as_u64().unwrap() > 0, "{du}");
    // The default grace period keeps objects this young.
    let gc: serde_json::Value =
        serde_json::from_str(&ok(&endpoint, &["gc", &url, "--keep", "0s", "--json"])).unwrap();
    assert_eq!(
        (gc["deleted_objects"].as_u64(), gc["checkpoint"].as_u64()),
        (Some(0), Some(2)),
        "{gc}"
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    let gc: serde_json::Value = serde_json::from_str(&ok(
        &endpoint,
        &["gc", &url, "--keep", "0s", "--grace", "0s", "--json"],
    ))
    .unwrap();
    assert!(gc["deleted_objects"].as_u64().unwrap() > 0, "{gc}");
    let du: serde_json::Value =
        serde_json::from_str(&ok(&endpoint, &["du", &url, "--keep", "0s", "--json"])).unwrap();
    assert_eq!(
        (du["garbage_bytes"].as_u64(), du["checkpoints"].as_u64()),
        (Some(0), Some(1)),
        "{du}"
    );
    let text = ok(&endpoint, &["du", &url]);
    assert!(text.contains("garbage          0 objects"), "{text}");

    // A fresh pull starts from the checkpoint and reads right.
    let fresh = tempfile::tempdir().unwrap();
    let text = ok(&endpoint, &["pull", &url, p(fresh.path())]);
    assert!(
        text.contains("0 commits and 1 checkpoints applied"),
        "{text}"
    );
    let text = ok(&endpoint, &["verify", p(fresh.path())]);
    assert!(text.contains("sound"), "{text}");
    let text = ok(&endpoint, &["get", p(fresh.path()), "k39", "--json"]);
    assert!(text.contains("41"), "{text}");
    // Bad durations are usage errors.
    let out = cachex(&endpoint, &["gc", &url, "--keep", "a week"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn push_refuses_a_directory_with_symbolic_links() {
    let bucket = tempfile::tempdir().unwrap();
    let url = format!("file://{}", bucket.path().display());
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("meta.json"), b"{}").unwrap();
    std::os::unix::fs::symlink(
        local.path().join("meta.json"),
        local.path().join("linked.json"),
    )
    .unwrap();
    let out = cachex("", &["push", p(local.path()), &url]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("linked.json is a symbolic link"), "{err}");
    // Without the link, a local URL takes the push and gives it back.
    std::fs::remove_file(local.path().join("linked.json")).unwrap();
    let text = ok("", &["push", p(local.path()), &url]);
    assert!(text.contains("as commit 1"), "{text}");
    let dest = tempfile::tempdir().unwrap();
    ok("", &["pull", &url, p(dest.path())]);
    assert_eq!(std::fs::read(dest.path().join("meta.json")).unwrap(), b"{}");
}

/// Bytes the files under `dir` whose name ends with `suffix` take on disk
/// (sparse files: only the blocks written).
fn allocated(dir: &Path, suffix: &str) -> (usize, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut found = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if entry.file_name().to_string_lossy().ends_with(suffix) {
                found.0 += 1;
                found.1 += meta.blocks() * 512;
            }
        }
    }
    found
}

#[test]
fn get_of_a_key_at_a_url_fetches_its_row_not_the_segments() {
    let Some(endpoint) = s3_endpoint() else {
        return;
    };
    let url = format!("s3://{}/keyed/features", new_bucket(&endpoint));
    let work = tempfile::tempdir().unwrap();
    let location =
        remote_cache::Location::remote(&url, remote_tier::TierConfig::new(work.path(), 1 << 30))
            .with_options(test_support::s3::options(&endpoint));
    let writer = remote_cache::SegmentsAt::open(
        &location,
        Options {
            flush_every: 1000,
            ..Options::default()
        },
    )
    .unwrap();
    // Three segments of 1,000 f32[512] records: 2 MB each.
    let items: Vec<(String, Value)> = (0..3000)
        .map(|n| {
            let t = Tensor::from_vec([512], vec![n as f32; 512]).unwrap();
            (format!("sample_{n}"), Value::from(t))
        })
        .collect();
    writer.put_batch(&items).unwrap();
    assert_eq!(writer.publish().unwrap().seq, Some(1));

    let tier = tempfile::tempdir().unwrap();
    let get = |key: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cachex"))
            .args(["get", &url, key, "--json"])
            .env("CACHEX_TIER_DIR", tier.path())
            .env("AWS_ENDPOINT", &endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "cachex-test")
            .env("AWS_SECRET_ACCESS_KEY", "cachex-test")
            .env("AWS_REGION", "us-east-1")
            .output()
            .expect("spawn cachex");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "cachex get {key}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let text = get("sample_1234");
    assert!(text.contains("1234"), "{text}");
    // The segments stay sparse in the tier: of 6 MB, the blocks of one
    // row (and of one segment's footer and batch metadata).
    let (files, bytes) = allocated(tier.path(), ".sparse");
    assert_eq!(files, 3, "one sparse copy per segment");
    assert!(
        bytes <= 64 << 10,
        "{bytes} bytes of segments fetched for one key"
    );
    // A second call reads the same working directory and tier.
    let text = get("sample_2999");
    assert!(text.contains("2999"), "{text}");
    let (_, bytes) = allocated(tier.path(), ".sparse");
    assert!(
        bytes <= 2 * (64 << 10),
        "{bytes} bytes of segments for two keys"
    );
}
