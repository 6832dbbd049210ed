//! The read path: a validated memory map, zero-copy samples, batch buffers,
//! prefetch and a page-ordered shuffle.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Advice, Mmap, MmapOptions};
use tensor_core::TensorView;

use crate::format::{self, Layout, rd_u64};
use crate::schema::{FieldType, Schema};
use crate::validate::{self, Problems};
use crate::{Error, Result};

/// How [`PageReader::open_with`] maps and checks a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Pre-fault the whole mapping at open (`MAP_POPULATE`): open costs a
    /// pass over the file, reads then take no page faults.
    pub populate: bool,
    /// Also hash every page against the run table at open (a full read).
    pub verify_pages: bool,
}

/// The bytes a reader reads: a memory map, or a buffer (for fuzzing).
pub(crate) enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Backing::Mmap(_) => "mmap",
            Backing::Owned(_) => "buffer",
        };
        write!(f, "{kind} of {} bytes", self.bytes().len())
    }
}

impl Backing {
    /// Maps `path` read-only (pre-faulted with `populate`).
    pub(crate) fn map(path: &Path, populate: bool) -> Result<Backing> {
        let file = File::open(path).map_err(Error::io("open", path))?;
        let mut map = MmapOptions::new();
        if populate {
            map.populate();
        }
        // SAFETY: the file is opened read-only and the files this crate
        // reads are never modified in place: writers build `<name>.tmp` and
        // rename it over `<name>`, so the inode we map keeps its bytes while
        // mapped. Every read of the mapping goes through bounds-checked
        // slices.
        let mmap = unsafe { map.map(&file) }.map_err(Error::io("mmap", path))?;
        Ok(Backing::Mmap(mmap))
    }

