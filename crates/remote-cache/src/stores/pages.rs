//! [`PagesAt`]: a page-alloc file on a location, read by block ranges.
//!
//! The page file of a remote cache is linked leased
//! ([`StoreFiles::evict_blocks`](crate::StoreFiles::evict_blocks)): the
//! tier may free any of its blocks while it is open, except those a
//! [`Lease`] holds. So the reader leases its header and tables for its
//! life (the reader keeps them mapped), and every read leases the runs it
//! reads for as long as it reads them ([`PagesAt::lease_samples`]).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use page_alloc::format::RunSpan;
use page_alloc::{PageReader, Sample};
use remote_tier::{Lease, PlanHandle, RemoteFile, Warming, WarmingSet};

use crate::location::Location;
use crate::remote_dir::RemoteDir;
use crate::{Error, Result};
use crate::{StoreFiles, StoreKind};

/// A page-alloc file on a [`Location`], read by block ranges: the file of
/// a remote cache stays a sparse file in the local tier; its header and
/// tables are fetched on open, each sample's run (page) before it is read,
/// and the tier keeps only what its budget holds (with a plan registered,
/// [`set_plan`](Self::set_plan), what is needed soonest).
#[derive(Debug)]
pub struct PagesAt {
    reader: PageReader,
    remote: Option<RemoteDir>,
    /// The tier object the reader maps (`None` when copied whole or
    /// local): runs are fetched into the file mapped, whatever a later
    /// commit links the name to.
    object: Option<RemoteFile>,
    /// Where each run's samples lie.
    runs: Vec<RunSpan>,
    /// Runs seen local at generation `ready_at` of the tier: a run may be
    /// freed since only if the generation moved.
    ready: Vec<AtomicBool>,
    ready_at: AtomicU64,
    /// The header and tables, which the reader keeps mapped: leased for
    /// the reader's life (dropped after it).
    _tables: Option<Lease>,
}

/// A sample of a [`PagesAt`] with the lease that keeps its run local:
/// its bytes stay while this lives (it derefs to the [`Sample`]).
#[derive(Debug)]
pub struct LeasedSample<'a> {
    sample: Sample<'a>,
    _lease: Option<Lease>,
}

impl<'a> std::ops::Deref for LeasedSample<'a> {
    type Target = Sample<'a>;

    fn deref(&self) -> &Sample<'a> {
        &self.sample
    }
}

impl PagesAt {
    /// Opens the page file `file` (a name inside the cache directory,
    /// ending `.pages`) at `location`.
    pub fn open(location: &Location, file: &str) -> Result<PagesAt> {
        PagesAt::open_with(location, file, &page_alloc::ReadOptions::default())
    }

    /// As [`open`](Self::open), with `options` for a file that is read
    /// where it lies (a local directory's: pre-faulted, every page hashed
    /// at open; see [`page_alloc::ReadOptions`]). A file read through the
    /// tier is fetched by runs, so the options do not apply to it.
    pub fn open_with(
        location: &Location,
        file: &str,
        options: &page_alloc::ReadOptions,
    ) -> Result<PagesAt> {
        let opened = location.open(StoreFiles::for_kind(StoreKind::PageAlloc))?;
        PagesAt::open_in(opened.dir, opened.remote, file, options)
    }

    /// Opens the page file `file` in the working directory of `remote` (a
    /// commit log opened by the caller with the files of
    /// [`StoreKind::PageAlloc`]).
    pub fn with_remote(remote: RemoteDir, file: &str) -> Result<PagesAt> {
        let options = page_alloc::ReadOptions::default();
        PagesAt::open_in(remote.dir().to_path_buf(), Some(remote), file, &options)
    }

    fn open_in(
        dir: std::path::PathBuf,
        remote: Option<RemoteDir>,
        file: &str,
        options: &page_alloc::ReadOptions,
    ) -> Result<PagesAt> {
        let path = dir.join(file);
        let object = remote.as_ref().and_then(|r| r.object(file));
        let tables = match &object {
            Some(object) => {
                let len = object.len();
                let fixed = (page_alloc::format::HEADER_FIXED_LEN as u64).min(len);
                let head_lease = object.lease(std::slice::from_ref(&(0..fixed)))?;
                let head = read_at(&path, 0, fixed as usize)?;
                let tables = object.lease(&page_alloc::format::open_ranges(&head, len))?;
                drop(head_lease);
                Some(tables)
            }
            None => None,
        };
        let reader = match &object {
            Some(_) => PageReader::open(&path)?,
            None => PageReader::open_with(&path, options)?,
        };
        let runs = if object.is_some() {
            reader.run_spans()
        } else {
            Vec::new()
        };
        let ready = runs.iter().map(|_| AtomicBool::new(false)).collect();
        let ready_at = AtomicU64::new(object.as_ref().map_or(0, RemoteFile::generation));
        Ok(PagesAt {
            reader,
            remote,
            object,
            runs,
            ready,
            ready_at,
            _tables: tables,
        })
    }

