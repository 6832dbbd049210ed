//! The write path: [`PageWriter`] and parallel page filling. The page
//! allocator is in `placement.rs`, the page buffer in `page_buf.rs`, the
//! crash-safe finalize in `finalize.rs`, the options in `options.rs`.
//!
//! **Placement.** Samples are placed in sample order by one planner: a
//! sample's allocations (one per bytes/array field, each aligned) go into
//! the open page if they all fit, else the page is closed and the sample
//! opens the next one; a sample larger than a page gets a run of
//! contiguous pages of its own. The plan depends only on the sizes, so
//! the file's bytes are the same for any number of writer threads.
//!
//! **Filling.** [`PageWriter::write_parallel`] plans a whole
//! [`SampleSource`], then a [`durable_fs::Pool`] of N threads takes the
//! planned runs in order; each thread owns one page buffer, hands the sample
//! source zeroed regions of it to fill (the "malloc" of FFCV, without the
//! copy), hashes the run and writes it at its offset with `pwrite`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use durable_fs::Pool;

use crate::format::{self, DATA_ALIGN, Run, round_up};
use crate::schema::{FieldType, Schema};
use crate::source::{OneSample, SampleOut, SampleSource, Slot, Value};
use crate::{Error, Result};

mod finalize;
mod options;
mod page_buf;
mod placement;

pub use options::{FinalizeStep, WriteSummary, WriterOptions};
use page_buf::PageBuf;
use placement::{PlannedRun, Planner};

/// Writes one page file: create, append or write in parallel, finalize.
///
/// The file is written under a temporary name (`<name>.tmp`) next to its
/// final path, holding an advisory lock on `<name>.lock`; only
/// [`finalize`](Self::finalize) gives it its name. Dropping a writer
/// without finalizing removes the temporary file.
#[derive(Debug)]
pub struct PageWriter {
    path: PathBuf,
    tmp: PathBuf,
    _lock: durable_fs::FileLock,
    file: File,
    direct: Option<File>,
    direct_ok: AtomicBool,
    schema: Schema,
    row_offsets: Vec<usize>,
    row_len: usize,
    var_fields: Vec<usize>,
    opts: WriterOptions,
    data_offset: u64,
    planner: Planner,
    meta: Vec<u8>,
    runs: Vec<Run>,
    num_samples: u64,
    data_bytes: u64,
    buf: PageBuf,
    buf_cursor: usize,
    slots: Vec<Slot>,
    slot_defaults: Vec<Slot>,
    ranges: Vec<Option<(usize, usize)>>,
    sizes: Vec<u64>,
    rel: Vec<u64>,
    poisoned: bool,
    keep_temp: bool,
}

