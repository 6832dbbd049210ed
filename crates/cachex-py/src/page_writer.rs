//! `cachex.PageWriter`: the writer of a page-alloc file.

use std::path::PathBuf;
use std::sync::Arc;

use page_alloc::{FieldType, PageWriter, Schema, Value, WriterOptions};
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use remote_cache::{CacheDir, PAGE_BLOCK_SIZE, StoreKind};

use crate::errors::{self, Kind};
use crate::handle::Handle;
use crate::page_fields::{Owned, Spec, page_value, sample_arg, spec_arg};
use crate::root::{Root, TierArgs};

/// The writer of a page file.
///
/// On a URL (`s3://bucket/prefix/data.pages`) the file is written in a
/// working directory of the writer's own over the local tier and
/// published by `finalize()`.
#[pyclass(module = "cachex._cachex", name = "PageWriter", frozen)]
pub struct PyPageWriter {
    fields: Vec<(String, Spec)>,
    root: Root,
    /// The working directory of a URL's writer, published by `finalize()`
    /// (`None` for a local file).
    remote: Option<CacheDir>,
    /// A forked child refuses every call and leaks the parent's writer
    /// (dropping it would delete the parent's temporary file).
    handle: Handle<Mutex<Option<PageWriter>>>,
}

impl PyPageWriter {
    fn with<R>(&self, f: impl FnOnce(&mut PageWriter) -> PyResult<R>) -> PyResult<R> {
        let slot = self.handle.get_writer()?;
        let mut slot = slot.lock();
        match slot.as_mut() {
            Some(w) => f(w),
            None => Err(self.finalized()),
        }
    }

    fn finalized(&self) -> PyErr {
        errors::raise(
            Kind::Other,
            format!("{}: writer is finalized", self.handle.path().display()),
        )
    }

    fn convert(&self, samples: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<Owned>>> {
        samples
            .try_iter()?
            .enumerate()
            .map(|(k, s)| {
                sample_arg(&self.fields, &s?)
                    .map_err(|e| errors::invalid(format!("sample {k}: {}", e.value(samples.py()))))
            })
            .collect()
    }
}

#[pymethods]
impl PyPageWriter {
    /// Creates the page file `path` with `fields` `{name: "int" | "float" |
    /// "bytes" | (dtype, shape)}`; `page_size`, `alignment` and `direct_io`
    /// tune the layout and the writes. The file appears at `finalize()`.
    ///
    /// `path` may be a URL naming the file under a prefix, with the tier
    /// keywords of `PageReader`: `finalize()` then publishes it, with its
    /// hashes in blocks of `tier_block_size` (the blocks its readers fetch).
    #[new]
    #[pyo3(signature = (path, fields, *, page_size=None, alignment=None, direct_io=false, tier_dir=None, tier_budget=None, storage_options=None, tier_block_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: &Bound<'_, PyAny>,
        fields: &Bound<'_, PyDict>,
        page_size: Option<u64>,
        alignment: Option<u32>,
        direct_io: bool,
        tier_dir: Option<PathBuf>,
        tier_budget: Option<&Bound<'_, PyAny>>,
        storage_options: Option<&Bound<'_, PyDict>>,
        tier_block_size: Option<u64>,
    ) -> PyResult<Self> {
        if let Some(b) = tier_block_size
            && !(b.is_power_of_two()
                && (remote_tier::MIN_BLOCK_SIZE..=PAGE_BLOCK_SIZE).contains(&b))
        {
            return Err(errors::invalid(format!(
                "tier_block_size {b}: give a power of two from {} to {PAGE_BLOCK_SIZE}",
                remote_tier::MIN_BLOCK_SIZE
            )));
        }
        let tier =
            TierArgs::new(tier_dir, tier_budget, storage_options)?.with_block_size(tier_block_size);
        let root = Root::new(path, tier)?;
        let mut specs = Vec::with_capacity(fields.len());
        let mut schema = Schema::new();
        for (name, spec) in fields.iter() {
            let name: String = name.extract()?;
            let spec = spec_arg(&name, &spec)?;
            schema = schema.field(
                name.clone(),
                match &spec {
                    Spec::Int => FieldType::Int,
                    Spec::Float => FieldType::Float,
                    Spec::Bytes => FieldType::Bytes,
                    Spec::Json => {
                        return Err(errors::invalid(format!(
                            "field {name:?}: json fields are for .beton files; use bytes"
                        )));
                    }
                    Spec::Array(d, s) => FieldType::Array {
                        dtype: *d,
                        shape: s.clone(),
                    },
                },
            );
            specs.push((name, spec));
        }
        let mut opts = WriterOptions::default().direct_io(direct_io);
        if let Some(p) = page_size {
            opts = opts.page_size(p);
        }
        if let Some(a) = alignment {
            opts = opts.alignment(a);
        }
        let (path, remote) = errors::enter(py, || root.open_file(StoreKind::PageAlloc))?;
        let w = errors::enter(py, || PageWriter::create(&path, schema, opts))?;
        Ok(PyPageWriter {
            fields: specs,
            root,
            remote,
            handle: Handle::new(py, path, Arc::new(Mutex::new(Some(w)))),
        })
    }

