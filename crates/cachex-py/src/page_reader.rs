//! `cachex.PageReader`: a validated, memory-mapped page-alloc file.

use std::path::PathBuf;
use std::sync::Arc;

use cache_facade::StoreKind;
use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use page_alloc::{FieldType, FieldValue, PageReader};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use remote_cache::PagesAt;
use remote_tier::Lease;

use crate::array::Keeper;
use crate::fill::{Cell, Column, Filled, Sink, batch_buffers, fill_rows, report};
use crate::handle::Handle;
use crate::page_fields::{bytes_view, index_arg, tensor_view};
use crate::plan_handle::PyPlanHandle;
use crate::prefetch::PyPrefetch;
use crate::root::{Root, TierArgs};
use crate::{check, errors};

/// A page file as opened, wherever it lies: a local file is read where it
/// is, a file at a URL by the pages its samples lie in (each fetched
/// through the local tier before it is read: the bytes not fetched read as
/// zeros). One store handle either way ([`PagesAt`]).
pub(crate) struct Pages(PagesAt);

impl Pages {
    /// Opens the file `root` names (for a URL, the file under its prefix).
    fn open(root: &Root, options: &page_alloc::ReadOptions) -> remote_cache::Result<Pages> {
        let (dir, file) = root.file_location()?;
        Ok(Pages(PagesAt::open_with(&dir, &file, options)?))
    }

    pub(crate) fn reader(&self) -> &PageReader {
        self.0.reader()
    }

    /// Field `name`'s index and what a batch buffer of it holds (an
    /// `InvalidInputError` for a name the file has not).
    pub(crate) fn column(&self, name: &str) -> PyResult<(usize, Column<'_>)> {
        let schema = self.reader().schema();
        let field = schema
            .index_of(name)
            .ok_or_else(|| errors::invalid(format!("no field {name:?} in this file")))?;
        let kind = match &schema.fields()[field].ty {
            FieldType::Int => Column::Int,
            FieldType::Float => Column::Float,
            FieldType::Bytes => Column::Bytes,
            FieldType::Array { dtype, shape } => Column::Array(*dtype, shape.dims()),
        };
        Ok((field, kind))
    }

    /// Copies samples `indices` into `sinks` (field `fields[c]` into
    /// `sinks[c]`), their pages leased across the copies: the fill of
    /// `fill_batch` and of the threaded loader's threads. Call with the
    /// GIL released.
    pub(crate) fn fill(
        &self,
        fields: &[usize],
        sinks: &[Sink<'_>],
        indices: &[usize],
    ) -> remote_cache::Result<Vec<Filled>> {
        let reader = self.reader();
        let schema = reader.schema();
        // Held across the copies: the tier frees no leased page.
        let _lease = self.lease(indices)?;
        fill_rows(
            indices,
            sinks,
            |i, row: &mut Vec<Cell<'_>>| {
                let s = reader.sample(i)?;
                for &field in fields {
                    row.push(match s.get(field)? {
                        FieldValue::Int(x) => Cell::Int(x),
                        FieldValue::Float(x) => Cell::Float(x),
                        FieldValue::Bytes(b) => Cell::Bytes(b),
                        FieldValue::Array(t) => Cell::Bytes(t.bytes()),
                    });
                }
                Ok(())
            },
            |e| {
                remote_cache::Error::Page(page_alloc::Error::PoolTooSmall {
                    path: reader.path().to_path_buf(),
                    reason: format!(
                        "sample {}: field {} holds {} bytes, the buffer row {}",
                        e.sample,
                        schema.fields()[fields[e.position]].name,
                        e.len,
                        e.room
                    ),
                })
            },
        )
    }

    /// Makes the pages of samples `indices` local and keeps them so while
    /// the lease lives (nothing for a file read where it lies).
    fn lease(&self, indices: &[usize]) -> remote_cache::Result<Option<Lease>> {
        self.0.lease_samples(indices)
    }

    /// Every problem of the file (`page_alloc::verify`); through a tier,
    /// each run fetched and leased only while it is checked, so the
    /// check stays within the tier's budget. Call with the GIL released.
    fn verify(&self) -> Vec<cache_check::Problem> {
        page_alloc::verify_with(self.reader().path(), |range| {
            self.0.lease_bytes(range).map_err(std::io::Error::other)
        })
    }
}

/// One opening of a page file.
struct Opening {
    pages: Arc<Pages>,
    /// The `.base` of every array returned from this opening.
    keeper: Py<PyAny>,
    options: page_alloc::ReadOptions,
}

