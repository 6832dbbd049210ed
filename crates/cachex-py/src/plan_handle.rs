//! `cachex.PlanHandle`: a reader's registered plan in the local tier, as
//! `PageReader.set_plan` and `SegmentStore.set_plan` return it.

use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use remote_tier::PlanHandle;

use crate::errors;

/// A plan's positions (an int64 array) as batch positions; a negative one
/// is an `InvalidInputError`.
pub fn positions(positions: &numpy::PyReadonlyArray1<'_, i64>) -> PyResult<Vec<u64>> {
    positions
        .as_array()
        .iter()
        .map(|&p| u64::try_from(p).map_err(|_| errors::invalid(format!("position {p} < 0"))))
        .collect()
}

/// A reader's plan of the coming reads, registered in the machine's local
/// tier: while it is open, the tier evicts (in every process) the pages
/// this plan needs furthest ahead first and keeps the nearest (Belady's
/// rule) rather than the least recently used.
///
/// :meth:`advance` it to the number of batches read (its positions are
/// the reader's batch clock); :meth:`close` (or the end of a ``with``
/// block, or dropping it) removes the plan.
#[pyclass(module = "cachex._cachex", name = "PlanHandle", frozen)]
pub struct PyPlanHandle {
    handle: Mutex<Option<PlanHandle>>,
    /// The plan record, shown in errors and reported by `path`.
    path: PathBuf,
}

impl PyPlanHandle {
    /// Wraps a registered plan.
    pub(crate) fn new(handle: PlanHandle) -> Self {
        PyPlanHandle {
            path: handle.path().to_path_buf(),
            handle: Mutex::new(Some(handle)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<PlanHandle>> {
        self.handle.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyPlanHandle {
    /// Moves the plan's progress to `position`: the reads of earlier
    /// positions are done. One 8-byte write.
    fn advance(&self, position: u64) -> PyResult<()> {
        match &*self.lock() {
            Some(handle) => handle
                .advance(position)
                .map_err(|e| errors::to_py(remote_cache::Error::from(e))),
            None => Err(errors::closed(&self.path)),
        }
    }

    /// Removes the plan (the tier's eviction is LRU again for its pages);
    /// closing twice does nothing.
    fn close(&self) {
        drop(self.lock().take());
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// The plan record in the tier (``<tier_dir>/plans/<token>.plan``).
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, PyTuple>) -> bool {
        self.close();
        false
    }

    fn __repr__(&self) -> String {
        let state = if self.closed() { "closed" } else { "open" };
        format!("PlanHandle({:?}, {state})", self.path)
    }
}
