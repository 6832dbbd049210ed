//! [`RemotePages`]: a page-alloc file on a location, read by block ranges.

use page_alloc::format::RunSpan;
use page_alloc::{PageReader, Sample};
use remote_tier::{PlanHandle, RemoteFile, Warming, WarmingSet};

use crate::location::Location;
use crate::remote_dir::RemoteDir;
use crate::{Error, Result};
use crate::{StoreFiles, StoreKind};

/// A page-alloc file on a [`Location`], read by block ranges: the file of
/// a remote cache stays a sparse file in the local tier; its header and
/// tables are fetched on open, each sample's run (page) before it is read.
#[derive(Debug)]
pub struct RemotePages {
    reader: PageReader,
    remote: Option<RemoteDir>,
    /// The tier object the reader maps (`None` when copied whole or
    /// local): held, so that its copy stays (the tier never evicts an
    /// object a handle holds) and runs are fetched into the file mapped,
    /// whatever a later commit links the name to.
    object: Option<RemoteFile>,
    /// Where each run's samples lie.
    runs: Vec<RunSpan>,
    /// Runs known local: the held object's blocks stay, so each run is
    /// ensured once.
    ready: Vec<std::sync::atomic::AtomicBool>,
}

impl RemotePages {
    /// Opens the page file `file` (a name inside the cache directory,
    /// ending `.pages`) at `location`.
    pub fn open(location: &Location, file: &str) -> Result<RemotePages> {
        let opened = location.open(StoreFiles::for_kind(StoreKind::PageAlloc))?;
        RemotePages::open_in(opened.dir, opened.remote, file)
    }

    /// Opens the page file `file` in the working directory of `remote` (a
    /// commit log opened by the caller with the files of
    /// [`StoreKind::PageAlloc`]).
    pub fn with_remote(remote: RemoteDir, file: &str) -> Result<RemotePages> {
        RemotePages::open_in(remote.dir().to_path_buf(), Some(remote), file)
    }

    fn open_in(
        dir: std::path::PathBuf,
        remote: Option<RemoteDir>,
        file: &str,
    ) -> Result<RemotePages> {
        let path = dir.join(file);
        let object = remote.as_ref().and_then(|r| r.object(file));
        if let Some(object) = &object {
            let len = object.len();
            let fixed = (page_alloc::format::HEADER_FIXED_LEN as u64).min(len);
            object.ensure(0..fixed)?;
            let head = read_at(&path, 0, fixed as usize)?;
            for range in page_alloc::format::open_ranges(&head, len) {
                object.ensure(range)?;
            }
        }
        let reader = PageReader::open(&path)?;
        let runs = if object.is_some() {
            reader.run_spans()
        } else {
            Vec::new()
        };
        let ready = runs
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        Ok(RemotePages {
            reader,
            remote,
            object,
            runs,
            ready,
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

    /// Makes the pages of samples `indices` local.
    pub fn ensure_samples(&self, indices: &[usize]) -> Result<()> {
        let Some(object) = &self.object else {
            return Ok(());
        };
        let mut last = None;
        for &i in indices {
            let Some(k) = self.run_of(i) else { continue };
            if last == Some(k) || self.ready[k].load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            last = Some(k);
            object.ensure(self.runs[k].bytes.clone())?;
            self.ready[k].store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(())
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
        let mut uses: Vec<(std::ops::Range<u64>, u64)> = Vec::new();
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
    /// request. Nothing to do for a local file.
    pub fn prefetch(&self, indices: &[usize]) -> WarmingSet {
        let Some(object) = &self.object else {
            return WarmingSet::default();
        };
        let mut ranges: Vec<std::ops::Range<u64>> = Vec::new();
        let mut last = None;
        for &i in indices {
            let Some(k) = self.run_of(i) else { continue };
            if last != Some(k) && !self.ready[k].load(std::sync::atomic::Ordering::Acquire) {
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

    /// Sample `index`, its page fetched first (see [`PageReader::sample`]).
    pub fn sample(&self, index: usize) -> Result<Sample<'_>> {
        self.ensure_samples(&[index])?;
        Ok(self.reader.sample(index)?)
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
