//! The staging area of a write job on a local cache, and its commit
//! record: how `cachex.ray`'s sinks make many write tasks' output visible
//! at once, and how a job whose driver died is finished or removed.
//!
//! ```text
//! <staging>/<job>/job.lock                      held by the driver while the job runs
//! <staging>/<job>/task-000003/                  write task 3's finished output
//! <staging>/<job>/task-000003.attempt-<token>/  an attempt in progress or failed
//! <staging>/<job>/commit.json                   the commit, decided: {"renames": [[src, dst], ...]}
//! ```
//!
//! (`<staging>` is `<cache>/.staging` for a segment store and
//! `<parent>/.<name>.staging` for a page file or a memmap cache.)
//!
//! A write task writes into a fresh attempt directory ([`task_attempt`])
//! and, once its output is durable, renames it to `task-NNNNNN`
//! ([`finish_task`]), replacing what an earlier attempt of the same task
//! left there: a retried task's output is its last attempt's only, and
//! the job commits exactly the task directories its write results name.
//!
//! A commit that takes more than one rename is decided first: its renames
//! are written to `commit.json`, durably ([`Decision::record`]), then
//! applied ([`Decision::apply`]). A job whose `job.lock` no process holds
//! is dead: [`recover_staging`] rolls its commit forward when the record
//! exists (each rename replayed only if its source is still there) and
//! deletes the job's directory otherwise. A commit of one rename (a
//! merged file or directory put in place) needs no record:
//! [`commit_rename`].

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use durable_fs::FileLock;

use crate::{Error, Result};

/// The driver's lock of a job, in the job's directory.
pub const JOB_LOCK: &str = "job.lock";
/// The record of a decided commit, in the job's directory.
pub const COMMIT_RECORD: &str = "commit.json";
/// The largest commit record read back (a job's renames, one per segment).
const MAX_COMMIT_RECORD: u64 = 1 << 30;

/// One write job's staging directory, its lock held by the driver while
/// the job runs (dropping the handle lets go of it).
#[derive(Debug)]
pub struct StagingJob {
    dir: PathBuf,
    _lock: FileLock,
}

impl StagingJob {
    /// Creates job `id`'s directory under `staging` (created if missing)
    /// and takes its lock. The directory is made and locked under a hidden
    /// name, then renamed, so [`recover_staging`] never sees it unlocked.
    pub fn start(staging: &Path, id: &str) -> Result<StagingJob> {
        if id.is_empty() || id.starts_with('.') || id.contains('/') {
            return Err(Error::BadLocation {
                root: staging.display().to_string(),
                problem: format!("`{id}` is not a job id (a plain name, not hidden)"),
            });
        }
        std::fs::create_dir_all(staging).map_err(Error::io("create", staging))?;
        let hidden = staging.join(format!(".{id}"));
        std::fs::create_dir(&hidden).map_err(Error::io("create", &hidden))?;
        let lock = FileLock::exclusive(&hidden.join(JOB_LOCK))?;
        let dir = staging.join(id);
        durable_fs::rename(&hidden, &dir)?;
        durable_fs::sync_dir(staging)?;
        Ok(StagingJob { dir, _lock: lock })
    }

    /// The job's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Deletes the job's directory (and the staging directory once empty),
    /// then lets go of the lock. Best effort: what is left is a dead job's,
    /// which the next [`recover_staging`] removes.
    pub fn remove(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(staging) = self.dir.parent() {
            let _ = std::fs::remove_dir(staging);
        }
    }
}

/// The directory of write task `task`'s output in a job.
pub fn task_dir(job_dir: &Path, task: u64) -> PathBuf {
    job_dir.join(format!("task-{task:06}"))
}

/// Creates a fresh directory for one attempt of write task `task`.
pub fn task_attempt(job_dir: &Path, task: u64) -> Result<PathBuf> {
    let path = job_dir.join(format!(
        "task-{task:06}.attempt-{}",
        durable_fs::host_pid_token()
    ));
    std::fs::create_dir_all(&path).map_err(Error::io("create", &path))?;
    Ok(path)
}

/// Makes an attempt's durable output the task's output, replacing what
/// an earlier attempt left; returns the task's directory.
pub fn finish_task(job_dir: &Path, task: u64, attempt: &Path) -> Result<PathBuf> {
    let done = task_dir(job_dir, task);
    match std::fs::remove_dir_all(&done) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove an earlier attempt", &done)(e)),
    }
    durable_fs::rename(attempt, &done)?;
    durable_fs::sync_dir(job_dir)?;
    Ok(done)
}

/// A commit decided: its renames, recorded durably in the job's
/// [`COMMIT_RECORD`], so that it happens even if the driver dies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    renames: Vec<(PathBuf, PathBuf)>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Record {
    renames: Vec<(String, String)>,
}