    /// Advises the kernel about a byte range (no-op for owned buffers).
    pub(crate) fn will_need(&self, start: usize, len: usize) {
        if let Backing::Mmap(m) = self {
            // Advice only: a failure changes speed, never results.
            let _ = m.advise_range(Advice::WillNeed, start, len);
        }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// A validated, memory-mapped page file. `Send + Sync`: share it by
/// reference (or `Arc`) between loader threads; reads take no lock.
#[derive(Debug)]
pub struct PageReader {
    path: PathBuf,
    data: Backing,
    layout: Layout,
}

/// One field's value, borrowed from the file where it is not inline.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// An int field.
    Int(i64),
    /// A float field.
    Float(f64),
    /// A bytes field: a slice of the mapped file.
    Bytes(&'a [u8]),
    /// An array field: a tensor view over the mapped file.
    Array(TensorView<'a>),
}

/// One sample of a [`PageReader`]: its metadata row, with accessors that
/// return inline values by value and page data as borrowed slices.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    reader: &'a PageReader,
    index: usize,
    row: &'a [u8],
}

impl PageReader {
    /// Opens and validates `path` (see [`open_with`](Self::open_with)).
    pub fn open(path: impl AsRef<Path>) -> Result<PageReader> {
        PageReader::open_with(path, &ReadOptions::default())
    }

    /// Maps `path` and validates footer, header, schema, both tables'
    /// checksum, and every run and `(ptr, size)` with checked arithmetic
    /// before any sample can be read; with `verify_pages`, every page's
    /// checksum too. Cost: O(number of samples), plus a pass over the file
    /// with `populate` or `verify_pages`.
    pub fn open_with(path: impl AsRef<Path>, options: &ReadOptions) -> Result<PageReader> {
        let path = path.as_ref().to_path_buf();
        let data = Backing::map(&path, options.populate)?;
        PageReader::validate(path, data, options.verify_pages)
    }

    /// Validates a page file held in memory (`name` is used in errors).
    /// The same checks as [`open`](Self::open); used by the fuzz targets.
    pub fn from_bytes(bytes: Vec<u8>, name: impl Into<PathBuf>) -> Result<PageReader> {
        PageReader::validate(name.into(), Backing::Owned(bytes), false)
    }

    fn validate(path: PathBuf, data: Backing, verify_pages: bool) -> Result<PageReader> {
        let bytes = data.bytes();
        let mut layout = format::parse(bytes, &path)?;
        let mut problems = Problems::new(1);
        validate::check_runs(&mut layout, bytes, &path, &mut problems);
        if verify_pages && problems.list.is_empty() {
            validate::check_page_hashes(&layout, bytes, &path, &mut problems);
        }
        if let Some(e) = problems.list.pop() {
            return Err(e);
        }
        Ok(PageReader { path, data, layout })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.layout.schema
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        // num_samples rows fit in the file, hence in usize.
        self.layout.header.num_samples as usize
    }

    /// Whether the file holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The page size the file was written with.
    pub fn page_size(&self) -> u64 {
        self.layout.header.page_size
    }

    /// The allocation alignment the file was written with.
    pub fn alignment(&self) -> u64 {
        self.layout.header.alignment
    }

    /// Number of runs (pages, or page runs of oversized samples).
    pub fn num_runs(&self) -> usize {
        self.layout.header.num_runs as usize
    }

    /// The largest value of each field in the file (0 for inline fields).
    pub fn max_sizes(&self) -> &[u64] {
        &self.layout.max_sizes
    }

    /// The index of the field called `name`.
    pub fn field_index(&self, name: &str) -> Result<usize> {
        self.layout
            .schema
            .index_of(name)
            .ok_or_else(|| Error::field(&self.path, format!("{name:?}"), "no such field"))
    }

    /// Where each run's samples lie, in file order (validated at open).
    pub fn run_spans(&self) -> Vec<crate::format::RunSpan> {
        let h = &self.layout.header;
        let bytes = self.data.bytes();
        (0..h.num_runs)
            .filter_map(|k| {
                let at = h
                    .runs_offset
                    .checked_add(k.checked_mul(format::RUN_LEN as u64)?)?;
                let entry = bytes
                    .get(usize::try_from(at).ok()?..)?
                    .get(..format::RUN_LEN)?;
                let run = format::Run::decode(entry);
                let start = h
                    .data_offset
                    .checked_add(run.first_page.checked_mul(h.page_size)?)?;
                Some(crate::format::RunSpan {
                    first_sample: run.first_sample,
                    bytes: start..start.checked_add(run.len)?,
                })
            })
            .collect()
    }

    /// The whole file's bytes (the mapping).
    pub fn bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Sample `index`. Only the index is checked here: every pointer was
    /// validated at open.
    pub fn sample(&self, index: usize) -> Result<Sample<'_>> {
        let row = self
            .layout
            .row(self.data.bytes(), index as u64)
            .filter(|_| index < self.len())
            .ok_or_else(|| Error::OutOfRange {
                path: self.path.clone(),
                index: index as u64,
                len: self.len() as u64,
            })?;
        Ok(Sample {
            reader: self,
            index,
            row,
        })
    }

    /// The run (page or page run) that holds sample `index`, as
    /// `(first_sample, num_samples, file offset, bytes)`.
    fn run_of(&self, k: u64) -> Option<(u64, u64, u64, u64)> {
        let run = self.layout.run(self.data.bytes(), k)?;
        let start = self.layout.page_offset(run.first_page)?;
        Some((run.first_sample, run.num_samples, start, run.len))
    }

    /// Asks the OS to read ahead the pages of these samples
    /// (`madvise(MADV_WILLNEED)`), e.g. for the next batch. A no-op for
    /// in-memory readers; indices out of range are an error.
    pub fn prefetch(&self, indices: &[usize]) -> Result<()> {
        let mut last: Option<(u64, u64)> = None;
        for &i in indices {
            let sample = self.sample(i)?;
            let Some((start, end)) = sample.span() else {
                continue;
            };
            if last == Some((start, end)) {
                continue;
            }
            last = Some((start, end));
            self.data.will_need(start as usize, (end - start) as usize);
        }
        Ok(())
    }

    /// A "quasi-random" epoch order for low-RAM random access (as FFCV's
    /// `QUASI_RANDOM`): runs (pages) are shuffled, then the samples of each
    /// window of `window_pages` consecutive shuffled pages are shuffled
    /// among themselves. Every sample appears once; only `window_pages`
    /// pages need to be resident at a time. Deterministic for a `seed`.
    pub fn quasi_random_order(&self, seed: u64, window_pages: usize) -> Vec<usize> {
        self.shuffled_share(seed, window_pages, 0, 1)
    }

    /// Share `share` of `shares` of the quasi-random order of `seed`, for
    /// loader workers (and ranks) that read one file without talking to
    /// each other: the shuffled runs are dealt out whole, each to the share
    /// with the fewest samples so far, then each share's samples are
    /// shuffled within windows of `window_pages` of its own pages. Every
    /// share computes the same deal from the same seed, so the shares are
    /// disjoint and together hold every sample once; their sizes differ by
    /// at most one run. With one share this is
    /// [`quasi_random_order`](Self::quasi_random_order).
    pub fn quasi_random_share(
        &self,
        seed: u64,
        window_pages: usize,
        share: usize,
        shares: usize,
    ) -> Result<Vec<usize>> {
        if share >= shares {
            return Err(Error::invalid(
                &self.path,
                "share",
                format!("share {share} of {shares}: give 0 <= share < shares"),
            ));
        }
        Ok(self.shuffled_share(seed, window_pages, share, shares))
    }

    fn shuffled_share(
        &self,
        seed: u64,
        window_pages: usize,
        share: usize,
        shares: usize,
    ) -> Vec<usize> {
        let mut rng = SplitMix64(seed ^ 0x9E37_79B9_7F4A_7C15);
        let mut runs: Vec<(u64, u64)> = (0..self.layout.header.num_runs)
            .filter_map(|k| self.run_of(k).map(|(first, n, _, _)| (first, n)))
            .collect();
        rng.shuffle(&mut runs);
        if shares > 1 {
            let mut load = vec![0u64; shares];
            runs.retain(|&(_, n)| {
                let (least, _) = load
                    .iter()
                    .enumerate()
                    .min_by_key(|&(k, &l)| (l, k))
                    .unwrap_or((0, &0));
                load[least] += n;
                least == share
            });
        }
        let mut order = Vec::with_capacity(runs.iter().map(|r| r.1 as usize).sum());
        for window in runs.chunks(window_pages.max(1)) {
            let from = order.len();
            for &(first, n) in window {
                order.extend((first..first + n).map(|s| s as usize));
            }
            rng.shuffle(&mut order[from..]);
        }
        order
    }

    /// Fills `pool` with the samples `indices`, copying page data into its
    /// pre-allocated per-field buffers: no allocation per batch.
    pub fn fill_batch(&self, indices: &[usize], pool: &mut BufferPool) -> Result<()> {
        if indices.len() > pool.batch_size {
            return Err(Error::PoolTooSmall {
                path: self.path.clone(),
                reason: format!(
                    "batch of {} samples, pool holds {}",
                    indices.len(),
                    pool.batch_size
                ),
            });
        }
        if pool.columns.len() != self.schema().len() {
            return Err(Error::PoolTooSmall {
                path: self.path.clone(),
                reason: "pool was made for another schema".into(),
            });
        }
        pool.len = 0;
        for c in &mut pool.columns {
            c.clear();
        }
        for &i in indices {
            let sample = self.sample(i)?;
            for (f, column) in pool.columns.iter_mut().enumerate() {
                match column {
                    Column::Int(v) => v.push(sample.int(f)?),
                    Column::Float(v) => v.push(sample.float(f)?),
                    Column::Var { data, offsets } => {
                        let b = sample.bytes(f)?;
                        if data.len() + b.len() > data.capacity() {
                            return Err(Error::PoolTooSmall {
                                path: self.path.clone(),
                                reason: format!("field {f}: data buffer full"),
                            });
                        }
                        data.extend_from_slice(b);
                        offsets.push(data.len());
                    }
                }
            }
            pool.len += 1;
        }
        Ok(())
    }
}

impl<'a> Sample<'a> {
    /// The sample's index.
    pub fn index(&self) -> usize {
        self.index
    }

