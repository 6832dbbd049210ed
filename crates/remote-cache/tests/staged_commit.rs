//! The commit protocol of a staged write job (`cachex.ray`'s sinks), at
//! each point a driver can die: before the decision, after it, midway
//! through the renames; a live job is never touched by recovery, and a
//! job on a URL is one commit.

use std::path::{Path, PathBuf};

use remote_cache::staged::{WRITER_BLOCK_HASHES, commit_files, open_tier, upload_files};
use remote_cache::{
    Error, Location, SEGMENT_STAGING, StagedSegments, StagingJob, StoreFiles, StoreKind,
    decide_remote_segments, decide_staged_segments, finish_task, recover_staged_segments,
    recover_staging, task_attempt,
};
use remote_tier::TierConfig;
use segment_store::format::{INDEX_FILE, SCHEMA_FILE, SEGMENTS_DIR};
use segment_store::{Options, SegmentStore};
use tensor_core::{Tensor, Value};

fn record(v: f32) -> Value {
    Value::from(Tensor::from_vec([2], vec![v, -v]).expect("tensor"))
}

fn write_store(dir: &Path, keys: impl IntoIterator<Item = String>, v: f32) {
    let store = SegmentStore::open(
        dir,
        Options {
            flush_every: 3,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let batch: Vec<(String, Value)> = keys.into_iter().map(|k| (k, record(v))).collect();
    let refs: Vec<(&str, Value)> = batch.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    store.put_batch(&refs).unwrap();
    store.flush().unwrap();
}

fn keys(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("k{i}")).collect()
}

/// How many of `keys` a fresh reader of `cache` finds.
fn found(cache: &Path, keys: &[String]) -> usize {
    let reader = SegmentStore::open(
        cache,
        Options {
            read_only: true,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let (_, missing) = reader.get_batch(&refs).unwrap();
    keys.len() - missing.len()
}

/// A cache holding `k0..k10`, and a job whose two tasks staged `k10..k20`.
fn staged_job(tmp: &Path) -> (PathBuf, StagingJob, Vec<PathBuf>) {
    let cache = tmp.join("cache");
    write_store(&cache, keys(0..10), 1.0);
    let job = StagingJob::start(&cache.join(SEGMENT_STAGING), "job").unwrap();
    let mut staged = Vec::new();
    for (task, range) in [(0u64, 10..15), (1, 15..20)] {
        let attempt = task_attempt(job.dir(), task).unwrap();
        write_store(&attempt, keys(range), 2.0);
        staged.push(finish_task(job.dir(), task, &attempt).unwrap());
    }
    (cache, job, staged)
}

#[test]
fn a_job_commits_every_task_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, job, staged) = staged_job(tmp.path());
    let commit = decide_staged_segments(&cache, job.dir(), &staged).unwrap();
    assert_eq!(found(&cache, &keys(0..20)), 10, "decided, not yet visible");
    commit.apply().unwrap();
    job.remove();
    assert_eq!(found(&cache, &keys(0..20)), 20);
    assert!(!cache.join(SEGMENT_STAGING).exists());
    assert!(segment_store::verify(&cache).is_empty());
}

#[test]
fn a_driver_dead_before_the_decision_leaves_the_cache_as_it_was() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, job, _) = staged_job(tmp.path());
    // Recovery leaves a job whose driver lives alone.
    assert!(recover_staged_segments(&cache).unwrap().is_empty());
    assert!(job.dir().exists());
    drop(job);
    assert_eq!(recover_staged_segments(&cache).unwrap(), ["job: removed"]);
    assert!(!cache.join(SEGMENT_STAGING).exists());
    assert_eq!(found(&cache, &keys(0..20)), 10);
    assert!(segment_store::verify(&cache).is_empty());
}

#[test]
fn a_driver_dead_after_the_decision_is_rolled_forward() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, job, staged) = staged_job(tmp.path());
    drop(decide_staged_segments(&cache, job.dir(), &staged).unwrap());
    drop(job);
    assert_eq!(found(&cache, &keys(0..20)), 10);
    assert_eq!(
        recover_staged_segments(&cache).unwrap(),
        ["job: commit rolled forward"]
    );
    assert_eq!(found(&cache, &keys(0..20)), 20);
    assert!(segment_store::verify(&cache).is_empty());
}

#[test]
fn a_driver_dead_midway_through_the_renames_is_rolled_forward() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, job, staged) = staged_job(tmp.path());
    let commit = decide_staged_segments(&cache, job.dir(), &staged).unwrap();
    let renames = commit.decision().unwrap().renames().to_vec();
    assert!(renames.len() > 2);
    // The first segment moved, then the crash: no log names it yet.
    std::fs::rename(&renames[0].0, &renames[0].1).unwrap();
    drop(commit);
    drop(job);
    assert_eq!(found(&cache, &keys(0..20)), 10);
    let problems = segment_store::verify(&cache);
    assert!(
        !problems.is_empty() && problems.iter().all(|p| p.path == renames[0].1),
        "{problems:?}"
    );
    assert_eq!(
        recover_staged_segments(&cache).unwrap(),
        ["job: commit rolled forward"]
    );
    assert_eq!(found(&cache, &keys(0..20)), 20);
    assert!(segment_store::verify(&cache).is_empty());
    // The cache takes the next job as if nothing had happened.
    let job = StagingJob::start(&cache.join(SEGMENT_STAGING), "next").unwrap();
    let attempt = task_attempt(job.dir(), 0).unwrap();
    write_store(&attempt, keys(20..25), 3.0);
    let staged = vec![finish_task(job.dir(), 0, &attempt).unwrap()];
    decide_staged_segments(&cache, job.dir(), &staged)
        .unwrap()
        .apply()
        .unwrap();
    job.remove();
    assert_eq!(found(&cache, &keys(0..25)), 25);
}

