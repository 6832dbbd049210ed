//! The local commit protocol of `cachex.ray`'s sinks (remote-cache's
//! `staging` and `staged_segments`), and the one durable write of the
//! drop-ins (durable-fs), as private names of the native module. The
//! protocol, the segment-store format and every fsync and lock are the
//! crates'; the Python package only orchestrates.

use std::path::PathBuf;

use parking_lot::Mutex;
use pyo3::prelude::*;
use remote_cache::{SegmentCommit, StagingJob};

use crate::errors;

/// A write job's staging directory, its lock held until `remove`.
#[pyclass(module = "cachex._cachex", name = "_StagingJob", frozen)]
pub struct PyStagingJob {
    job: Mutex<Option<StagingJob>>,
    dir: PathBuf,
}

#[pymethods]
impl PyStagingJob {
    /// Creates job `id`'s directory under `staging` and takes its lock.
    #[new]
    fn new(py: Python<'_>, staging: PathBuf, id: &str) -> PyResult<Self> {
        let job = errors::enter(py, || StagingJob::start(&staging, id))?;
        Ok(PyStagingJob {
            dir: job.dir().to_path_buf(),
            job: Mutex::new(Some(job)),
        })
    }

    /// The job's directory.
    #[getter]
    fn dir(&self) -> PathBuf {
        self.dir.clone()
    }

    /// Deletes the job's directory (and the staging directory once
    /// empty) and lets go of the lock; a second call does nothing.
    fn remove(&self, py: Python<'_>) {
        if let Some(job) = self.job.lock().take() {
            py.detach(|| job.remove());
        }
    }
}

/// A fresh directory for one attempt of write task `task` of the job at
/// `job_dir`.
#[pyfunction]
pub fn _staging_task_attempt(py: Python<'_>, job_dir: PathBuf, task: u64) -> PyResult<PathBuf> {
    errors::enter(py, || remote_cache::task_attempt(&job_dir, task))
}

/// Makes an attempt's durable output the task's (replacing an earlier
/// attempt's); returns the task's directory.
#[pyfunction]
pub fn _staging_finish_task(
    py: Python<'_>,
    job_dir: PathBuf,
    task: u64,
    attempt: PathBuf,
) -> PyResult<PathBuf> {
    errors::enter(py, || remote_cache::finish_task(&job_dir, task, &attempt))
}

/// Finishes or removes every dead job under `staging`; one line per job.
#[pyfunction]
pub fn _staging_recover(py: Python<'_>, staging: PathBuf) -> PyResult<Vec<String>> {
    errors::enter(py, || remote_cache::recover_staging(&staging))
}

/// Puts the merged file or directory `staged` in place at `target` with
/// one durable rename.
#[pyfunction]
pub fn _staging_commit_rename(py: Python<'_>, staged: PathBuf, target: PathBuf) -> PyResult<()> {
    errors::enter(py, || remote_cache::commit_rename(&staged, &target))
}

/// A segment job's commit, decided; its renames wait for `apply`.
#[pyclass(module = "cachex._cachex", name = "_SegmentCommit", frozen)]
pub struct PySegmentCommit {
    commit: Mutex<Option<SegmentCommit>>,
}

#[pymethods]
impl PySegmentCommit {
    /// Applies the decided renames (the commit point last) and lets go of
    /// the cache's locks.
    fn apply(&self, py: Python<'_>) -> PyResult<()> {
        match self.commit.lock().take() {
            Some(commit) => errors::enter(py, || commit.apply()),
            None => Err(errors::invalid("the commit was applied or closed already")),
        }
    }

    /// Lets go of the cache's locks without applying (a decided commit is
    /// then rolled forward by the next recovery).
    fn close(&self) {
        drop(self.commit.lock().take());
    }
}

/// Decides the commit of the staged stores `staged` (task directories of
/// the job at `job_dir`) into the segment store at `cache`.
#[pyfunction]
pub fn _segments_decide(
    py: Python<'_>,
    cache: PathBuf,
    job_dir: PathBuf,
    staged: Vec<PathBuf>,
) -> PyResult<PySegmentCommit> {
    let commit = errors::enter(py, || {
        remote_cache::decide_staged_segments(&cache, &job_dir, &staged)
    })?;
    Ok(PySegmentCommit {
        commit: Mutex::new(Some(commit)),
    })
}

/// Finishes the decided commits and removes the staging of the dead jobs
/// of the segment store at `cache`; one line per job.
#[pyfunction]
pub fn _segments_recover(py: Python<'_>, cache: PathBuf) -> PyResult<Vec<String>> {
    errors::enter(py, || remote_cache::recover_staged_segments(&cache))
}

/// Writes `data` to `path` durably and atomically, under a temporary name
/// of this process (many writers may share the directory). With
/// `replace=False` only when `path` does not exist; returns whether it
/// was written.
#[pyfunction]
#[pyo3(signature = (path, data, *, replace=true))]
pub fn _durable_write(
    py: Python<'_>,
    path: PathBuf,
    data: Vec<u8>,
    replace: bool,
) -> PyResult<bool> {
    errors::enter(py, || {
        if replace {
            durable_fs::write_atomic_shared(&path, &data).map(|()| true)
        } else {
            durable_fs::write_new_atomic(&path, &data)
        }
    })
}

/// Removes `path` durably (its directory fsynced); whether it existed.
#[pyfunction]
pub fn _durable_remove(py: Python<'_>, path: PathBuf) -> PyResult<bool> {
    errors::enter(py, || durable_fs::remove_and_sync(&path))
}

/// Adds the names above to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStagingJob>()?;
    m.add_class::<PySegmentCommit>()?;
    m.add_function(wrap_pyfunction!(_staging_task_attempt, m)?)?;
    m.add_function(wrap_pyfunction!(_staging_finish_task, m)?)?;
    m.add_function(wrap_pyfunction!(_staging_recover, m)?)?;
    m.add_function(wrap_pyfunction!(_staging_commit_rename, m)?)?;
    m.add_function(wrap_pyfunction!(_segments_decide, m)?)?;
    m.add_function(wrap_pyfunction!(_segments_recover, m)?)?;
    m.add_function(wrap_pyfunction!(_durable_write, m)?)?;
    m.add_function(wrap_pyfunction!(_durable_remove, m)?)?;
    Ok(())
}