    fn ty(&self, field: usize) -> Result<&'a FieldType> {
        let schema = &self.reader.layout.schema;
        schema.fields().get(field).map(|f| &f.ty).ok_or_else(|| {
            Error::field(
                &self.reader.path,
                field,
                format!("no such field ({} fields)", schema.len()),
            )
        })
    }

    fn wrong(&self, field: usize, want: &str) -> Error {
        let kind = self.ty(field).map(|t| t.kind_name()).unwrap_or("?");
        Error::field(&self.reader.path, field, format!("is {kind}, not {want}"))
    }

    /// The value of field `field`.
    pub fn get(&self, field: usize) -> Result<FieldValue<'a>> {
        Ok(match self.ty(field)? {
            FieldType::Int => FieldValue::Int(self.int(field)?),
            FieldType::Float => FieldValue::Float(self.float(field)?),
            FieldType::Bytes => FieldValue::Bytes(self.bytes(field)?),
            FieldType::Array { .. } => FieldValue::Array(self.array(field)?),
        })
    }

    /// An int field's value.
    pub fn int(&self, field: usize) -> Result<i64> {
        match self.ty(field)? {
            FieldType::Int => Ok(rd_u64(self.row, self.reader.layout.row_offsets[field]) as i64),
            _ => Err(self.wrong(field, "int")),
        }
    }

    /// A float field's value.
    pub fn float(&self, field: usize) -> Result<f64> {
        match self.ty(field)? {
            FieldType::Float => Ok(f64::from_bits(rd_u64(
                self.row,
                self.reader.layout.row_offsets[field],
            ))),
            _ => Err(self.wrong(field, "float")),
        }
    }

    /// A bytes or array field's bytes, borrowed from the file.
    pub fn bytes(&self, field: usize) -> Result<&'a [u8]> {
        if self.ty(field)?.is_inline() {
            return Err(self.wrong(field, "bytes"));
        }
        let at = self.reader.layout.row_offsets[field];
        let ptr = rd_u64(self.row, at);
        let size = rd_u64(self.row, at + 8);
        // Validated at open; the checked slice keeps this panic-free anyway.
        usize::try_from(ptr)
            .ok()
            .zip(usize::try_from(size).ok())
            .and_then(|(p, n)| self.reader.data.bytes().get(p..p.checked_add(n)?))
            .ok_or_else(|| {
                Error::corrupt(
                    &self.reader.path,
                    format!(
                        "sample {} field {field}: {size} bytes at {ptr} outside the file",
                        self.index
                    ),
                )
            })
    }

    /// An array field's value as a zero-copy tensor view.
    pub fn array(&self, field: usize) -> Result<TensorView<'a>> {
        match self.ty(field)? {
            FieldType::Array { dtype, shape } => {
                TensorView::new(*dtype, shape.clone(), self.bytes(field)?).map_err(|source| {
                    Error::Tensor {
                        path: self.reader.path.clone(),
                        source,
                    }
                })
            }
            _ => Err(self.wrong(field, "array")),
        }
    }

    /// File range `[start, end)` covering all of the sample's page data.
    fn span(&self) -> Option<(u64, u64)> {
        let layout = &self.reader.layout;
        let mut span: Option<(u64, u64)> = None;
        for (f, field) in layout.schema.fields().iter().enumerate() {
            if field.ty.is_inline() {
                continue;
            }
            let ptr = rd_u64(self.row, layout.row_offsets[f]);
            let size = rd_u64(self.row, layout.row_offsets[f] + 8);
            if size == 0 {
                continue;
            }
            let end = ptr.saturating_add(size);
            span = Some(match span {
                None => (ptr, end),
                Some((s, e)) => (s.min(ptr), e.max(end)),
            });
        }
        span
    }
}

