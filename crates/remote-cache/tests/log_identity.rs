//! A working directory belongs to one commit log: when the log at its URL
//! is another one (the prefix wiped and written again, or the same URL on
//! another endpoint), a reader opened again starts over from the bucket's
//! log, a reader already open refuses it ([`Error::OtherLog`], reads
//! included), and `pull` refuses it — never the old log's records. On the
//! S3 test server (`CACHEX_S3_ENDPOINT`) and on `file://`.

mod common;

use std::path::Path;

use common::{keyed, new_bucket_url, s3_endpoint, s3_options, small_tier};
use remote_cache::LOG_OBJECT;
use remote_cache::pull_dir;
use remote_cache::{COMMIT_VERSION, OBJECTS, commit_name};
use remote_cache::{Commit, Error, Location, RemoteDir, SegmentsAt, StoreFiles, work_dir};
use remote_tier::{RemoteTier, build_store};
use segment_store::Options;
use tensor_core::{Tensor, Value};

fn record(i: usize, generation: u16) -> Value {
    Value::from(Tensor::from_vec([4], vec![i as u16 * 10 + generation; 4]).unwrap())
}

/// Where a test's logs live: the S3 test server or a local directory.
enum Backend {
    S3(String),
    File(tempfile::TempDir),
}

impl Backend {
    /// Every backend this machine has: `file://` always, S3 when the test
    /// server is there.
    fn all() -> Vec<Backend> {
        let mut all = vec![Backend::File(tempfile::tempdir().unwrap())];
        match s3_endpoint() {
            Some(e) => all.push(Backend::S3(e)),
            None => assert!(
                std::env::var_os("CI").is_none(),
                "CACHEX_S3_ENDPOINT is not set under CI"
            ),
        }
        all
    }

    fn url(&self, prefix: &str) -> String {
        match self {
            Backend::S3(endpoint) => new_bucket_url(endpoint, prefix),
            Backend::File(dir) => {
                let d = dir.path().join(prefix);
                std::fs::create_dir_all(&d).unwrap();
                format!("file://{}", d.display())
            }
        }
    }

    fn options(&self) -> Vec<(String, String)> {
        match self {
            Backend::S3(endpoint) => s3_options(endpoint)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            Backend::File(_) => Vec::new(),
        }
    }

    fn location(&self, url: &str, tier_dir: &Path) -> Location {
        Location::remote(url, small_tier(tier_dir, 1 << 30)).with_options(self.options())
    }

    fn tier(&self, url: &str, dir: &Path) -> RemoteTier {
        RemoteTier::open_with_options(url, self.options(), small_tier(dir, 1 << 30)).unwrap()
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::S3(_) => "s3",
            Backend::File(_) => "file",
        }
    }
}