impl Opening {
    fn open(py: Python<'_>, root: &Root, options: page_alloc::ReadOptions) -> PyResult<Arc<Self>> {
        let pages = Arc::new(errors::enter(py, || Pages::open(root, &options))?);
        let keeper = Keeper::wrap(py, pages.clone())?.unbind();
        Ok(Arc::new(Opening {
            pages,
            keeper,
            options,
        }))
    }

    fn reader(&self) -> &PageReader {
        self.pages.reader()
    }
}

/// A validated, memory-mapped page file.
///
/// A URL (`s3://bucket/prefix/data.pages`, ...) is read through the local
/// tier by the pages its samples lie in, fetched on first read; every
/// process of the machine (DataLoader workers too) shares the tier's one
/// copy of each page.
#[pyclass(module = "cachex._cachex", name = "PageReader", frozen)]
pub struct PyPageReader {
    root: Root,
    /// Swapped by the reopen in a forked child and by `refresh()`; arrays
    /// returned earlier keep their own opening alive.
    handle: Handle<Opening>,
}

impl PyPageReader {
    /// The current opening; in a forked child, first a fresh one from the
    /// root and options (nothing of the parent's is used; for a URL, a
    /// working directory of the child's own over the same tier).
    fn current(&self, py: Python<'_>) -> PyResult<Arc<Opening>> {
        self.handle.get(py, |py, inherited| {
            Opening::open(py, &self.root, inherited.options.clone())
        })
    }

    /// The pages open now (in a forked child, first reopened): what the
    /// threaded loader's fill threads read.
    pub(crate) fn pages(&self, py: Python<'_>) -> PyResult<Arc<Pages>> {
        Ok(self.current(py)?.pages.clone())
    }

    /// The opening with samples `indices` made local (GIL released), and
    /// the lease that keeps them so (`None` for a local file).
    fn ready(&self, py: Python<'_>, indices: &[usize]) -> PyResult<(Arc<Opening>, Option<Lease>)> {
        let o = self.current(py)?;
        let pages = &o.pages;
        let lease = errors::enter(py, || pages.lease(indices))?;
        Ok((o, lease))
    }
}

