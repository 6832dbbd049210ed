//! [`RemotePages`]: a page-alloc file on a location, read by block ranges.

use page_alloc::{PageReader, Sample};
use remote_tier::RemoteFile;

use super::nothing_private;
use crate::journal::RemoteDir;
use crate::location::Location;
use crate::{Error, Result};

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
    /// Per run: first sample, file offset, bytes.
    runs: Vec<(u64, u64, u64)>,
    /// Runs known local: the held object's blocks stay, so each run is
    /// ensured once.
    ready: Vec<std::sync::atomic::AtomicBool>,
}

fn pages_by_blocks(path: &str, _: u64) -> bool {
    path.ends_with(".pages")
}

impl RemotePages {
    /// Opens the page file `file` (a name inside the cache directory,
    /// ending `.pages`) at `location`.
    pub fn open(location: &Location, file: &str) -> Result<RemotePages> {
        let opened = location.open(pages_by_blocks, nothing_private)?;
        RemotePages::open_in(opened.dir, opened.remote, file)
    }

    /// Opens the page file `file` in the working directory of `remote` (a
    /// commit log opened by the caller with [`RemotePages::BY_BLOCKS`]).
    pub fn with_remote(remote: RemoteDir, file: &str) -> Result<RemotePages> {
        RemotePages::open_in(remote.dir().to_path_buf(), Some(remote), file)
    }

    /// The files a page cache reads by blocks (for [`RemoteDir::open`]).
    pub const BY_BLOCKS: crate::journal::ReadByBlocks = pages_by_blocks;

    fn open_in(
        dir: std::path::PathBuf,
        remote: Option<RemoteDir>,
        file: &str,
    ) -> Result<RemotePages> {
        let opened = crate::location::Opened { dir, remote };
        let path = opened.dir.join(file);
        let object = opened.remote.as_ref().and_then(|r| r.object(file));
        if let Some(object) = &object {
            let len = object.len();
            let fixed = (page_alloc::format::HEADER_FIXED_LEN as u64).min(len);
            object.ensure(0..fixed)?;
            let head = read_at(&path, 0, fixed as usize)?;
            let header_len = u64::from(le32(&head, 12));
            let meta_offset = le64(&head, 64);
            // Out-of-file values are left for the reader to report.
            object.ensure(0..header_len.min(len))?;
            object.ensure(meta_offset.min(len)..len)?;
        }
        let reader = PageReader::open(&path)?;
        let runs = if object.is_some() {
            run_table(&reader)
        } else {
            Vec::new()
        };
        let ready = runs
            .iter()
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect();
        Ok(RemotePages {
            reader,
            remote: opened.remote,
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
            let k = self.runs.partition_point(|r| r.0 <= i as u64);
            let Some(k) = k.checked_sub(1) else { continue };
            if last == Some(k) || self.ready[k].load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            last = Some(k);
            let (_, start, len) = self.runs[k];
            object.ensure(start..start + len)?;
            self.ready[k].store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(())
    }

    /// Sample `index`, its page fetched first (see [`PageReader::sample`]).
    pub fn sample(&self, index: usize) -> Result<Sample<'_>> {
        self.ensure_samples(&[index])?;
        Ok(self.reader.sample(index)?)
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn le64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).map_err(Error::io("open", path))?;
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .map_err(Error::io("read", path))?;
    Ok(buf)
}

/// The run table of a validated page file: (first sample, offset, bytes)
/// per run. The reader checked every run against the file at open.
fn run_table(reader: &PageReader) -> Vec<(u64, u64, u64)> {
    let b = reader.bytes();
    let page_size = le64(b, 16);
    let data_offset = le64(b, 40);
    let num_runs = le64(b, 48);
    let runs_offset = le64(b, 72);
    let run_len = page_alloc::format::RUN_LEN as u64;
    (0..num_runs)
        .filter_map(|k| {
            let at = usize::try_from(runs_offset.checked_add(k.checked_mul(run_len)?)?).ok()?;
            let first_page = le64(b, at);
            let len = le64(b, at + 16);
            let first_sample = le64(b, at + 24);
            let start = data_offset.checked_add(first_page.checked_mul(page_size)?)?;
            Some((first_sample, start, len))
        })
        .collect()
}