impl Decision {
    /// Writes the commit record of `renames` (in the order they are
    /// applied, the commit point last) into `job_dir`: from here on the
    /// commit happens, even after a crash.
    pub fn record(job_dir: &Path, renames: Vec<(PathBuf, PathBuf)>) -> Result<Decision> {
        let record_path = job_dir.join(COMMIT_RECORD);
        let text = |p: &Path| {
            p.to_str()
                .map(str::to_owned)
                .ok_or_else(|| Error::BadLocation {
                    root: p.display().to_string(),
                    problem: "a path that is not UTF-8 cannot be recorded in a commit".into(),
                })
        };
        let record = Record {
            renames: renames
                .iter()
                .map(|(s, d)| Ok((text(s)?, text(d)?)))
                .collect::<Result<_>>()?,
        };
        let bytes = serde_json::to_vec(&record).map_err(|e| Error::Corrupt {
            url: job_dir.display().to_string(),
            name: COMMIT_RECORD.into(),
            problem: format!("cannot encode: {e}"),
        })?;
        durable_fs::write_atomic(&record_path, &bytes)?;
        Ok(Decision { renames })
    }

    /// The renames, in order.
    pub fn renames(&self) -> &[(PathBuf, PathBuf)] {
        &self.renames
    }

    /// Applies the renames in order. Each directory renamed into is
    /// fsynced before a rename into another one, so the commit point (the
    /// last rename) is never durable before what it makes visible.
    pub fn apply(&self) -> Result<()> {
        let mut last: Option<&Path> = None;
        for (src, dst) in &self.renames {
            let dir = durable_fs::parent_dir(dst);
            if let Some(prev) = last
                && prev != dir
            {
                durable_fs::sync_dir(prev)?;
            }
            durable_fs::rename(src, dst)?;
            last = Some(dir);
        }
        if let Some(dir) = last {
            durable_fs::sync_dir(dir)?;
        }
        Ok(())
    }
}

/// Puts `staged` (a merged file or directory, written in the staging
/// area) in place at `target` with one rename — the commit of a job that
/// writes one file — after making its bytes durable, then makes the
/// rename durable. A file at `target` is replaced; a directory there is
/// an error (a memmap cache is written once).
pub fn commit_rename(staged: &Path, target: &Path) -> Result<()> {
    let file = std::fs::File::open(staged).map_err(Error::io("open", staged))?;
    file.sync_all().map_err(Error::io("fsync", staged))?;
    drop(file);
    durable_fs::rename_and_sync(staged, target)?;
    Ok(())
}

/// Replays a decided commit's renames whose source is still there;
/// returns whether the job had a commit record.
pub fn roll_forward(job_dir: &Path) -> Result<bool> {
    let path = job_dir.join(COMMIT_RECORD);
    let bytes = match durable_fs::read_capped(&path, MAX_COMMIT_RECORD) {
        Ok(b) => b,
        Err(durable_fs::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let record: Record = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
        url: job_dir.display().to_string(),
        name: COMMIT_RECORD.into(),
        problem: format!("not a commit record: {e}"),
    })?;
    let mut dirs = BTreeSet::new();
    for (src, dst) in &record.renames {
        let (src, dst) = (Path::new(src), Path::new(dst));
        if std::fs::symlink_metadata(src).is_ok() {
            durable_fs::rename(src, dst)?;
            dirs.insert(durable_fs::parent_dir(dst).to_path_buf());
        }
    }
    for dir in dirs {
        durable_fs::sync_dir(&dir)?;
    }
    Ok(true)
}

/// Finishes or removes every dead job under `staging` (a missing
/// directory has none) and returns one line per job:
/// `"<job>: commit rolled forward"` or `"<job>: removed"`. A job is dead
/// when no process holds its [`JOB_LOCK`]; live jobs are left alone.
pub fn recover_staging(staging: &Path) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(staging) {
        Ok(e) => e,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(Vec::new());
        }
        Err(e) => return Err(Error::io("list", staging)(e)),
    };
    let mut jobs = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("list", staging))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.path().is_dir() {
            jobs.push((name, entry.path()));
        }
    }
    jobs.sort();
    let mut done = Vec::new();
    for (name, job_dir) in jobs {
        let Some(lock) = FileLock::try_exclusive(&job_dir.join(JOB_LOCK))? else {
            continue;
        };
        let committed = roll_forward(&job_dir)?;
        let _ = std::fs::remove_dir_all(&job_dir);
        drop(lock);
        let what = if committed {
            "commit rolled forward"
        } else {
            "removed"
        };
        done.push(format!("{name}: {what}"));
    }
    let _ = std::fs::remove_dir(staging);
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retried_task_keeps_its_last_attempt_only() {
        let tmp = tempfile::tempdir().unwrap();
        let job = StagingJob::start(&tmp.path().join(".staging"), "job1").unwrap();
        let first = task_attempt(job.dir(), 3).unwrap();
        std::fs::write(first.join("out"), b"first").unwrap();
        finish_task(job.dir(), 3, &first).unwrap();
        let second = task_attempt(job.dir(), 3).unwrap();
        std::fs::write(second.join("out"), b"second").unwrap();
        let failed = task_attempt(job.dir(), 3).unwrap();
        let done = finish_task(job.dir(), 3, &second).unwrap();
        assert_eq!(done, job.dir().join("task-000003"));
        assert_eq!(std::fs::read(done.join("out")).unwrap(), b"second");
        assert!(failed.exists() && !first.exists());
        let staging = tmp.path().join(".staging");
        job.remove();
        assert!(!staging.exists());
    }

    #[test]
    fn a_bad_job_id_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for id in ["", ".hidden", "a/b"] {
            assert!(matches!(
                StagingJob::start(tmp.path(), id),
                Err(Error::BadLocation { .. })
            ));
        }
    }
}
