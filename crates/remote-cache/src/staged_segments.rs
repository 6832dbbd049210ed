//! The commit of a segment-store write job (`cachex.ray.SegmentSink`):
//! many write tasks, each a single-writer store of its own, published as
//! *one* multi-writer of the cache, all at once.
//!
//! On a local cache each task's store is staged in the job's directory
//! ([`StagingJob`](crate::StagingJob)) and [`decide_staged_segments`]
//! decides the commit (its documentation gives the steps and what a crash
//! at each leaves); [`SegmentCommit::apply`] makes it visible with one
//! rename, and [`recover_staged_segments`] finishes or removes the job of
//! a driver that died.
//!
//! On a URL each task uploads its segments as objects no commit names
//! ([`upload_files`]) and hands its pieces, index log and schema to the
//! driver, which decides steps 1-3 against the log's last commit
//! ([`decide_remote_segments`]: the writer log and schema uploaded the
//! same way, each segment's piece renamed) and publishes them as one
//! commit ([`commit_files`](crate::staged::commit_files)).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use durable_fs::FileLock;
use remote_tier::RemoteTier;
use segment_store::format::{
    INDEX_FILE, SCHEMA_FILE, SEGMENTS_DIR, WRITERS_DIR, parse_segment_name, segment_name,
    segment_path, writer_log_name,
};
use segment_store::{
    StagedLog, adopt_staged, claim_free_writer, free_writer, last_segment_id, last_segment_id_of,
    lock_as_multi_writer,
};

use crate::commit::Piece;
use crate::staged::{WRITER_BLOCK_HASHES, read_file, upload_files};
use crate::staging::{Decision, recover_staging};
use crate::{Error, LogState, Result, StoreFiles, StoreKind};

/// The staging directory of a segment store's write jobs, in the cache.
pub const SEGMENT_STAGING: &str = ".staging";

/// A segment job's commit, decided (steps 1-4 of
/// [`decide_staged_segments`]), holding the cache's
/// shared lock and its writer's lock until it is applied or dropped.
#[derive(Debug)]
pub struct SegmentCommit {
    decision: Option<Decision>,
    _writer: Option<FileLock>,
    _cache: FileLock,
}

impl SegmentCommit {
    /// The decided renames (`None`: no task staged a segment).
    pub fn decision(&self) -> Option<&Decision> {
        self.decision.as_ref()
    }

    /// Applies the renames (steps 5-6), then lets go of the locks.
    pub fn apply(self) -> Result<()> {
        match &self.decision {
            Some(d) => d.apply(),
            None => Ok(()),
        }
    }
}

