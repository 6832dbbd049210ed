//! `cachex.memmap_open_or_build`: a memmap-array cache opened, or built
//! by a Python callback when missing, half-built or stale.

use std::path::{Path, PathBuf};

use fingerprint::SourceStamp;
use memmap_array::{RowWriter, WriterOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use remote_cache::{CacheDir, Location, StoreKind};

use crate::memmap_reader::PyMemmapArray;
use crate::memmap_schema::schema_arg;
use crate::memmap_writer::PyMemmapWriter;
use crate::root::{Root, TierArgs};
use crate::{errors, json};

/// Why a build failed: the store's error or the build callback's exception.
enum BuildError {
    Store(memmap_array::Error),
    Py(PyErr),
}

impl From<memmap_array::Error> for BuildError {
    fn from(e: memmap_array::Error) -> Self {
        BuildError::Store(e)
    }
}

/// For a URL root: the cache's own directory `<name>/<key>` under it,
/// opened in a working directory over the local tier (the build runs
/// there and is published after).
fn open_remote(
    location: &Location,
    name: &str,
    config: &serde_json::Value,
) -> remote_cache::Result<(String, CacheDir)> {
    let identity = fingerprint::cache_identity(memmap_array::BACKEND_NAME, name, config)
        .map_err(memmap_array::Error::from)?;
    let dir = fingerprint::named_cache_dir(Path::new(""), name, &identity)
        .map_err(memmap_array::Error::from)?;
    let rel = dir
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/");
    let opened = location.open_dir_under(&rel, StoreKind::MemmapArray)?;
    Ok((rel, opened))
}

/// Opens the cache `root/<name>/<key of config>` (the layout the facade
/// uses for the same name and config), calling `build(writer)` to
/// (re)build it when missing, half-built or stale; returns the reader and
/// what was done (`"cache hit"`, `"cache rebuilt (stale: ...)"`, ...).
///
/// `root` may be a URL (with the tier keywords of `MemmapArray`): a cache
/// published at `<root>/<name>/<key>` is a hit, read through the local
/// tier; one built here is published. `sources` are then stamped
/// relative to the current directory.
#[pyfunction]
#[pyo3(signature = (root, name, config, build, arrays, *, nullable=Vec::new(), sidecars=Vec::new(), sources=Vec::new(), content_hash=false, sync_every=WriterOptions::DEFAULT_SYNC_EVERY, tier_dir=None, tier_budget=None, storage_options=None))]
#[allow(clippy::too_many_arguments)]
pub fn memmap_open_or_build<'py>(
    py: Python<'py>,
    root: &Bound<'py, PyAny>,
    name: &str,
    config: &Bound<'py, PyAny>,
    build: Bound<'py, PyAny>,
    arrays: &Bound<'py, PyDict>,
    nullable: Vec<String>,
    sidecars: Vec<String>,
    sources: Vec<PathBuf>,
    content_hash: bool,
    sync_every: usize,
    tier_dir: Option<PathBuf>,
    tier_budget: Option<&Bound<'py, PyAny>>,
    storage_options: Option<&Bound<'py, PyDict>>,
) -> PyResult<(PyMemmapArray, String)> {
    let given = Root::new(root, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
    let schema = schema_arg(arrays, &nullable, &sidecars)?;
    let config = json::from_py(config)?;
    let mode = if content_hash {
        fingerprint::Mode::Content
    } else {
        fingerprint::Mode::Metadata
    };
    // For a URL, the build runs in a working directory over the tier.
    let (root, remote) = match given.location() {
        Location::Local(dir) => (dir.clone(), None),
        location => {
            let (rel, opened) = errors::enter(py, || open_remote(location, name, &config))?;
            (opened.root().to_path_buf(), Some((rel, opened)))
        }
    };
    let stamp_root = match &remote {
        None => root.clone(),
        Some(_) => std::env::current_dir()
            .map_err(|e| errors::raise(errors::Kind::Io, format!("current directory: {e}")))?,
    };
    let stamps: Vec<SourceStamp> = errors::enter(py, || {
        fingerprint::stamp_sources(&stamp_root, &sources, mode)
    })?;
    let build = build.unbind();
    let root_for_writer = root.clone();
    let opened: Result<memmap_array::Opened, BuildError> = py.detach(|| {
        memmap_array::open_or_build_with(
            &root,
            name,
            &config,
            stamps,
            &schema,
            WriterOptions { sync_every },
            |w: &mut RowWriter| -> Result<(), BuildError> {
                Python::attach(|py| {
                    let lent = PyMemmapWriter::lent(py, root_for_writer.clone(), w);
                    let writer = Bound::new(py, lent).map_err(BuildError::Py)?;
                    let result = build.bind(py).call1((writer.clone(),));
                    // Take the writer back before `w`'s borrow ends: the
                    // Python object may outlive this call.
                    writer.get().take_back();
                    result.map(drop).map_err(BuildError::Py)
                })
            },
        )
    });
    match (opened, remote) {
        (Ok(o), None) => {
            let outcome = o.outcome.to_string();
            Ok((PyMemmapArray::local(py, o.cache)?, outcome))
        }
        // A URL's cache is read by blocks through the tier: published
        // first when built here, then opened as `MemmapArray(<root>/<name>/<key>)`.
        (Ok(o), Some((rel, opened))) => {
            let outcome = o.outcome.to_string();
            let built = !matches!(o.outcome, memmap_array::Outcome::Hit);
            drop(o);
            errors::enter(py, || {
                if built {
                    opened.publish()?;
                }
                drop(opened);
                Ok::<(), remote_cache::Error>(())
            })?;
            let url = given.url_under(&rel)?;
            Ok((PyMemmapArray::remote(py, url)?, outcome))
        }
        (Err(BuildError::Store(e)), _) => Err(errors::to_py(e)),
        (Err(BuildError::Py(e)), _) => Err(e),
    }
}