impl PageWriter {
    /// Starts writing `path` with `schema`. Fails with [`Error::Locked`]
    /// when another writer holds the file's lock; removes a temporary file
    /// a crashed writer left behind.
    pub fn create(
        path: impl AsRef<Path>,
        schema: Schema,
        options: WriterOptions,
    ) -> Result<PageWriter> {
        let path = path.as_ref().to_path_buf();
        schema.validate(&path)?;
        format::check_geometry(options.page_size, u64::from(options.alignment))
            .map_err(|r| Error::invalid(&path, "options", r))?;
        let lock = crate::recover::lock_writer(&path)?;
        let tmp = crate::temp_path(&path);
        let file = durable_fs::create_temp(&tmp).map_err(Error::durable)?;
        let direct = if options.direct_io {
            // Falls back to buffered writes when the file system refuses.
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&tmp)
                .ok()
        } else {
            None
        };
        let data_offset = format::data_offset_for(
            format::header_len_for(schema.len()) as u64,
            options.page_size,
        );
        let var_fields = (0..schema.len())
            .filter(|&i| !schema.fields()[i].ty.is_inline())
            .collect::<Vec<_>>();
        let slots = initial_slots(&schema);
        Ok(PageWriter {
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
            row_offsets: schema.row_offsets(),
            row_len: schema.row_len(),
            sizes: vec![0; var_fields.len()],
            rel: vec![0; var_fields.len()],
            var_fields,
            slot_defaults: slots.clone(),
            ranges: vec![None; schema.len()],
            slots,
            planner: Planner {
                page_size: options.page_size,
                align: u64::from(options.alignment),
                next_page: 0,
                open: None,
            },
            opts: options,
            data_offset,
            meta: Vec::new(),
            runs: Vec::new(),
            num_samples: 0,
            data_bytes: 0,
            buf: PageBuf::default(),
            buf_cursor: 0,
            poisoned: false,
            keep_temp: false,
            schema,
            path,
            tmp,
            _lock: lock,
            file,
        })
    }

    /// The final path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema being written.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Samples written so far.
    pub fn len(&self) -> u64 {
        self.num_samples
    }

    /// Whether no sample was written yet.
    pub fn is_empty(&self) -> bool {
        self.num_samples == 0
    }

    /// Appends one sample (one value per schema field) in the writer's
    /// page buffer; returns its index.
    pub fn append(&mut self, values: &[Value<'_>]) -> Result<u64> {
        self.check_poisoned()?;
        let r = self.append_one(&OneSample(values));
        self.poisoned |= r.is_err();
        r
    }

    /// Writes every sample of `source` with `threads` writer threads (at
    /// least 1; a [`durable_fs::Pool`]). The samples start on a fresh
    /// page; the bytes written do not depend on `threads`. A panic in
    /// `source` is resumed on the caller, and the writer then refuses
    /// further writes.
    pub fn write_parallel<S: SampleSource + ?Sized>(
        &mut self,
        source: &S,
        threads: usize,
    ) -> Result<()> {
        self.check_poisoned()?;
        // Poisoned until it returns: a panic in `source` (resumed here by
        // the pool) leaves a writer that refuses further writes.
        self.poisoned = true;
        let r = self.write_parallel_inner(source, threads);
        self.poisoned = r.is_err();
        r
    }

    /// Finishes the file: writes the open page, the metadata and run
    /// tables, the header, fsyncs, writes the footer, fsyncs, renames the
    /// temporary file to its final name and fsyncs the directory. A crash
    /// at any point leaves no file at the final path, or the previous one.
    pub fn finalize(self) -> Result<WriteSummary> {
        let path = self.path.clone();
        self.run_finalize(None)?.ok_or_else(|| {
            Error::invalid(
                &path,
                "finalize",
                "stopped before the end without a stop step",
            )
        })
    }

    /// Runs [`finalize`](Self::finalize) up to and including `step`, then
    /// stops as if the process had died there: the temporary file stays,
    /// the lock is released. For crash tests.
    pub fn finalize_interrupted(self, step: FinalizeStep) -> Result<()> {
        self.run_finalize(Some(step)).map(|_| ())
    }

    fn check_poisoned(&self) -> Result<()> {
        if self.poisoned {
            return Err(Error::invalid(
                &self.path,
                "writer state",
                "an earlier write failed; start again with a new writer",
            ));
        }
        Ok(())
    }

    /// Asks `source` about sample `src_index` (file index `index`), checks
    /// the answer against the schema, sets `self.sizes` and appends the
    /// metadata row with placeholder pointers. Returns the row's start.
    fn describe<S: SampleSource + ?Sized>(
        &mut self,
        source: &S,
        src_index: usize,
        index: u64,
    ) -> Result<usize> {
        self.slots.clone_from_slice(&self.slot_defaults);
        source
            .describe(src_index, &mut self.slots)
            .map_err(|e| Error::Source {
                path: self.path.clone(),
                index,
                source: e,
            })?;
        let row_start = self.meta.len();
        self.meta.resize(row_start + self.row_len, 0);
        let mut k = 0;
        for (f, field) in self.schema.fields().iter().enumerate() {
            let at = row_start + self.row_offsets[f];
            let bad = |reason: String| Error::BadSample {
                path: self.path.clone(),
                index,
                reason: format!("field {:?}: {reason}", field.name),
            };
            match (&field.ty, self.slots[f]) {
                (FieldType::Int, Slot::Int(v)) => {
                    self.meta[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                (FieldType::Float, Slot::Float(v)) => {
                    self.meta[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
                (FieldType::Bytes | FieldType::Array { .. }, Slot::Size(n)) => {
                    if let Some(want) = field.ty.fixed_size().filter(|w| *w != n) {
                        self.meta.truncate(row_start);
                        return Err(bad(format!("{n} bytes given, the array needs {want}")));
                    }
                    self.sizes[k] = n;
                    k += 1;
                }
                (ty, slot) => {
                    self.meta.truncate(row_start);
                    return Err(bad(format!(
                        "{slot:?} given for a {} field",
                        ty.kind_name()
                    )));
                }
            }
        }
        Ok(row_start)
    }

    /// Places the sample described last and records its pointers in the
    /// row at `row_start`. Returns the run closed to make room.
    fn place(&mut self, index: u64, row_start: usize) -> Result<Option<PlannedRun>> {
        let closed = self
            .planner
            .place(index, &self.sizes, &mut self.rel)
            .map_err(|reason| Error::BadSample {
                path: self.path.clone(),
                index,
                reason,
            })?;
        let Some(open) = self.planner.open else {
            return Err(Error::invalid(
                &self.path,
                "writer state",
                "no open page after placing",
            ));
        };
        let run_start = self
            .run_start(open.first_page)
            .ok_or_else(|| Error::invalid(&self.path, "options", "file offsets overflow u64"))?;
        for (k, &f) in self.var_fields.iter().enumerate() {
            let at = row_start + self.row_offsets[f];
            let ptr = run_start
                .checked_add(self.rel[k])
                .ok_or_else(|| Error::BadSample {
                    path: self.path.clone(),
                    index,
                    reason: "allocation offset overflows u64".into(),
                })?;
            self.meta[at..at + 8].copy_from_slice(&ptr.to_le_bytes());
            self.meta[at + 8..at + 16].copy_from_slice(&self.sizes[k].to_le_bytes());
            self.data_bytes = self.data_bytes.saturating_add(self.sizes[k]);
        }
        Ok(closed)
    }

    fn run_start(&self, first_page: u64) -> Option<u64> {
        first_page
            .checked_mul(self.opts.page_size)?
            .checked_add(self.data_offset)
    }

    fn append_one<S: SampleSource + ?Sized>(&mut self, source: &S) -> Result<u64> {
        let index = self.num_samples;
        let row_start = self.describe(source, 0, index)?;
        let closed = match self.place(index, row_start) {
            Ok(c) => c,
            Err(e) => {
                self.meta.truncate(row_start);
                return Err(e);
            }
        };
        if let Some(run) = closed {
            self.flush_buffered_run(run)?;
            self.buf_cursor = 0;
        }
        let Some(open) = self.planner.open else {
            return Err(Error::invalid(&self.path, "writer state", "no open page"));
        };
        if open.num_samples == 1 {
            self.buf_cursor = 0;
        }
        let cap = self.run_capacity(&open)?;
        if self.buf.len < cap {
            // A fresh (or larger) buffer only ever happens at a run's start.
            self.buf
                .ensure(cap)
                .map_err(|r| Error::invalid(&self.path, "page buffer", r))?;
        }
        let mut buf = std::mem::take(&mut self.buf);
        let mut ranges = std::mem::take(&mut self.ranges);
        let r = self.fill_sample(
            source,
            0,
            index,
            row_start,
            &open,
            &mut buf,
            self.buf_cursor,
            &mut ranges,
        );
        self.buf = buf;
        self.ranges = ranges;
        self.buf_cursor = r?;
        self.num_samples += 1;
        Ok(index)
    }

    /// File offset of a planned run (planning already checked it fits).
    fn checked_run_start(&self, run: &PlannedRun) -> Result<u64> {
        self.run_start(run.first_page)
            .ok_or_else(|| Error::invalid(&self.path, "options", "file offsets overflow u64"))
    }

    fn run_capacity(&self, run: &PlannedRun) -> Result<usize> {
        run.pages
            .checked_mul(self.opts.page_size)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| Error::invalid(&self.path, "page buffer", "run size overflows usize"))
    }

    /// Zeroes the sample's bytes from `cursor`, lets `source` fill its
    /// regions, and returns the new cursor (end of the sample).
    #[allow(clippy::too_many_arguments)]
    fn fill_sample<S: SampleSource + ?Sized>(
        &self,
        source: &S,
        src_index: usize,
        index: u64,
        row_start: usize,
        run: &PlannedRun,
        buf: &mut PageBuf,
        cursor: usize,
        ranges: &mut [Option<(usize, usize)>],
    ) -> Result<usize> {
        let run_start = self.checked_run_start(run)?;
        let row = &self.meta[row_start..row_start + self.row_len];
        let mut end = cursor;
        for &f in &self.var_fields {
            let at = self.row_offsets[f];
            let ptr = format::rd_u64(row, at);
            let size = format::rd_u64(row, at + 8);
            // Planned by this writer: inside the run, which fits the buffer.
            let rel = (ptr - run_start) as usize;
            let size = size as usize;
            ranges[f] = Some((rel, size));
            end = end.max(rel + size);
        }
        let bytes = buf.bytes();
        bytes[cursor..end].fill(0);
        let mut out = SampleOut::new(bytes, ranges);
        source
            .fill(src_index, &mut out)
            .map_err(|e| Error::Source {
                path: self.path.clone(),
                index,
                source: e,
            })?;
        Ok(end)
    }

    fn flush_buffered_run(&mut self, run: PlannedRun) -> Result<()> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.write_run(&mut buf, &run);
        self.buf = buf;
        let hash = r?;
        self.runs.push(to_run(&run, hash));
        Ok(())
    }

    /// Hashes a filled run and writes it at its offset (`O_DIRECT` when on).
    fn write_run(&self, buf: &mut PageBuf, run: &PlannedRun) -> Result<[u8; 32]> {
        let len = run.len as usize;
        let bytes = buf.bytes();
        let hash = *blake3::hash(&bytes[..len]).as_bytes();
        if len == 0 {
            return Ok(hash);
        }
        let offset = self.checked_run_start(run)?;
        if let Some(direct) = self
            .direct
            .as_ref()
            .filter(|_| self.direct_ok.load(Ordering::Relaxed))
        {
            let dlen = (round_up(len as u64, DATA_ALIGN).unwrap_or(0) as usize).min(bytes.len());
            bytes[len..dlen].fill(0);
            match direct.write_all_at(&bytes[..dlen], offset) {
                Ok(()) => return Ok(hash),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(Error::io("write page (O_DIRECT)", &self.tmp)(e)),
            }
        }
        let wlen =
            (round_up(len as u64, self.planner.align).unwrap_or(0) as usize).min(bytes.len());
        bytes[len..wlen].fill(0);
        self.file
            .write_all_at(&bytes[..wlen], offset)
            .map_err(Error::io("write page", &self.tmp))?;
        durable_fs::start_writeback(&self.file, offset, wlen);
        Ok(hash)
    }

    fn write_parallel_inner<S: SampleSource + ?Sized>(
        &mut self,
        source: &S,
        threads: usize,
    ) -> Result<()> {
        if let Some(run) = self.planner.open.take() {
            self.flush_buffered_run(run)?;
            self.buf_cursor = 0;
        }
        let first_sample = self.num_samples;
        let mut planned = Vec::new();
        for i in 0..source.len() {
            let index = first_sample + i as u64;
            let row_start = self.describe(source, i, index)?;
            if let Some(run) = self.place(index, row_start)? {
                planned.push(run);
            }
        }
        if let Some(run) = self.planner.open.take() {
            planned.push(run);
        }
        let this = &*self;
        let hashes = Pool::new(threads).try_map_with(
            &planned,
            || (PageBuf::default(), vec![None; this.schema.len()]),
            |(buf, ranges), run| this.fill_run(source, first_sample, run, buf, ranges),
        )?;
        for (run, hash) in planned.iter().zip(hashes) {
            self.runs.push(to_run(run, hash));
        }
        self.num_samples = first_sample + source.len() as u64;
        Ok(())
    }

    fn fill_run<S: SampleSource + ?Sized>(
        &self,
        source: &S,
        first_sample: u64,
        run: &PlannedRun,
        buf: &mut PageBuf,
        ranges: &mut [Option<(usize, usize)>],
    ) -> Result<[u8; 32]> {
        let cap = self.run_capacity(run)?;
        buf.ensure(cap)
            .map_err(|r| Error::invalid(&self.path, "page buffer", r))?;
        let mut cursor = 0;
        for index in run.first_sample..run.first_sample + run.num_samples {
            let row_start = index as usize * self.row_len;
            let src_index = (index - first_sample) as usize;
            cursor = self.fill_sample(
                source, src_index, index, row_start, run, buf, cursor, ranges,
            )?;
        }
        self.write_run(buf, run)
    }
}

fn to_run(run: &PlannedRun, hash: [u8; 32]) -> Run {
    Run {
        first_page: run.first_page,
        pages: run.pages,
        len: run.len,
        first_sample: run.first_sample,
        num_samples: run.num_samples,
        hash,
    }
}

fn initial_slots(schema: &Schema) -> Vec<Slot> {
    schema
        .fields()
        .iter()
        .map(|f| match &f.ty {
            FieldType::Int => Slot::Int(0),
            FieldType::Float => Slot::Float(0.0),
            FieldType::Bytes => Slot::Size(0),
            FieldType::Array { .. } => Slot::Size(f.ty.fixed_size().unwrap_or(0)),
        })
        .collect()
}