/// Decides the commit of the stores `staged` (the task directories of
/// the job at `job_dir`, in task order) into the segment store at `cache`
/// (steps 1-4 below). With no staged store, only takes the cache's shared
/// lock.
///
/// A single writer or a compaction holding the cache, or every writer id
/// in use, is a locked error; schemas that differ are
/// [`segment_store::Error::SchemaMismatch`]. Nothing is committed then.
///
/// The protocol (`<cache>/.staging/<job>/task-NNNNNN/` holds each task's
/// store). This call, under the cache's lock held shared as every
/// multi-writer holds it (a single writer or a compaction cannot run
/// meanwhile):
///
/// 1. checks the tasks' `schema.json` against each other and the cache's;
/// 2. claims a multi-writer id `W` with no log in the cache (from 4095
///    down) and gives the staged segments new ids in `W`'s residue class
///    above every segment id in the cache
///    ([`segment_store::adopt_staged`]), so the commit's records win over
///    older ones of the same keys;
/// 3. writes `W`'s index log (every staged group, renumbered) into the
///    job's directory, durable, and, for a cache that has no `schema.json`
///    yet, the tasks' one;
/// 4. writes the commit record (the renames of steps 5-6), durable —
///    **the commit is decided** — and an empty log of `W` into the cache,
///    which makes readers of a cache no multi-writer wrote yet ignore
///    segments no log names.
///
/// [`SegmentCommit::apply`] then
///
/// 5. renames each staged segment into `segments/` under its new id: no
///    log names them yet, so readers ignore them;
/// 6. renames the log to `writers/writer-W.log` — **the commit point**:
///    one rename makes every segment of the job visible at once.
///
/// A crash before step 4 leaves the cache as it was, and
/// [`recover_staged_segments`] deletes the job; a crash after it leaves
/// the cache as it was for every reader until that recovery replays steps
/// 5-6. (A *single* writer opened on the cache between a crash in step 5
/// and that recovery adopts the segments already moved, as it adopts any
/// segment newer than every log: recover before reopening such a cache
/// with a single writer.)
pub fn decide_staged_segments(
    cache: &Path,
    job_dir: &Path,
    staged: &[PathBuf],
) -> Result<SegmentCommit> {
    let cache_lock = lock_as_multi_writer(cache)?;
    if staged.is_empty() {
        return Ok(SegmentCommit {
            decision: None,
            _writer: None,
            _cache: cache_lock,
        });
    }
    let mut schemas = Vec::with_capacity(staged.len());
    for dir in staged {
        let path = dir.join(SCHEMA_FILE);
        let text = std::fs::read(&path).map_err(Error::io("read", &path))?;
        schemas.push((path.display().to_string(), text));
    }
    let schema = one_schema(&schemas)?;
    let current = cache.join(SCHEMA_FILE);
    let has_schema = current.exists();
    if has_schema {
        let text = std::fs::read(&current).map_err(Error::io("read", &current))?;
        check_cache_schema(&current.display().to_string(), &text, schema)?;
    }
    let logs = staged
        .iter()
        .map(|d| StagedLog::read(&d.join(INDEX_FILE)))
        .collect::<segment_store::Result<Vec<_>>>()?;
    let (writer, writer_lock) = claim_free_writer(cache)?;
    let adoption = adopt_staged(&logs, writer, last_segment_id(cache)?)?;
    let staged_log = job_dir.join(writer_log_name(writer));
    durable_fs::write_atomic(&staged_log, &adoption.log)?;
    let mut renames: Vec<(PathBuf, PathBuf)> = adoption
        .segments
        .iter()
        .map(|s| {
            (
                segment_path(&staged[s.log], s.staged_id),
                segment_path(cache, s.id),
            )
        })
        .collect();
    renames.push((
        staged_log,
        cache.join(WRITERS_DIR).join(writer_log_name(writer)),
    ));
    if !has_schema {
        durable_fs::write_atomic(&current, schema)?;
    }
    let decision = Decision::record(job_dir, renames)?;
    // Readers of a cache no multi-writer wrote yet index every segment
    // newer than its log, those of step 5 included; with a writer log
    // there (empty until step 6 replaces it) they ignore every segment no
    // log names, so a crash midway shows nothing of the job.
    let empty = adopt_staged(&[], writer, None)?;
    let log_path = cache.join(WRITERS_DIR).join(writer_log_name(writer));
    durable_fs::write_atomic(&log_path, &empty.log)?;
    Ok(SegmentCommit {
        decision: Some(decision),
        _writer: Some(writer_lock),
        _cache: cache_lock,
    })
}

/// Finishes the decided commits and removes the staging of the dead write
/// jobs of the segment store at `cache` (see
/// [`recover_staging`](crate::recover_staging)), under the cache's lock
/// held shared; one line per job.
pub fn recover_staged_segments(cache: &Path) -> Result<Vec<String>> {
    let _lock = lock_as_multi_writer(cache)?;
    recover_staging(&cache.join(SEGMENT_STAGING))
}

/// What one write task of a segment job on a URL staged: its store's
/// schema and index log, and the pieces of the segments it uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedSegments {
    /// The write task's number (its order in the commit).
    pub task: u64,
    /// Its store's `schema.json`.
    pub schema: Vec<u8>,
    /// Its store's `segment-index.log`.
    pub log: Vec<u8>,
    /// Its segments, from [`upload_files`] (`segments/segment_NNNNNN.arrow`).
    pub pieces: Vec<Piece>,
}

