//! `cachex.memmap_open_or_build`: a memmap-array cache opened, or built
//! by a Python callback when missing, half-built or stale.

use std::path::PathBuf;

use fingerprint::SourceStamp;
use memmap_array::{RowWriter, WriterOptions};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::memmap_reader::PyMemmapArray;
use crate::memmap_schema::schema_arg;
use crate::memmap_writer::PyMemmapWriter;
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

/// Opens the cache `root/<name>/<key of config>` (the layout the facade
/// uses for the same name and config), calling `build(writer)` to
/// (re)build it when missing, half-built or stale; returns the reader and
/// what was done (`"cache hit"`, `"cache rebuilt (stale: ...)"`, ...).
#[pyfunction]
#[pyo3(signature = (root, name, config, build, arrays, *, nullable=Vec::new(), sidecars=Vec::new(), sources=Vec::new(), content_hash=false, sync_every=WriterOptions::DEFAULT_SYNC_EVERY))]
#[allow(clippy::too_many_arguments)]
pub fn memmap_open_or_build<'py>(
    py: Python<'py>,
    root: PathBuf,
    name: &str,
    config: &Bound<'py, PyAny>,
    build: Bound<'py, PyAny>,
    arrays: &Bound<'py, PyDict>,
    nullable: Vec<String>,
    sidecars: Vec<String>,
    sources: Vec<PathBuf>,
    content_hash: bool,
    sync_every: usize,
) -> PyResult<(PyMemmapArray, String)> {
    let schema = schema_arg(arrays, &nullable, &sidecars)?;
    let config = json::from_py(config)?;
    let mode = if content_hash {
        fingerprint::Mode::Content
    } else {
        fingerprint::Mode::Metadata
    };
    let stamps: Vec<SourceStamp> =
        errors::enter(py, || fingerprint::stamp_sources(&root, &sources, mode))?;
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
    match opened {
        Ok(o) => {
            let outcome = o.outcome.to_string();
            Ok((PyMemmapArray::local(py, o.cache)?, outcome))
        }
        Err(BuildError::Store(e)) => Err(errors::to_py(e)),
        Err(BuildError::Py(e)) => Err(e),
    }
}