    /// The file written (for a URL, in the writer's working directory).
    #[getter]
    fn path(&self) -> PathBuf {
        self.handle.path().to_path_buf()
    }

    /// The URL written, without credentials (`None` for a local file).
    #[getter]
    fn url(&self) -> Option<String> {
        self.root.shown_url()
    }

    /// Samples written so far.
    fn __len__(&self) -> PyResult<usize> {
        self.with(|w| Ok(w.len() as usize))
    }

    /// Appends one sample; returns its index.
    fn append(&self, py: Python<'_>, sample: &Bound<'_, PyAny>) -> PyResult<u64> {
        let values = sample_arg(&self.fields, sample)?;
        self.with(|w| {
            errors::enter(py, || {
                let vals: Vec<Value<'_>> = values.iter().map(page_value).collect();
                w.append(&vals)
            })
        })
    }

    /// Appends many samples, filling pages from `threads` threads (the
    /// file's bytes do not depend on the thread count).
    #[pyo3(signature = (samples, threads=2))]
    fn write_many(
        &self,
        py: Python<'_>,
        samples: &Bound<'_, PyAny>,
        threads: usize,
    ) -> PyResult<()> {
        let owned = self.convert(samples)?;
        self.with(|w| {
            errors::enter(py, || {
                let rows: Vec<Vec<Value<'_>>> = owned
                    .iter()
                    .map(|s| s.iter().map(page_value).collect())
                    .collect();
                w.write_parallel(&rows[..], threads.max(1)).map(drop)
            })
        })
    }

    /// Writes the tables and the footer, fsyncs and renames the file into
    /// place (on a URL, then publishes it); returns a summary. The writer
    /// is closed after.
    fn finalize<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self
            .handle
            .get_writer()?
            .lock()
            .take()
            .ok_or_else(|| self.finalized())?;
        let remote = &self.remote;
        let s = errors::enter(py, || -> remote_cache::Result<_> {
            let summary = w.finalize()?;
            if let Some(dir) = remote {
                dir.publish()?;
            }
            Ok(summary)
        })?;
        let d = PyDict::new(py);
        match self.root.shown_url() {
            Some(url) => d.set_item("path", url)?,
            None => d.set_item("path", &s.path)?,
        }
        d.set_item("num_samples", s.num_samples)?;
        d.set_item("num_runs", s.num_runs)?;
        d.set_item("num_pages", s.num_pages)?;
        d.set_item("data_bytes", s.data_bytes)?;
        d.set_item("file_len", s.file_len)?;
        d.set_item("direct_io", s.direct_io)?;
        Ok(d)
    }
}