/// Per-field batch buffers, allocated once for a batch size and the
/// largest value of each field, so that [`PageReader::fill_batch`] never
/// allocates.
#[derive(Debug, Clone)]
pub struct BufferPool {
    batch_size: usize,
    len: usize,
    columns: Vec<Column>,
}

#[derive(Debug, Clone)]
enum Column {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Var { data: Vec<u8>, offsets: Vec<usize> },
}

impl Column {
    fn clear(&mut self) {
        match self {
            Column::Int(v) => v.clear(),
            Column::Float(v) => v.clear(),
            Column::Var { data, offsets } => {
                data.clear();
                offsets.truncate(1);
            }
        }
    }
}

impl BufferPool {
    /// Buffers for batches of up to `batch_size` samples of `reader`'s file
    /// (each bytes field gets `batch_size` times its largest value).
    pub fn new(reader: &PageReader, batch_size: usize) -> Result<BufferPool> {
        let too_big = |f: usize| Error::PoolTooSmall {
            path: reader.path.clone(),
            reason: format!(
                "field {f}: {batch_size} times its largest value does not fit in memory"
            ),
        };
        let mut columns = Vec::with_capacity(reader.schema().len());
        for (f, field) in reader.schema().fields().iter().enumerate() {
            columns.push(match field.ty {
                FieldType::Int => Column::Int(Vec::with_capacity(batch_size)),
                FieldType::Float => Column::Float(Vec::with_capacity(batch_size)),
                FieldType::Bytes | FieldType::Array { .. } => {
                    let cap = usize::try_from(reader.max_sizes()[f])
                        .ok()
                        .and_then(|m| m.checked_mul(batch_size))
                        .ok_or_else(|| too_big(f))?;
                    let mut data = Vec::new();
                    data.try_reserve_exact(cap).map_err(|_| too_big(f))?;
                    let mut offsets = Vec::with_capacity(batch_size + 1);
                    offsets.push(0);
                    Column::Var { data, offsets }
                }
            });
        }
        Ok(BufferPool {
            batch_size,
            len: 0,
            columns,
        })
    }