#[pymethods]
impl PyPageReader {
    /// Opens and validates the page file at `path` (`populate` reads it
    /// into the page cache, `verify_pages` checks every page checksum;
    /// both for a local file only).
    ///
    /// `path` may be a URL naming the file under a prefix
    /// (`s3://bucket/prefix/data.pages`), read through the local tier at
    /// `tier_dir` within `tier_budget` (bytes, or a size such as `"20G"`),
    /// with `storage_options` for the object store (credentials stay in
    /// the environment).
    #[new]
    #[pyo3(signature = (path, *, populate=false, verify_pages=false, tier_dir=None, tier_budget=None, storage_options=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        populate: bool,
        verify_pages: bool,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let root = Root::new(path, TierArgs::new(tier_dir, tier_budget, storage_options)?)?;
        root.split_file().map_err(errors::to_py)?;
        let options = page_alloc::ReadOptions {
            populate,
            verify_pages,
        };
        let opened = Opening::open(py, &root, options)?;
        let file = opened.reader().path().to_path_buf();
        Ok(PyPageReader {
            root,
            handle: Handle::new(py, file, opened),
        })
    }

    /// The file read: the page file, or for a URL its link in the
    /// working directory over the local tier.
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL the file was opened on, without credentials (`None` for a
    /// local file).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
    }

    /// Opens the file again, as published now (a writer that finalizes
    /// renames a new file over the old one; on a URL, publishes a new
    /// commit). Arrays returned before keep the old opening.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        let options = self.current(py)?.options.clone();
        let fresh = Opening::open(py, &self.root, options)?;
        self.handle.replace(py, fresh);
        Ok(())
    }

    /// The number of samples.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.current(py)?.reader().len())
    }

    /// Field names and types: `{name: "int" | "float" | "bytes" | (dtype, shape)}`.
    #[getter]
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let d = PyDict::new(py);
        for f in o.reader().schema().fields() {
            match &f.ty {
                FieldType::Int => d.set_item(&f.name, "int")?,
                FieldType::Float => d.set_item(&f.name, "float")?,
                FieldType::Bytes => d.set_item(&f.name, "bytes")?,
                FieldType::Array { dtype, shape } => {
                    d.set_item(&f.name, (dtype.name(), PyTuple::new(py, shape.dims())?))?
                }
            }
        }
        Ok(d)
    }

    /// The largest value of each field, in bytes (what `fill_batch`
    /// buffers of bytes fields need per sample).
    #[getter]
    fn max_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let d = PyDict::new(py);
        for (f, size) in o
            .reader()
            .schema()
            .fields()
            .iter()
            .zip(o.reader().max_sizes())
        {
            d.set_item(&f.name, size)?;
        }
        Ok(d)
    }

    /// Sample `i`: ints and floats by value, bytes fields as read-only
    /// uint8 views and array fields as read-only views of the mapped file.
    fn sample<'py>(&self, py: Python<'py>, i: i64) -> PyResult<Bound<'py, PyDict>> {
        let len = self.current(py)?.reader().len();
        let i = index_arg(len, i)?;
        let (o, lease) = self.ready(py, &[i])?;
        let s = o.reader().sample(i).map_err(errors::to_py)?;
        // The views' `.base`: the opening's keeper for a local file, else
        // one that owns this sample's lease too.
        let leased;
        let owner = match lease {
            Some(lease) => {
                leased = Keeper::wrap(py, (o.pages.clone(), lease))?;
                &leased
            }
            None => o.keeper.bind(py),
        };
        let d = PyDict::new(py);
        for (k, f) in o.reader().schema().fields().iter().enumerate() {
            let v = match s.get(k).map_err(errors::to_py)? {
                FieldValue::Int(x) => x.into_pyobject(py)?.into_any(),
                FieldValue::Float(x) => x.into_pyobject(py)?.into_any(),
                // SAFETY: the slices borrow the reader's mapping, which
                // `owner` keeps alive (it holds the opening's `Arc<Pages>`).
                // Writers never modify a file in place (they rename new
                // files over), and on a URL the tier frees blocks of the
                // file it maps only outside leases: `owner` also owns the
                // lease on this sample's run, so its bytes stay while any
                // view of them lives.
                FieldValue::Bytes(b) => unsafe { bytes_view(py, b, owner)? },
                // SAFETY: as above.
                FieldValue::Array(t) => unsafe { tensor_view(py, &t, owner)? },
            };
            d.set_item(&f.name, v)?;
        }
        Ok(d)
    }

    /// Copies samples `indices` into the caller's preallocated buffers,
    /// with the GIL released and no allocation: `out` maps field names to
    /// writable C-contiguous arrays with at least `len(indices)` rows —
    /// int64 for int fields, float64 for floats, the field's dtype and
    /// `(n, *shape)` for arrays, uint8 `(n, width)` for bytes (zero
    /// padded) — or, for a bytes field, a ragged pair `(values, offsets)`
    /// (uint8 1-D, int64 of at least `n + 1`). Fields not in `out` are
    /// skipped. Returns the byte lengths of each padded bytes field's
    /// values (`{name: [len, ...]}`) and each ragged pair's total bytes
    /// (`{name: total}`); when a total exceeds its values buffer, only the
    /// offsets were written: grow the buffer and call again.
    fn fill_batch<'py>(
        &self,
        py: Python<'py>,
        indices: Vec<usize>,
        out: &Bound<'py, PyDict>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let pages = &o.pages;
        let schema = o.reader().schema();
        let (names, targets) = batch_buffers(out, indices.len(), |name| pages.column(name))?;
        let sinks = targets
            .iter()
            .zip(&names)
            .map(|(t, (name, _))| Sink::new(name, t))
            .collect::<PyResult<Vec<_>>>()?;
        let fields: Vec<usize> = names.iter().map(|(_, f)| *f).collect();
        let (fields, indices) = (&fields, &indices);
        let filled = errors::enter(py, move || pages.fill(fields, &sinks, indices))?;
        report(py, names, filled, |f| {
            schema.fields()[f].ty == FieldType::Bytes
        })
    }

    /// Warms the pages of samples `indices`, in that order (the next
    /// epoch's), and returns a `Prefetch` at once.
    ///
    /// On a URL the pages are fetched into the local tier in the
    /// background, within the tier's budget (MosaicML's `predownload`);
    /// reads meanwhile fetch what they need first. On a local file the
    /// kernel is asked to read them ahead (`madvise(WILLNEED)`) and the
    /// `Prefetch` returned is already done, every count zero.
    fn prefetch(&self, py: Python<'_>, indices: Vec<usize>) -> PyResult<PyPrefetch> {
        let o = self.current(py)?;
        let len = o.reader().len();
        if let Some(&i) = indices.iter().find(|&&i| i >= len) {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "sample {i} out of range: the file has {len} samples"
            )));
        }
        let pages = &o.pages;
        Ok(PyPrefetch::new(py.detach(|| pages.0.prefetch(&indices))))
    }

    /// Registers this reader's plan in the local tier: sample
    /// `samples[j]` is read at batch `positions[j]` of this reader's clock
    /// (`0..epoch_len` this epoch, `epoch_len..2*epoch_len` the next; both
    /// int64 arrays of one length). The tier then evicts, in every
    /// process, the pages needed furthest ahead first. Returns a
    /// `PlanHandle` to `advance` after each batch and `close` at the end;
    /// `None` for a local file (no tier).
    fn set_plan(
        &self,
        py: Python<'_>,
        samples: PyReadonlyArray1<'_, i64>,
        positions: PyReadonlyArray1<'_, i64>,
        epoch_len: u64,
    ) -> PyResult<Option<PyPlanHandle>> {
        let samples = samples
            .as_array()
            .iter()
            .map(|&i| usize::try_from(i).map_err(|_| errors::invalid(format!("sample {i} < 0"))))
            .collect::<PyResult<Vec<usize>>>()?;
        let positions = crate::plan_handle::positions(&positions)?;
        let o = self.current(py)?;
        let pages = &o.pages;
        let handle = errors::enter(py, || pages.0.set_plan(&samples, &positions, epoch_len))?;
        Ok(handle.map(PyPlanHandle::new))
    }

    /// FFCV's quasi-random epoch order: shuffled pages, samples shuffled
    /// within windows of `window_pages` pages. With `shares > 1`, only
    /// share `share` of it: whole pages dealt out so that the shares of
    /// one seed are disjoint and together hold every sample once (one per
    /// DataLoader worker, each computing its own).
    #[pyo3(signature = (seed, window_pages=8, *, share=0, shares=1))]
    fn quasi_random_order(
        &self,
        py: Python<'_>,
        seed: u64,
        window_pages: usize,
        share: usize,
        shares: usize,
    ) -> PyResult<Vec<usize>> {
        let o = self.current(py)?;
        let reader = o.reader();
        errors::enter(py, || {
            reader.quasi_random_share(seed, window_pages, share, shares)
        })
    }

    /// The sampling plan's blocks (`cachex.sampling.SamplingPlan`): the
    /// samples of each run of pages, in file order (int64, runs without a
    /// sample left out, summing to `len(self)`), from the run table the
    /// open validated.
    fn page_blocks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray1<i64>>> {
        let o = self.current(py)?;
        let reader = o.reader();
        let n = reader.len() as u64;
        let spans = reader.run_spans();
        let mut counts = Vec::with_capacity(spans.len());
        for (k, span) in spans.iter().enumerate() {
            let end = spans.get(k + 1).map_or(n, |next| next.first_sample);
            let count = end.saturating_sub(span.first_sample);
            if count > 0 {
                counts.push(count as i64);
            }
        }
        Ok(counts.into_pyarray(py))
    }

    /// Everything wrong with the file (every page checksum), as `cachex
    /// verify --json` prints it: `{"kind": "page-alloc", "path",
    /// "problems": [{"path", "kind", "detail"}, ...]}`, `problems` empty
    /// when sound.
    fn verify<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let pages = &o.pages;
        let path = o.reader().path();
        let problems = py.detach(|| pages.verify());
        check::verify_to_py(py, StoreKind::PageAlloc, path, &problems)
    }

    /// What the file holds, as `cachex inspect --json` prints it: `kind`,
    /// `path`, sample, run and page counts, sizes, and a table of fields.
    fn inspect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let o = self.current(py)?;
        let path = o.reader().path();
        let summary = errors::enter(py, || page_alloc::inspect(path))?;
        check::summary_to_py(py, &summary.summary())
    }

    /// Pickles as the path (or URL), read options and tier keywords; the
    /// copy reopens the file.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        let (populate, verify_pages) = this.handle.peek().map_or((false, false), |o| {
            (o.options.populate, o.options.verify_pages)
        });
        let kwargs = PyDict::new(py);
        kwargs.set_item("populate", populate)?;
        kwargs.set_item("verify_pages", verify_pages)?;
        this.root.tier().to_kwargs(&kwargs)?;
        let args = (this.root.to_py(py)?, kwargs).into_pyobject(py)?;
        Ok((
            py.import("cachex._cachex")?
                .getattr("_reopen_page_reader")?,
            args,
        ))
    }

    /// `PageReader(path, samples=n)` (a URL shown without credentials).
    fn __repr__(&self) -> String {
        let n = self.handle.peek().map_or(0, |o| o.reader().len());
        format!("PageReader({:?}, samples={n})", self.root.shown())
    }
}

/// Unpickles a `PageReader` (see `PageReader.__reduce__`).
#[pyfunction]
pub fn _reopen_page_reader<'py>(
    py: Python<'py>,
    path: &Bound<'py, PyAny>,
    kwargs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyAny>> {
    py.get_type::<PyPageReader>().call((path,), Some(kwargs))
}