    /// The reader. Samples are local only after
    /// [`ensure_samples`](Self::ensure_samples) (or through
    /// [`sample`](Self::sample)); bytes not fetched read as zeros.
    pub fn reader(&self) -> &PageReader {
        &self.reader
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Makes the pages of samples `indices` local and keeps them so until
    /// the returned lease drops (no process's eviction frees a leased
    /// block): hold it across the reads of those samples. `None` for a
    /// file not read through the tier.
    pub fn lease_samples(&self, indices: &[usize]) -> Result<Option<Lease>> {
        let Some(object) = &self.object else {
            return Ok(None);
        };
        self.forget_if_evicted(object);
        let mut runs: Vec<usize> = indices.iter().filter_map(|&i| self.run_of(i)).collect();
        runs.sort_unstable();
        runs.dedup();
        let ranges: Vec<Range<u64>> = runs.iter().map(|&k| self.runs[k].bytes.clone()).collect();
        let lease = object.lease(&ranges)?;
        for k in runs {
            self.ready[k].store(true, Ordering::Release);
        }
        Ok(Some(lease))
    }

    /// Makes bytes `range` of the file local and keeps them so until the
    /// returned lease drops: a whole-file check (`page_alloc::verify_with`)
    /// holds one run at a time, so it stays within the tier's budget.
    /// `None` for a file not read through the tier, or an empty range.
    pub fn lease_bytes(&self, range: Range<u64>) -> Result<Option<Lease>> {
        let Some(object) = &self.object else {
            return Ok(None);
        };
        if range.is_empty() {
            return Ok(None);
        }
        Ok(Some(object.lease(std::slice::from_ref(&range))?))
    }

    /// Makes the pages of samples `indices` local: a
    /// [`lease_samples`](Self::lease_samples) dropped at once, so the
    /// pages may be freed again as soon as it returns (on a file larger
    /// than the tier's budget they will be): lease across the reads
    /// instead.
    pub fn ensure_samples(&self, indices: &[usize]) -> Result<()> {
        self.lease_samples(indices).map(drop)
    }

    /// Forgets which runs were local when the tier freed something since
    /// they were seen.
    fn forget_if_evicted(&self, object: &RemoteFile) {
        let now = object.generation();
        if self.ready_at.swap(now, Ordering::AcqRel) != now {
            for r in &self.ready {
                r.store(false, Ordering::Release);
            }
        }
    }

    /// Registers this reader's plan: sample `samples[j]` is read at
    /// `positions[j]` of the reader's batch clock (`0..epoch_len` this
    /// epoch, `epoch_len..2·epoch_len` the next; see
    /// [`RemoteFile::set_plan`]). The local tier then evicts the pages
    /// needed furthest ahead first. `None` for a file not read through
    /// the tier (local, or copied whole). The plan counts until the
    /// handle is dropped; [`PlanHandle::advance`] it after each batch.
    pub fn set_plan(
        &self,
        samples: &[usize],
        positions: &[u64],
        epoch_len: u64,
    ) -> Result<Option<PlanHandle>> {
        let invalid = |reason: String| {
            Error::Page(page_alloc::Error::Invalid {
                path: self.reader.path().to_path_buf(),
                what: "plan",
                reason,
            })
        };
        if samples.len() != positions.len() {
            return Err(invalid(format!(
                "{} samples but {} positions",
                samples.len(),
                positions.len()
            )));
        }
        let len = self.reader.len();
        if let Some(&i) = samples.iter().find(|&&i| i >= len) {
            return Err(Error::Page(page_alloc::Error::OutOfRange {
                path: self.reader.path().to_path_buf(),
                index: i as u64,
                len: len as u64,
            }));
        }
        if let Some(&p) = positions
            .iter()
            .find(|&&p| p >= epoch_len.saturating_mul(2))
        {
            return Err(invalid(format!(
                "position {p} outside this epoch and the next ({epoch_len} batches each)"
            )));
        }
        let Some(object) = &self.object else {
            return Ok(None);
        };
        let mut uses: Vec<(Range<u64>, u64)> = Vec::new();
        let mut last = None;
        for (&i, &position) in samples.iter().zip(positions) {
            let Some(k) = self.run_of(i) else { continue };
            if last != Some((k, position)) {
                uses.push((self.runs[k].bytes.clone(), position));
                last = Some((k, position));
            }
        }
        Ok(Some(object.set_plan(&uses, epoch_len)?))
    }

    /// The run that holds sample `i` (`None` before the first run).
    fn run_of(&self, i: usize) -> Option<usize> {
        let k = self.runs.partition_point(|r| r.first_sample <= i as u64);
        k.checked_sub(1)
    }

    /// Starts fetching the pages of samples `indices` into the local tier
    /// in the background, in that order (the next epoch's), at most the
    /// tier's budget of bytes — MosaicML's `predownload`. Reads meanwhile
    /// fetch what they need first; a sample whose pages arrived sends no
    /// request. A prefetched page never evicts one a plan needs sooner.
    /// A file read where it lies asks the kernel to read the pages ahead
    /// instead ([`PageReader::prefetch`]: a hint, so samples out of range
    /// are passed over), and the set returned is empty.
    pub fn prefetch(&self, indices: &[usize]) -> WarmingSet {
        let Some(object) = &self.object else {
            let len = self.reader.len();
            let within: Vec<usize> = indices.iter().copied().filter(|&i| i < len).collect();
            // A hint: a sample whose run does not read is reported by its read.
            let _ = self.reader.prefetch(&within);
            return WarmingSet::default();
        };
        self.forget_if_evicted(object);
        let mut ranges: Vec<Range<u64>> = Vec::new();
        let mut last = None;
        for &i in indices {
            let Some(k) = self.run_of(i) else { continue };
            if last != Some(k) && !self.ready[k].load(Ordering::Acquire) {
                ranges.push(self.runs[k].bytes.clone());
            }
            last = Some(k);
        }
        let budget = self
            .remote
            .as_ref()
            .map_or(0, |r| r.tier().config().tier_budget);
        Warming::all(vec![object.warm(&ranges, budget)])
    }

    /// Sample `index`, its page fetched first and leased while the
    /// returned sample lives (see [`PageReader::sample`]).
    pub fn sample(&self, index: usize) -> Result<LeasedSample<'_>> {
        let lease = self.lease_samples(&[index])?;
        Ok(LeasedSample {
            sample: self.reader.sample(index)?,
            _lease: lease,
        })
    }
}

fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).map_err(Error::io("open", path))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .map_err(Error::io("read", path))?;
    Ok(buf)
}