    /// Samples in the current batch.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the current batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most samples a batch may hold.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// The values of int field `field` in the batch.
    pub fn ints(&self, field: usize) -> Option<&[i64]> {
        match self.columns.get(field)? {
            Column::Int(v) => Some(v),
            _ => None,
        }
    }

    /// The values of float field `field` in the batch.
    pub fn floats(&self, field: usize) -> Option<&[f64]> {
        match self.columns.get(field)? {
            Column::Float(v) => Some(v),
            _ => None,
        }
    }

    /// The bytes of field `field` of the `k`-th sample of the batch.
    pub fn bytes(&self, field: usize, k: usize) -> Option<&[u8]> {
        match self.columns.get(field)? {
            Column::Var { data, offsets } => {
                let (s, e) = (*offsets.get(k)?, *offsets.get(k + 1)?);
                data.get(s..e)
            }
            _ => None,
        }
    }

    /// All bytes of field `field` in the batch, back to back.
    pub fn field_data(&self, field: usize) -> Option<&[u8]> {
        match self.columns.get(field)? {
            Column::Var { data, .. } => Some(data),
            _ => None,
        }
    }
}

/// SplitMix64: a tiny, stable PRNG, so an order is the same on every
/// platform and release.
pub(crate) struct SplitMix64(pub u64);

impl SplitMix64 {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fisher–Yates shuffle.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}
