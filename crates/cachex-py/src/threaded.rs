//! `cachex._cachex.ThreadedFill`: native threads that fill a ring of the
//! caller's preallocated batch buffers with a page file's samples, batch by
//! batch in the order given, ahead of the training loop and without the
//! GIL (what `cachex.torch.ThreadedLoader` runs on).
//!
//! The ring has `depth` slots (one buffer set each, allocated once by the
//! caller); batch `k` goes into slot `k % depth`. The loop holds the last
//! `hold` batches it took (1: the current one; 2 when it copies the one
//! before asynchronously, a pinned buffer's `non_blocking` copy to a GPU):
//! taking batch `j` (`next_batch`) releases batch `j - hold`. The threads
//! fill up to `depth - hold` batches ahead meanwhile, and never a slot the
//! loop holds.
//!
//! The threads are the workspace's one pool (`durable_fs::Pool`, batches
//! taken in order, stopped at the first failure) run by one coordinator
//! thread. A batch that fails (a damaged page) is raised when the loop
//! reaches it, as the `cachex.errors` class of its error, naming the file;
//! the batches before it come first. `close()` (and dropping the object)
//! stops the threads after the batches in flight and joins them within a
//! bound; past it the buffers are leaked rather than freed under a thread
//! still writing them. In a process forked after the threads started (they
//! do not exist there) every call raises `CacheError`; a new
//! `ThreadedFill` made in the child works.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use durable_fs::Pool;
use numpy::{PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use parking_lot::{Condvar, Mutex};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::array::RowSink;
use crate::errors::{self, Kind};
use crate::fill::{Column, Filled, Sink, Target, batch_buffers};
use crate::fork::ForkMark;
use crate::page_reader::{Pages, PyPageReader};

/// How long a wait sleeps between checks for Ctrl-C.
const SLICE: Duration = Duration::from_millis(100);

/// One slot's buffers: each field's (rows, or a bytes field's ragged
/// pair), and the lengths' rows of the bytes fields in rows given one.
struct Slot {
    fields: Vec<Sink<'static>>,
    lengths: Vec<Option<RowSink<'static>>>,
}

// SAFETY: a slot is written only by the one thread that took the batch it
// holds (the ring's state hands batch `k`, so slot `k % depth`, to one
// thread, and only once the batch `depth` before it was released by the
// loop), and read by the loop only after that thread published it under
// the state's lock; the arrays behind the sinks are kept alive (and so
// never resized) by `PyThreadedFill::buffers` for as long as a thread may
// run.
unsafe impl Sync for Slot {}

/// What a fill left in a slot.
struct Done {
    batch: usize,
    result: remote_cache::Result<()>,
}

/// The ring's state, under one lock.
struct State {
    /// Batches the loop moved past (it holds batches `released..taken`).
    released: usize,
    /// Per slot, the batch last filled into it.
    filled: Vec<Option<Done>>,
    /// The batch that failed, once the loop reached it.
    failed: Option<usize>,
    stop: bool,
    /// The coordinator ended (every batch filled, stopped, or a panic).
    finished: bool,
    panicked: bool,
}

/// What the threads share with the loop.
struct Ring {
    pages: Arc<Pages>,
    fields: Vec<usize>,
    names: Vec<String>,
    slots: Vec<Slot>,
    indices: Vec<usize>,
    offsets: Vec<usize>,
    /// Batches the loop holds (see the module docs).
    hold: usize,
    state: Mutex<State>,
    changed: Condvar,
}

/// What a wait of the loop for its batch found.
enum Wait {
    /// The batch's fill ended, with its result.
    Filled(remote_cache::Result<()>),
    /// The threads ended without filling it.
    Ended { panicked: bool },
}

/// Why a fill thread stopped taking batches.
struct Stopped;

impl Ring {
    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn batches(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Fills batch `k` into its slot once the loop has released the batch
    /// that slot held; `Stopped` on `close()` or a failed fill.
    fn fill(&self, k: usize) -> Result<(), Stopped> {
        {
            let mut st = self.state.lock();
            while !st.stop && k >= st.released + self.depth() {
                self.changed.wait(&mut st);
            }
            if st.stop {
                return Err(Stopped);
            }
        }
        let slot = &self.slots[k % self.depth()];
        let indices = &self.indices[self.offsets[k]..self.offsets[k + 1]];
        let result = self
            .pages
            .fill(&self.fields, &slot.fields, indices)
            .and_then(|filled| self.report(k, slot, filled));
        let failed = result.is_err();
        let mut st = self.state.lock();
        st.filled[k % self.depth()] = Some(Done { batch: k, result });
        self.changed.notify_all();
        if failed { Err(Stopped) } else { Ok(()) }
    }

    /// Writes what the fill of batch `k` reported into `slot`: each bytes
    /// value's length into its lengths row; a ragged pair whose values did
    /// not fit (nothing of the batch was copied) is an error.
    fn report(&self, k: usize, slot: &Slot, filled: Vec<Filled>) -> remote_cache::Result<()> {
        for (c, filled) in filled.into_iter().enumerate() {
            match (filled, &slot.fields[c], &slot.lengths[c]) {
                (Filled::Lengths(lens), _, Some(sink)) => {
                    for (row, len) in lens.into_iter().enumerate() {
                        sink.write(row, &(len as i64).to_le_bytes());
                    }
                }
                (Filled::Total(total), Sink::Ragged { values, .. }, _)
                    if !values.copy_at(total, &[]) =>
                {
                    return Err(remote_cache::Error::Page(page_alloc::Error::PoolTooSmall {
                        path: self.pages.reader().path().to_path_buf(),
                        reason: format!(
                            "batch {k}: field {}'s values take {total} bytes, more than \
                             its values buffer holds",
                            self.names[c]
                        ),
                    }));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Runs the pool over every batch (on the coordinator thread).
    fn run(&self, threads: usize) {
        let batches: Vec<usize> = (0..self.batches()).collect();
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| {
            Pool::new(threads).try_map(&batches, |&k| self.fill(k))
        }));
        let mut st = self.state.lock();
        st.finished = true;
        st.panicked = ran.is_err();
        self.changed.notify_all();
    }

    /// Stops the threads after the batches in flight; whether the
    /// coordinator ended within `bound`.
    fn stop(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        let mut st = self.state.lock();
        st.stop = true;
        self.changed.notify_all();
        while !st.finished {
            if self.changed.wait_until(&mut st, deadline).timed_out() {
                return st.finished;
            }
        }
        true
    }
}

/// Native threads filling a ring of preallocated batch buffers with a
/// page file's samples, batch by batch, ahead of the loop (see the module
/// docs; `cachex.torch.ThreadedLoader` is the user's class).
#[pyclass(module = "cachex._cachex", name = "ThreadedFill")]
pub struct PyThreadedFill {
    ring: Arc<Ring>,
    path: PathBuf,
    coordinator: Option<JoinHandle<()>>,
    /// Every array the threads write (kept alive while they may run).
    buffers: Vec<Py<PyUntypedArray>>,
    /// Batches handed to the loop.
    taken: usize,
    fork: ForkMark,
}

impl PyThreadedFill {
    fn check_fork(&self) -> PyResult<()> {
        if self.fork.forked() {
            return Err(errors::raise(
                Kind::Other,
                format!(
                    "{}: this ThreadedFill's threads were started before the process \
                     forked and do not exist in this child: start a new iteration \
                     (a new ThreadedFill) in the child",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Stops and joins the threads within `bound` (GIL released); past it
    /// the buffers and the coordinator are leaked.
    fn shut(&mut self, py: Python<'_>, bound: Duration) -> bool {
        let Some(coordinator) = self.coordinator.take() else {
            return true;
        };
        let ring = &self.ring;
        let ended = py.detach(|| ring.stop(bound));
        if ended {
            // The coordinator set `finished` as its last act.
            let _ = py.detach(|| coordinator.join());
        } else {
            // A thread may still write the buffers: never free them.
            std::mem::forget(coordinator);
            std::mem::forget(std::mem::take(&mut self.buffers));
        }
        ended
    }
}

/// The buffers of each slot's dict `slots[s]` (and `lengths[s]`), checked
/// against the file's fields for `rows` samples: the field names and
/// indices, the slots, and every array (to keep alive).
#[allow(clippy::type_complexity)]
fn slot_buffers<'py>(
    pages: &Pages,
    slots: &[Bound<'py, PyDict>],
    lengths: &[Bound<'py, PyDict>],
    rows: usize,
) -> PyResult<(Vec<(String, usize)>, Vec<Slot>, Vec<Py<PyUntypedArray>>)> {
    if slots.is_empty() || slots.len() != lengths.len() {
        return Err(errors::invalid(format!(
            "give at least one slot, and one lengths dict a slot ({} slots, {} lengths)",
            slots.len(),
            lengths.len()
        )));
    }
    let detached = |what: String, a: &Bound<'py, PyUntypedArray>| {
        // SAFETY: `keep` holds every array for the object's life (and it
        // leaks them when the threads cannot be joined).
        RowSink::new(&what, a).map(|r| unsafe { r.detach() })
    };
    let mut fields: Option<Vec<(String, usize)>> = None;
    let mut out = Vec::with_capacity(slots.len());
    let mut keep = Vec::new();
    for (s, (slot, lens)) in slots.iter().zip(lengths).enumerate() {
        let (names, targets) = batch_buffers(slot, rows, |name| pages.column(name))?;
        if fields.as_ref().is_some_and(|f| *f != names) {
            return Err(errors::invalid(format!(
                "slot {s} has other fields than slot 0 (give every slot the same dict keys, in order)"
            )));
        }
        let mut sinks = Vec::with_capacity(targets.len());
        for (target, (name, _)) in targets.iter().zip(&names) {
            let what = format!("slots[{s}][{name:?}]");
            sinks.push(match target {
                Target::Rows(a) => Sink::Rows(detached(what, a)?),
                Target::Ragged(v, o) => Sink::Ragged {
                    values: detached(what.clone(), v)?,
                    offsets: detached(what, o)?,
                },
            });
        }
        let mut length_sinks: Vec<Option<RowSink<'static>>> = names.iter().map(|_| None).collect();
        for (name, buf) in lens.iter() {
            let name: String = name.extract()?;
            let column = names.iter().position(|(n, _)| *n == name).filter(|&c| {
                matches!(targets[c], Target::Rows(_))
                    && matches!(pages.column(&name), Ok((_, Column::Bytes)))
            });
            let Some(column) = column else {
                return Err(errors::invalid(format!(
                    "lengths[{s}][{name:?}]: not a bytes field of the slot in rows"
                )));
            };
            let a = buf.cast_into::<PyUntypedArray>().map_err(|_| {
                errors::invalid(format!("lengths[{s}][{name:?}] must be a numpy array"))
            })?;
            let ok = crate::array::dtype_of(&a.dtype())? == tensor_core::DType::I64
                && a.shape().len() == 1
                && a.shape()[0] >= rows;
            if !ok {
                return Err(errors::invalid(format!(
                    "lengths[{s}][{name:?}]: give int64 ({rows},) or longer"
                )));
            }
            length_sinks[column] = Some(detached(format!("lengths[{s}][{name:?}]"), &a)?);
            keep.push(a.unbind());
        }
        for target in targets {
            match target {
                Target::Rows(a) => keep.push(a.unbind()),
                Target::Ragged(v, o) => keep.extend([v.unbind(), o.unbind()]),
            }
        }
        out.push(Slot {
            fields: sinks,
            lengths: length_sinks,
        });
        fields.get_or_insert(names);
    }
    Ok((fields.unwrap_or_default(), out, keep))
}

/// `offsets` as batch bounds into `indices` (0 first, `len(indices)`
/// last, never decreasing), and every index checked against `len`.
fn batch_bounds(
    indices: &[i64],
    offsets: &[i64],
    len: usize,
) -> PyResult<(Vec<usize>, Vec<usize>)> {
    let bad = |what: String| errors::invalid(format!("offsets: {what}"));
    let offsets: Vec<usize> = offsets
        .iter()
        .map(|&o| usize::try_from(o).map_err(|_| bad(format!("{o} < 0"))))
        .collect::<PyResult<_>>()?;
    if offsets.first() != Some(&0) || offsets.last() != Some(&indices.len()) {
        return Err(bad(format!(
            "give 0 first and len(indices) = {} last",
            indices.len()
        )));
    }
    if offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(bad("they decrease".into()));
    }
    let indices = indices
        .iter()
        .map(|&i| {
            usize::try_from(i).ok().filter(|&i| i < len).ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!(
                    "sample {i} out of range ({len} samples)"
                ))
            })
        })
        .collect::<PyResult<_>>()?;
    Ok((indices, offsets))
}

#[pymethods]
impl PyThreadedFill {
    /// Starts `threads` threads filling batch `k` (samples
    /// `indices[offsets[k]:offsets[k+1]]` of `reader`) into slot `k %
    /// len(slots)`: `slots[s]` maps field names to writable C-contiguous
    /// buffers as `PageReader.fill_batch` takes them, every slot the same
    /// fields; `lengths[s]` maps bytes fields to int64 buffers that get
    /// each value's length. Taking batch `j` releases batch `j - hold`
    /// (`1 <= hold < len(slots)`).
    #[new]
    #[pyo3(signature = (reader, indices, offsets, slots, lengths, *, threads=2, hold=1))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        reader: &PyPageReader,
        indices: PyReadonlyArray1<'_, i64>,
        offsets: PyReadonlyArray1<'_, i64>,
        slots: Vec<Bound<'_, PyDict>>,
        lengths: Vec<Bound<'_, PyDict>>,
        threads: usize,
        hold: usize,
    ) -> PyResult<Self> {
        if threads == 0 {
            return Err(errors::invalid("threads 0: give at least 1"));
        }
        let pages = reader.pages(py)?;
        let path = pages.reader().path().to_path_buf();
        let (indices, offsets) = batch_bounds(
            indices.as_slice()?,
            offsets.as_slice()?,
            pages.reader().len(),
        )?;
        let rows = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let (named, slots, buffers) = slot_buffers(&pages, &slots, &lengths, rows)?;
        let (names, fields) = named.into_iter().unzip();
        let depth = slots.len();
        if hold == 0 || hold >= depth {
            return Err(errors::invalid(format!(
                "hold {hold} with {depth} slots: give 1 <= hold < len(slots)"
            )));
        }
        let ring = Arc::new(Ring {
            pages,
            fields,
            names,
            slots,
            indices,
            offsets,
            hold,
            state: Mutex::new(State {
                released: 0,
                filled: (0..depth).map(|_| None).collect(),
                failed: None,
                stop: false,
                finished: false,
                panicked: false,
            }),
            changed: Condvar::new(),
        });
        let fork = ForkMark::new(py);
        let runner = ring.clone();
        let coordinator = std::thread::Builder::new()
            .name("cachex-fill".into())
            .spawn(move || runner.run(threads))
            .map_err(|e| {
                errors::raise(
                    Kind::Io,
                    format!("{}: cannot start a fill thread: {e}", path.display()),
                )
            })?;
        Ok(PyThreadedFill {
            ring,
            path,
            coordinator: Some(coordinator),
            buffers,
            taken: 0,
            fork,
        })
    }

    /// The number of batches.
    fn __len__(&self) -> usize {
        self.ring.batches()
    }

    /// The number of slots.
    #[getter]
    fn depth(&self) -> usize {
        self.ring.depth()
    }

    /// The next batch as `(slot, rows)` once filled, releasing the one
    /// `hold` before (its slot may be refilled from now on); `None` after the
    /// last. Waits with the GIL released, at most `timeout` seconds
    /// (`None`: until filled), then raises `CacheError`. A failed batch
    /// raises its error (a `CorruptError` naming the file, ...), and every
    /// call after it, or after `close()`, a `CacheError`.
    #[pyo3(signature = (timeout=None))]
    fn next_batch(
        &mut self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<(usize, usize)>> {
        self.check_fork()?;
        let deadline = crate::prefetch::deadline(timeout)?;
        let ring = self.ring.clone();
        let j = self.taken;
        if ring.state.lock().stop {
            return Err(errors::closed(&self.path));
        }
        if let Some(k) = ring.state.lock().failed {
            return Err(errors::raise(
                Kind::Other,
                format!(
                    "{}: batch {k} failed; the iteration is over",
                    self.path.display()
                ),
            ));
        }
        if j >= ring.batches() {
            return Ok(None);
        }
        let slot = j % ring.depth();
        loop {
            let got = py.detach(|| {
                let mut st = ring.state.lock();
                let released = (j + 1).saturating_sub(ring.hold);
                if st.released < released {
                    st.released = released;
                    ring.changed.notify_all();
                }
                let slice_end = Instant::now() + SLICE;
                let until = deadline.map_or(slice_end, |d| d.min(slice_end));
                loop {
                    if let Some(f) = st.filled[slot].as_mut().filter(|f| f.batch == j) {
                        return Some(Wait::Filled(std::mem::replace(&mut f.result, Ok(()))));
                    }
                    if st.finished {
                        return Some(Wait::Ended {
                            panicked: st.panicked,
                        });
                    }
                    if ring.changed.wait_until(&mut st, until).timed_out() {
                        return None;
                    }
                }
            });
            match got {
                Some(Wait::Filled(Ok(()))) => {
                    self.taken = j + 1;
                    let rows = ring.offsets[j + 1] - ring.offsets[j];
                    return Ok(Some((slot, rows)));
                }
                Some(Wait::Filled(Err(e))) => {
                    ring.state.lock().failed = Some(j);
                    return Err(errors::to_py(e));
                }
                Some(Wait::Ended { panicked }) => {
                    ring.state.lock().failed = Some(j);
                    let why = if panicked {
                        "a fill thread panicked"
                    } else {
                        "the fill threads were stopped (closed)"
                    };
                    return Err(errors::raise(
                        Kind::Other,
                        format!("{}: batch {j} not filled: {why}", self.path.display()),
                    ));
                }
                None => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(errors::raise(
                            Kind::Other,
                            format!(
                                "{}: batch {j} not filled within {} s",
                                self.path.display(),
                                timeout.unwrap_or(0.0)
                            ),
                        ));
                    }
                    py.check_signals()?;
                }
            }
        }
    }

    /// Stops the threads after the batches in flight and joins them,
    /// waiting at most `timeout` seconds (GIL released); whether they
    /// ended (if not, the buffers are never freed: a thread may still
    /// write them). Nothing to do in a forked child or when closed.
    #[pyo3(signature = (timeout=10.0))]
    fn close(&mut self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if self.fork.forked() {
            return Ok(true);
        }
        if !(timeout.is_finite() && timeout >= 0.0) {
            return Err(errors::invalid(format!(
                "timeout {timeout}: give a number of seconds >= 0"
            )));
        }
        Ok(self.shut(py, Duration::from_secs_f64(timeout.min(1e9))))
    }

    /// Whether the threads have ended (all batches filled, closed, or
    /// stopped by a failed batch).
    #[getter]
    fn finished(&self) -> bool {
        self.ring.state.lock().finished
    }

    /// `ThreadedFill(path, batches=n, depth=d)`.
    fn __repr__(&self) -> String {
        format!(
            "ThreadedFill({:?}, batches={}, depth={})",
            self.path.display().to_string(),
            self.ring.batches(),
            self.ring.depth()
        )
    }
}

impl Drop for PyThreadedFill {
    fn drop(&mut self) {
        if self.fork.forked() {
            // The threads are the parent's: nothing here to stop or join,
            // and the state's lock may have been held by one at the fork.
            if let Some(c) = self.coordinator.take() {
                std::mem::forget(c);
            }
            std::mem::forget(self.ring.clone());
            return;
        }
        Python::attach(|py| {
            self.shut(py, Duration::from_secs(10));
        });
    }
}
