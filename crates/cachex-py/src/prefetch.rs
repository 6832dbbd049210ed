//! `cachex.Prefetch`: a background fill of the local tier, as a remote
//! reader's `prefetch()` returns it.

use std::time::{Duration, Instant};

use pyo3::prelude::*;
use remote_tier::WarmingSet;

use crate::errors;

/// How long one wait slice holds the GIL released before checking for a
/// signal (so Ctrl-C interrupts a long wait).
const SLICE: Duration = Duration::from_millis(100);

/// Blocks being fetched into the local tier in the background, in the
/// order asked for (the next epoch's), within the tier's budget.
///
/// `PageReader.prefetch`, `MemmapArray.prefetch` and `SegmentStore.prefetch`
/// return one. On a local file (nothing to fetch) it is finished at once with every count
/// zero. The fill goes on when this object is dropped, until done or
/// :meth:`cancel`\ led; a read meanwhile fetches what it needs first. The
/// fill runs in the process that started it (a forked child does not
/// inherit it: there `wait` returns at once whether it had ended).
#[pyclass(module = "cachex._cachex", name = "Prefetch", frozen)]
pub struct PyPrefetch {
    fill: WarmingSet,
    /// The process whose threads fill: a forked child has none of them.
    pid: u32,
}

impl PyPrefetch {
    /// A fill in progress.
    pub(crate) fn new(fill: WarmingSet) -> Self {
        PyPrefetch {
            fill,
            pid: std::process::id(),
        }
    }
}

/// The instant a wait of `timeout` seconds from now ends (`None`: no
/// end); an `InvalidInputError` for a negative or non-finite timeout.
pub fn deadline(timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t.min(1e9))))
        }
        Some(t) => Err(errors::invalid(format!(
            "timeout {t}: give a number of seconds >= 0, or None"
        ))),
    }
}

#[pymethods]
impl PyPrefetch {
    /// Waits at most `timeout` seconds (`None`: until it ends) for the fill
    /// to end, with the GIL released; whether it has.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let deadline = deadline(timeout)?;
        if std::process::id() != self.pid {
            // No thread of this process fills: waiting would only time out.
            return Ok(self.fill.is_finished());
        }
        loop {
            let slice = deadline.map_or(SLICE, |d| {
                d.saturating_duration_since(Instant::now()).min(SLICE)
            });
            let fill = &self.fill;
            if py.detach(|| fill.wait(slice)) {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// Whether the fill has ended (every block fetched or already local,
    /// the budget reached, or cancelled).
    #[getter]
    fn done(&self) -> bool {
        self.fill.is_finished()
    }

    /// Stops the fill after the blocks in flight.
    fn cancel(&self) {
        self.fill.cancel();
    }

    /// Blocks fetched by this fill so far.
    #[getter]
    fn fetched_blocks(&self) -> u64 {
        self.fill.fetched()
    }

    /// Blocks whose fetch failed (left for the reads to fetch again).
    #[getter]
    fn failed_blocks(&self) -> u64 {
        self.fill.failed()
    }

    /// Bytes fetched by this fill so far.
    #[getter]
    fn bytes(&self) -> u64 {
        self.fill.bytes()
    }

    /// Blocks asked for (already local ones included).
    #[getter]
    fn total_blocks(&self) -> u64 {
        self.fill.total()
    }

    /// `Prefetch(fetched=…/…, bytes=…, done=…)`.
    fn __repr__(&self) -> String {
        format!(
            "Prefetch(fetched={}/{}, failed={}, bytes={}, done={})",
            self.fill.fetched(),
            self.fill.total(),
            self.fill.failed(),
            self.fill.bytes(),
            if self.fill.is_finished() {
                "True"
            } else {
                "False"
            }
        )
    }
}