/// Deletes everything the log at `url` holds: the prefix wiped.
fn wipe(backend: &Backend, url: &str) {
    let scratch = tempfile::tempdir().unwrap();
    let tier = backend.tier(url, scratch.path());
    for prefix in [OBJECTS, "commits", "checkpoints"] {
        for o in tier.list(prefix).unwrap() {
            tier.delete(&o.name).unwrap();
        }
    }
    match tier.delete(LOG_OBJECT) {
        Ok(()) | Err(remote_tier::Error::NotFound { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

/// A writer of its own (a fresh tier) publishing `commits` commits: keys
/// `k{c}` of generation `generation`, one a commit, then `extra`.
fn write_log(backend: &Backend, url: &str, commits: usize, generation: u16, extra: &str) {
    let w = tempfile::tempdir().unwrap();
    let writer = SegmentsAt::open(&backend.location(url, w.path()), Options::default()).unwrap();
    for c in 0..commits {
        writer
            .put_batch(&keyed("k", c..c + 1, |i| record(i, generation)))
            .unwrap();
        writer.publish().unwrap();
    }
    if !extra.is_empty() {
        writer
            .put_batch(&[(extra, record(99, generation))])
            .unwrap();
        writer.publish().unwrap();
    }
}

fn read_only() -> Options {
    Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    }
}

fn get(reader: &SegmentsAt, key: &str) -> Option<Value> {
    reader.get_batch(&[key]).unwrap().0.remove(0)
}

fn other_log(e: Error) -> (Option<String>, Option<String>) {
    match e {
        Error::OtherLog { had, found, .. } => (had, found),
        e => panic!("not OtherLog: {e}"),
    }
}

/// The log id a bucket holds.
fn bucket_log(backend: &Backend, url: &str) -> Option<String> {
    let scratch = tempfile::tempdir().unwrap();
    let tier = backend.tier(url, scratch.path());
    let bytes = match tier.read_remote(LOG_OBJECT) {
        Ok(b) => b,
        Err(remote_tier::Error::NotFound { .. }) => return None,
        Err(e) => panic!("{e}"),
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    Some(v["id"].as_str().unwrap().to_string())
}

#[test]
fn a_reader_opened_again_after_the_log_was_rebuilt_starts_over_from_the_new_log() {
    for backend in Backend::all() {
        // The new log with fewer commits than the reader had applied, and
        // with more.
        for new_commits in [1usize, 4] {
            let url = backend.url(&format!("rebuilt{new_commits}"));
            write_log(&backend, &url, 2, 0, "");
            let old = bucket_log(&backend, &url).expect("the first publish names the log");
            let r = tempfile::tempdir().unwrap();
            let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
            assert_eq!(reader.remote().unwrap().seq(), 2);
            assert_eq!(reader.remote().unwrap().log_id(), Some(old.clone()));
            assert!(get(&reader, "k1") == Some(record(1, 0)));
            drop(reader);

            wipe(&backend, &url);
            write_log(&backend, &url, new_commits, 5, "new");
            let new = bucket_log(&backend, &url).unwrap();
            assert_ne!(old, new);

            let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
            let what = format!("{} with {new_commits} new commits", backend.name());
            assert_eq!(reader.remote().unwrap().log_id(), Some(new), "{what}");
            assert_eq!(
                reader.remote().unwrap().seq(),
                new_commits as u64 + 1,
                "{what}"
            );
            assert_eq!(reader.len(), new_commits + 1, "{what}");
            assert!(get(&reader, "k0") == Some(record(0, 5)), "{what}");
            assert!(get(&reader, "new") == Some(record(99, 5)), "{what}");
            if new_commits < 2 {
                assert!(get(&reader, "k1").is_none(), "{what}: the old log's key");
            }
        }
    }
}

#[test]
fn a_reader_left_open_across_a_rebuild_refuses_the_new_log_and_serves_nothing_old() {
    for backend in Backend::all() {
        for new_commits in [1usize, 4] {
            let url = backend.url(&format!("live{new_commits}"));
            write_log(&backend, &url, 2, 0, "");
            let old = bucket_log(&backend, &url).unwrap();
            let r = tempfile::tempdir().unwrap();
            let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
            assert!(get(&reader, "k0") == Some(record(0, 0)));

            wipe(&backend, &url);
            write_log(&backend, &url, new_commits, 5, "new");
            let new = bucket_log(&backend, &url).unwrap();

            let what = format!("{} with {new_commits} new commits", backend.name());
            let e = reader.refresh().unwrap_err();
            assert!(
                e.to_string().contains(&old) && e.to_string().contains(&new),
                "{e}"
            );
            assert_eq!(
                other_log(e),
                (Some(old.clone()), Some(new.clone())),
                "{what}"
            );
            // Reads refuse too, and so does every later refresh.
            let e = reader.get_batch(&["k0"]).unwrap_err();
            assert_eq!(
                other_log(e),
                (Some(old.clone()), Some(new.clone())),
                "{what}"
            );
            assert!(matches!(reader.refresh(), Err(Error::OtherLog { .. })));
            drop(reader);

            // Opened again: the new log, from scratch.
            let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
            assert_eq!(reader.remote().unwrap().log_id(), Some(new), "{what}");
            assert!(get(&reader, "k0") == Some(record(0, 5)), "{what}");
            assert!(get(&reader, "new") == Some(record(99, 5)), "{what}");
        }
    }
}

#[test]
fn a_writer_left_open_across_a_rebuild_publishes_nothing_into_the_new_log() {
    for backend in Backend::all() {
        let url = backend.url("writer");
        let w = tempfile::tempdir().unwrap();
        let writer =
            SegmentsAt::open(&backend.location(&url, w.path()), Options::default()).unwrap();
        writer
            .put_batch(&keyed("k", 0..1, |i| record(i, 0)))
            .unwrap();
        writer.publish().unwrap();
        wipe(&backend, &url);
        write_log(&backend, &url, 1, 5, "");
        writer
            .put_batch(&keyed("k", 1..2, |i| record(i, 0)))
            .unwrap();
        assert!(matches!(writer.publish(), Err(Error::OtherLog { .. })));
        let r = tempfile::tempdir().unwrap();
        let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
        assert_eq!((reader.remote().unwrap().seq(), reader.len()), (1, 1));
        assert!(get(&reader, "k0") == Some(record(0, 5)));
    }
}

/// A tier named `shown` (its working directories are that URL's) whose
/// objects are those at `actual`: the same URL on another endpoint.
fn tier_named(backend: &Backend, shown: &str, actual: &str, dir: &Path) -> RemoteTier {
    let (store, prefix) = build_store(actual, backend.options()).unwrap();
    RemoteTier::with_store(store, prefix, shown, small_tier(dir, 1 << 30)).unwrap()
}

#[test]
fn the_same_url_on_another_endpoint_is_another_log() {
    for backend in Backend::all() {
        let (here, there) = (backend.url("endpoint-a"), backend.url("endpoint-b"));
        write_log(&backend, &here, 2, 0, "");
        write_log(&backend, &there, 3, 5, "new");
        let t = tempfile::tempdir().unwrap();
        let work = work_dir(t.path(), &here, 0);
        let open = |actual: &str| {
            let tier = tier_named(&backend, &here, actual, t.path());
            let remote = RemoteDir::open_unapplied(
                tier,
                &work,
                StoreFiles::for_kind(remote_cache::StoreKind::SegmentStore),
            )
            .unwrap();
            SegmentsAt::with_unapplied(remote, read_only()).unwrap()
        };
        let reader = open(&here);
        assert!(get(&reader, "k1") == Some(record(1, 0)));
        drop(reader);
        // The warm open of a directory that holds commits: the store opens
        // while the next commit is asked for, then starts over.
        let reader = open(&there);
        assert_eq!(
            reader.remote().unwrap().log_id(),
            bucket_log(&backend, &there)
        );
        assert_eq!(reader.len(), 4);
        assert!(get(&reader, "k1") == Some(record(1, 5)));
        assert!(get(&reader, "k2") == Some(record(2, 5)));
        drop(reader);
        // And back.
        let reader = open(&here);
        assert_eq!(reader.len(), 2);
        assert!(get(&reader, "new").is_none());
    }
}

/// A file of its own to pull, published by a store-agnostic directory.
fn publish_file(backend: &Backend, url: &str, name: &str, bytes: &[u8]) {
    let w = tempfile::tempdir().unwrap();
    let tier = backend.tier(url, &w.path().join("tier"));
    let work = w.path().join("work");
    let dir = RemoteDir::open(tier, &work, StoreFiles::PLAIN).unwrap();
    std::fs::write(work.join(name), bytes).unwrap();
    dir.publish().unwrap();
}

#[test]
fn pull_refuses_a_directory_of_another_log() {
    for backend in Backend::all() {
        let url = backend.url("pulled");
        publish_file(&backend, &url, "a.txt", b"old log");
        let old = bucket_log(&backend, &url).unwrap();
        let dest = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let tier = backend.tier(&url, scratch.path());
        assert_eq!(pull_dir(&tier, dest.path()).unwrap().seq, 1);
        drop(tier);

        wipe(&backend, &url);
        publish_file(&backend, &url, "b.txt", b"new log");
        let new = bucket_log(&backend, &url).unwrap();
        let tier = backend.tier(&url, scratch.path());
        let e = pull_dir(&tier, dest.path()).unwrap_err();
        assert_eq!(other_log(e), (Some(old.clone()), Some(new.clone())));
        assert_eq!(
            std::fs::read(dest.path().join("a.txt")).unwrap(),
            b"old log"
        );
        assert!(!dest.path().join("b.txt").exists());

        // The same URL on another endpoint: refused alike.
        let elsewhere = backend.url("pulled-elsewhere");
        publish_file(&backend, &elsewhere, "c.txt", b"another endpoint");
        let dest = tempfile::tempdir().unwrap();
        let tier = backend.tier(&url, scratch.path());
        pull_dir(&tier, dest.path()).unwrap();
        let moved = tier_named(&backend, &url, &elsewhere, scratch.path());
        let e = pull_dir(&moved, dest.path()).unwrap_err();
        assert_eq!(
            other_log(e),
            (Some(new.clone()), bucket_log(&backend, &elsewhere))
        );
        assert!(!dest.path().join("c.txt").exists());
    }
}

#[test]
fn a_reader_whose_url_was_emptied_refuses_it() {
    for backend in Backend::all() {
        let url = backend.url("emptied");
        publish_file(&backend, &url, "a.txt", b"one");
        let id = bucket_log(&backend, &url).expect("named at its first publish");
        let t = tempfile::tempdir().unwrap();
        let work = t.path().join("reader");
        let reader = RemoteDir::open(
            backend.tier(&url, &t.path().join("r")),
            &work,
            StoreFiles::PLAIN,
        )
        .unwrap();
        assert_eq!(reader.log_id(), Some(id.clone()));
        // The prefix wiped, nothing written since: no log there.
        wipe(&backend, &url);
        let e = reader.refresh().unwrap_err();
        assert_eq!(other_log(e), (Some(id), None), "{}", backend.name());
        assert_eq!(std::fs::read(work.join("a.txt")).unwrap(), b"one");
    }
}

#[test]
fn a_commit_naming_another_log_is_refused_even_when_log_json_says_ours() {
    for backend in Backend::all() {
        let url = backend.url("commit-names");
        publish_file(&backend, &url, "a.txt", b"one");
        let t = tempfile::tempdir().unwrap();
        let work = t.path().join("reader");
        let reader =
            RemoteDir::open(backend.tier(&url, t.path()), &work, StoreFiles::PLAIN).unwrap();
        // Commit 2 of another log under this one's log.json (a rebuild
        // seen half-way).
        let tier = backend.tier(&url, &t.path().join("w"));
        let commit = Commit {
            version: COMMIT_VERSION,
            seq: 2,
            writer: "another-log".into(),
            pieces: Vec::new(),
            removed: vec!["a.txt".into()],
            log: "0123456789abcdef0123456789abcdef".into(),
        };
        tier.commit(
            &commit_name(2),
            remote_cache::record::encode_record(&commit).unwrap(),
        )
        .unwrap();
        let e = reader.refresh().unwrap_err();
        assert_eq!(
            other_log(e).1.as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(std::fs::read(work.join("a.txt")).unwrap(), b"one");
    }
}

#[test]
fn a_start_over_cut_short_is_started_over_again() {
    for backend in Backend::all() {
        let url = backend.url("cut-short");
        write_log(&backend, &url, 2, 0, "");
        let r = tempfile::tempdir().unwrap();
        let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
        let work = reader.remote().unwrap().dir().to_path_buf();
        drop(reader);
        wipe(&backend, &url);
        write_log(&backend, &url, 1, 5, "new");
        // Killed after the first step of a start over: the record of
        // applied commits cut, the old log's files and id still there.
        let applied = work.join(".cachex-remote").join("applied.jsonl");
        std::fs::write(&applied, b"").unwrap();
        assert!(work.join(".cachex-remote").join(LOG_OBJECT).exists());
        let reader = SegmentsAt::open(&backend.location(&url, r.path()), read_only()).unwrap();
        assert_eq!(
            reader.remote().unwrap().log_id(),
            bucket_log(&backend, &url)
        );
        assert_eq!(reader.len(), 2, "{}", backend.name());
        assert!(get(&reader, "k0") == Some(record(0, 5)));
        assert!(get(&reader, "k1").is_none());
    }
}