/// Decides the commit of `tasks` against the last commit of the log at
/// `tier`: checks the schemas, takes a writer id with no log there,
/// renumbers the staged segments above every segment there, uploads the
/// writer log (and `schema.json` for a new cache) as objects, and returns
/// the state's commit number with the pieces to publish after it
/// (segments first, the log last) with
/// [`commit_files`](crate::staged::commit_files). When that number is
/// taken meanwhile, decide again.
pub fn decide_remote_segments(
    tier: &RemoteTier,
    tasks: &[StagedSegments],
) -> Result<(u64, Vec<Piece>)> {
    let mut tasks: Vec<&StagedSegments> = tasks.iter().collect();
    tasks.sort_by_key(|t| t.task);
    let schemas: Vec<(String, Vec<u8>)> = tasks
        .iter()
        .map(|t| (format!("write task {}'s schema", t.task), t.schema.clone()))
        .collect();
    let schema = one_schema(&schemas)?;
    let logs = tasks
        .iter()
        .map(|t| StagedLog::parse(&t.log, format!("write task {}'s index log", t.task)))
        .collect::<segment_store::Result<Vec<_>>>()?;
    let mut uploaded: HashMap<(u64, u32), &Piece> = HashMap::new();
    for t in &tasks {
        for p in &t.pieces {
            let name = p.path.rsplit('/').next().unwrap_or_default();
            if let Some(id) = parse_segment_name(name) {
                uploaded.insert((t.task, id), p);
            }
        }
    }
    for (t, log) in tasks.iter().zip(&logs) {
        if let Some(id) = log
            .segment_ids()
            .find(|id| !uploaded.contains_key(&(t.task, *id)))
        {
            return Err(Error::Corrupt {
                url: tier.url().to_string(),
                name: format!("write task {}", t.task),
                problem: format!(
                    "its index log names segment {id}, which it did not upload; nothing was \
                     committed"
                ),
            });
        }
    }

    let state = LogState::read(tier)?;
    let has_schema = match state.files.get(SCHEMA_FILE) {
        Some(pieces) => {
            let current = read_file(tier, SCHEMA_FILE, pieces)?;
            check_cache_schema(SCHEMA_FILE, &current, schema)?;
            true
        }
        None => false,
    };
    let writer = free_writer(|w| {
        state
            .files
            .contains_key(&format!("{WRITERS_DIR}/{}", writer_log_name(w)))
    })
    .ok_or_else(|| segment_store::Error::Locked {
        path: PathBuf::from(format!("{}/{WRITERS_DIR}", tier.url())),
    })?;
    let above = last_segment_id_of(state.files.keys().map(String::as_str));
    let adoption = adopt_staged(&logs, writer, above)?;
    let mut pieces: Vec<Piece> = adoption
        .segments
        .iter()
        .map(|s| {
            let mut piece = uploaded[&(tasks[s.log].task, s.staged_id)].clone();
            piece.path = format!("{SEGMENTS_DIR}/{}", segment_name(s.id));
            piece
        })
        .collect();
    let mut small: Vec<(String, &[u8])> = Vec::new();
    if !has_schema {
        small.push((SCHEMA_FILE.to_string(), schema));
    }
    // The log last: readers apply pieces in order, segments first.
    small.push((
        format!("{WRITERS_DIR}/{}", writer_log_name(writer)),
        &adoption.log,
    ));
    pieces.extend(upload_bytes(tier, &small)?);
    Ok((state.seq, pieces))
}

/// Uploads `(path in the cache, bytes)` as objects (no commit), through
/// temporary files of this process.
fn upload_bytes(tier: &RemoteTier, files: &[(String, &[u8])]) -> Result<Vec<Piece>> {
    let scratch = std::env::temp_dir();
    let temps: Vec<PathBuf> = files
        .iter()
        .map(|_| durable_fs::unique_temp_path(&scratch, "cachex-ray-commit"))
        .collect();
    let result = (|| {
        for ((_, bytes), tmp) in files.iter().zip(&temps) {
            std::fs::write(tmp, bytes).map_err(Error::io("write", tmp))?;
        }
        let refs: Vec<(String, &Path)> = files
            .iter()
            .zip(&temps)
            .map(|((rel, _), tmp)| (rel.clone(), tmp.as_path()))
            .collect();
        upload_files(
            tier,
            StoreFiles::for_kind(StoreKind::SegmentStore),
            &refs,
            WRITER_BLOCK_HASHES,
        )
    })();
    for tmp in &temps {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// The schema every write task produced (`schemas`: whose, and its
/// `schema.json`); the first one's bytes.
fn one_schema(schemas: &[(String, Vec<u8>)]) -> Result<&[u8]> {
    let Some((_, first)) = schemas.first() else {
        return Err(
            segment_store::Error::InvalidInput("no write task staged a schema".into()).into(),
        );
    };
    let first_value = parse_schema("the first write task's schema", first)?;
    for (name, text) in schemas {
        if parse_schema(name, text)? != first_value {
            return Err(schema_mismatch(format!(
                "{name}: write tasks produced records of different schemas; nothing was committed"
            )));
        }
    }
    Ok(first)
}

/// Checks the cache's `schema.json` (`name`, `text`) against the job's.
fn check_cache_schema(name: &str, text: &[u8], schema: &[u8]) -> Result<()> {
    if parse_schema(name, text)? != parse_schema("the job's schema", schema)? {
        return Err(schema_mismatch(format!(
            "{name}: the cache's schema differs from the dataset's; nothing was committed"
        )));
    }
    Ok(())
}

fn parse_schema(name: &str, text: &[u8]) -> Result<serde_json::Value> {
    serde_json::from_slice(text).map_err(|e| Error::Corrupt {
        url: name.to_string(),
        name: SCHEMA_FILE.into(),
        problem: format!("not JSON: {e}"),
    })
}

fn schema_mismatch(detail: String) -> Error {
    segment_store::Error::SchemaMismatch {
        key: String::new(),
        field: SCHEMA_FILE.into(),
        detail,
    }
    .into()
}