#[test]
fn a_job_of_another_schema_or_a_held_cache_commits_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let (cache, job, mut staged) = staged_job(tmp.path());
    let other = task_attempt(job.dir(), 2).unwrap();
    let store = SegmentStore::open(&other, Options::default()).unwrap();
    store
        .put_batch(&[("x", Value::blob(b"bytes".to_vec()))])
        .unwrap();
    drop(store);
    staged.push(finish_task(job.dir(), 2, &other).unwrap());
    let err = decide_staged_segments(&cache, job.dir(), &staged).unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Segment(segment_store::Error::SchemaMismatch { .. })
        ),
        "{err:?}"
    );
    staged.pop();

    let single = SegmentStore::open(&cache, Options::default()).unwrap();
    let err = decide_staged_segments(&cache, job.dir(), &staged).unwrap_err();
    assert!(
        matches!(&err, Error::Segment(segment_store::Error::Locked { .. })),
        "{err:?}"
    );
    assert!(recover_staged_segments(&cache).is_err());
    drop(single);
    drop(job);
    assert_eq!(recover_staged_segments(&cache).unwrap(), ["job: removed"]);
    assert_eq!(found(&cache, &keys(0..20)), 10);
}

#[test]
fn a_damaged_commit_record_is_an_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    let job = StagingJob::start(&staging, "job").unwrap();
    std::fs::write(job.dir().join(remote_cache::COMMIT_RECORD), b"{not json").unwrap();
    drop(job);
    let err = recover_staging(&staging).unwrap_err();
    assert!(err.to_string().contains("commit.json"), "{err}");
}

#[test]
fn a_job_on_a_url_is_one_commit_decided_again_when_its_number_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let url = format!("file://{}", tmp.path().join("bucket").display());
    let tier = open_tier(&Location::remote(
        &url,
        TierConfig::new(tmp.path().join("tier"), 1 << 30),
    ))
    .unwrap();
    let segments = StoreFiles::for_kind(StoreKind::SegmentStore);
    let mut tasks = Vec::new();
    for (task, range) in [(0u64, 0..7), (1, 7..12)] {
        let dir = tmp.path().join(format!("task{task}"));
        write_store(&dir, keys(range), 1.0);
        let files: Vec<(String, PathBuf)> = std::fs::read_dir(dir.join(SEGMENTS_DIR))
            .unwrap()
            .map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                (
                    format!("{SEGMENTS_DIR}/{name}"),
                    dir.join(SEGMENTS_DIR).join(&name),
                )
            })
            .collect();
        let refs: Vec<(String, &Path)> = files
            .iter()
            .map(|(r, p)| (r.clone(), p.as_path()))
            .collect();
        tasks.push(StagedSegments {
            task,
            schema: std::fs::read(dir.join(SCHEMA_FILE)).unwrap(),
            log: std::fs::read(dir.join(INDEX_FILE)).unwrap(),
            pieces: upload_files(&tier, segments, &refs, WRITER_BLOCK_HASHES).unwrap(),
        });
    }
    let (seq, pieces) = decide_remote_segments(&tier, &tasks).unwrap();
    assert_eq!(seq, 0);
    assert_eq!(pieces.last().unwrap().path, "writers/writer-4095.log");
    assert_eq!(pieces.iter().filter(|p| p.path == SCHEMA_FILE).count(), 1);
    // Another writer takes number 1 first: the job decides again.
    let other = upload_files(
        &tier,
        StoreFiles::PLAIN,
        &[(
            "x".into(),
            tmp.path().join("task0").join(SCHEMA_FILE).as_path(),
        )],
        WRITER_BLOCK_HASHES,
    )
    .unwrap();
    assert_eq!(commit_files(&tier, 0, other, vec![]).unwrap(), Some(1));
    assert_eq!(commit_files(&tier, seq, pieces, vec![]).unwrap(), None);
    let (seq, pieces) = decide_remote_segments(&tier, &tasks).unwrap();
    assert_eq!(commit_files(&tier, seq, pieces, vec![]).unwrap(), Some(2));

    let reader = remote_cache::SegmentsAt::open(
        &Location::remote(&url, TierConfig::new(tmp.path().join("reader"), 1 << 30)),
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap();
    assert_eq!(reader.len(), 12);
    let all = keys(0..12);
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    assert!(reader.get_batch(&refs).unwrap().1.is_empty());

    // A task whose log names a segment it did not upload commits nothing.
    let mut broken = tasks.clone();
    broken[1].pieces.pop();
    let err = decide_remote_segments(&tier, &broken).unwrap_err();
    assert!(err.to_string().contains("did not upload"), "{err}");
}
