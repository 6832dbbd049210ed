//! Two-step publishing for jobs whose writers run on many machines
//! (`cachex.ray`'s sinks): remote-cache's `staged` module, as private
//! functions of the native module. Pieces travel between the write tasks
//! and the committer as JSON text (small, and picklable by anything).

use std::collections::HashMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use remote_cache::Piece;
use remote_cache::staged::{
    WRITER_BLOCK_HASHES, commit_files, fetch_file, open_tier, read_file, upload_files,
};
use remote_cache::{LogState, StagedSegments, StoreFiles, StoreKind, decide_remote_segments};
use remote_tier::RemoteTier;

use crate::errors;
use crate::root::{Root, TierArgs};

fn tier_of(
    url: &str,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<RemoteTier> {
    let root = Root::url(url, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
    open_tier(root.location()).map_err(errors::to_py)
}

fn store_files(kind: &str) -> PyResult<StoreFiles> {
    let kind = match kind {
        "segments" => StoreKind::SegmentStore,
        "arrays" => StoreKind::MemmapArray,
        "pages" => StoreKind::PageAlloc,
        "shards" => StoreKind::ShardStore,
        other => {
            return Err(errors::invalid(format!(
                "store kind {other:?}: give segments, arrays, pages or shards"
            )));
        }
    };
    Ok(StoreFiles::for_kind(kind))
}

/// Uploads `files` (`(path in the cache, local file)`) as objects of the
/// cache at `url`, for a store of `kind`, without committing; returns
/// each file's piece as JSON text, for `_staged_commit`.
#[pyfunction]
#[pyo3(signature = (url, kind, files, *, tier_dir=None, tier_budget=None, storage_options=None))]
pub fn _staged_upload(
    py: Python<'_>,
    url: &str,
    kind: &str,
    files: Vec<(String, PathBuf)>,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<String>> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let store = store_files(kind)?;
    let pieces = errors::enter(py, || {
        let refs: Vec<(String, &std::path::Path)> = files
            .iter()
            .map(|(r, p)| (r.clone(), p.as_path()))
            .collect();
        upload_files(&tier, store, &refs, WRITER_BLOCK_HASHES)
    })?;
    pieces.iter().map(to_json).collect()
}

/// The commit log at `url` after its last commit: `(seq, {path: [piece
/// as JSON text]})`.
#[pyfunction]
#[pyo3(signature = (url, *, tier_dir=None, tier_budget=None, storage_options=None))]
pub fn _staged_state(
    py: Python<'_>,
    url: &str,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(u64, HashMap<String, Vec<String>>)> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let state = errors::enter(py, || LogState::read(&tier))?;
    let mut files = HashMap::with_capacity(state.files.len());
    for (path, pieces) in state.files {
        files.insert(path, pieces.iter().map(to_json).collect::<PyResult<_>>()?);
    }
    Ok((state.seq, files))
}

/// The bytes of file `path` of the cache at `url`, made of `pieces` (JSON
/// text from `_staged_state`), fetched into memory and checked.
#[pyfunction]
#[pyo3(signature = (url, path, pieces, *, tier_dir=None, tier_budget=None, storage_options=None))]
pub fn _staged_read<'py>(
    py: Python<'py>,
    url: &str,
    path: &str,
    pieces: Vec<String>,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'py, PyAny>>,
    storage_options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let pieces = from_json(&pieces)?;
    let bytes = errors::enter(py, || read_file(&tier, path, &pieces))?;
    Ok(PyBytes::new(py, &bytes))
}

/// Writes file `path` of the cache at `url`, made of `pieces` (JSON text
/// from `_staged_state` or `_staged_upload`), into the local file `dest`
/// through the local tier, checked; returns the bytes written.
#[pyfunction]
#[pyo3(signature = (url, path, pieces, dest, *, tier_dir=None, tier_budget=None, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub fn _staged_fetch(
    py: Python<'_>,
    url: &str,
    path: &str,
    pieces: Vec<String>,
    dest: PathBuf,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let pieces = from_json(&pieces)?;
    errors::enter(py, || fetch_file(&tier, path, &pieces, &dest))
}

fn to_json(piece: &Piece) -> PyResult<String> {
    serde_json::to_string(piece).map_err(|e| errors::invalid(e.to_string()))
}

fn from_json(pieces: &[String]) -> PyResult<Vec<Piece>> {
    pieces
        .iter()
        .map(|text| {
            serde_json::from_str::<Piece>(text)
                .map_err(|e| errors::invalid(format!("a staged piece is not one: {e}")))
        })
        .collect()
}

/// Publishes `pieces` (JSON text from `_staged_upload`, in the order
/// readers apply them) and `removed` as commit `after + 1` of the log at
/// `url`; `None` when another writer took that number.
#[pyfunction]
#[pyo3(signature = (url, after, pieces, removed, *, tier_dir=None, tier_budget=None, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub fn _staged_commit(
    py: Python<'_>,
    url: &str,
    after: u64,
    pieces: Vec<String>,
    removed: Vec<String>,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<u64>> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let pieces = from_json(&pieces)?;
    errors::enter(py, || commit_files(&tier, after, pieces, removed))
}

/// Decides the commit of a segment job's write tasks (`(task, schema.json
/// bytes, index log bytes, [segment piece as JSON text])`) against the
/// last commit of the log at `url`: uploads the renumbered writer log (and
/// the schema of a new cache) and returns `(the commit's number, [piece
/// as JSON text])` for `_staged_commit`.
#[pyfunction]
#[pyo3(signature = (url, tasks, *, tier_dir=None, tier_budget=None, storage_options=None))]
#[allow(clippy::type_complexity)]
pub fn _staged_segments_decide(
    py: Python<'_>,
    url: &str,
    tasks: Vec<(u64, Vec<u8>, Vec<u8>, Vec<String>)>,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'_, PyAny>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(u64, Vec<String>)> {
    let tier = tier_of(url, tier_dir, tier_budget, storage_options)?;
    let tasks = tasks
        .into_iter()
        .map(|(task, schema, log, pieces)| {
            Ok(StagedSegments {
                task,
                schema,
                log,
                pieces: from_json(&pieces)?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let (seq, pieces) = errors::enter(py, || decide_remote_segments(&tier, &tasks))?;
    Ok((seq, pieces.iter().map(to_json).collect::<PyResult<_>>()?))
}

/// Adds the functions above to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_staged_upload, m)?)?;
    m.add_function(wrap_pyfunction!(_staged_state, m)?)?;
    m.add_function(wrap_pyfunction!(_staged_read, m)?)?;
    m.add_function(wrap_pyfunction!(_staged_fetch, m)?)?;
    m.add_function(wrap_pyfunction!(_staged_commit, m)?)?;
    m.add_function(wrap_pyfunction!(_staged_segments_decide, m)?)?;
    Ok(())
}
