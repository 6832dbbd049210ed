//! [`ArraysAt`]: a finished memmap-array cache on a location, read by
//! block ranges.

use std::ops::Range;

use memmap_array::{MemmapArray, Row};
use remote_tier::{RemoteFile, Warming, WarmingSet};
use tensor_core::TensorView;

use crate::location::Location;
use crate::remote_dir::RemoteDir;
use crate::{Error, Result};
use crate::{StoreFiles, StoreKind};

/// A finished memmap-array cache on a [`Location`], read by block ranges:
/// the `.bin` arrays of a remote cache stay sparse files in the local
/// tier (linked into the working directory, mapped by the reader as
/// usual), and each read first fetches the blocks of its rows.
#[derive(Debug)]
pub struct ArraysAt {
    cache: MemmapArray,
    remote: Option<RemoteDir>,
    /// Per array (schema order): the tier object its file maps (`None`
    /// when copied whole or local) and bytes per row.
    bins: Vec<(Option<RemoteFile>, u64)>,
}

impl ArraysAt {
    /// Opens the finished cache at `location`.
    pub fn open(location: &Location) -> Result<ArraysAt> {
        let opened = location.open(StoreFiles::for_kind(StoreKind::MemmapArray))?;
        ArraysAt::open_in(&opened.dir, opened.remote)
    }

    /// The finished cache `cache`, open in a local directory, as a store
    /// read where it lies.
    pub fn from_local(cache: MemmapArray) -> Result<ArraysAt> {
        ArraysAt::wrap(cache, None)
    }

    /// Opens the finished cache at `location` and, with `load_fraction`,
    /// copies its arrays into RAM ([`MemmapArray::load_in_memory_with`]):
    /// for a local directory only, since a URL's arrays are read by blocks
    /// through the local tier ([`Error::BadLocation`] for a URL).
    pub fn open_loaded(location: &Location, load_fraction: f64) -> Result<ArraysAt> {
        if !matches!(location, Location::Local(_)) {
            return Err(Error::BadLocation {
                root: location.shown(),
                problem: "load_in_memory is for a local cache: a URL's arrays are read by \
                          blocks through the local tier"
                    .into(),
            });
        }
        let mut opened = ArraysAt::open(location)?;
        opened.cache.load_in_memory_with(load_fraction)?;
        Ok(opened)
    }

    /// Opens the finished cache in the working directory of `remote` (a
    /// commit log opened by the caller with the files of
    /// [`StoreKind::MemmapArray`], e.g. over a wrapped object store).
    pub fn with_remote(remote: RemoteDir) -> Result<ArraysAt> {
        let dir = remote.dir().to_path_buf();
        ArraysAt::open_in(&dir, Some(remote))
    }

    fn open_in(dir: &std::path::Path, remote: Option<RemoteDir>) -> Result<ArraysAt> {
        ArraysAt::wrap(MemmapArray::open(dir)?, remote)
    }

    /// The open cache `cache`, its arrays read through `remote`'s objects
    /// (where it has them) or where they lie.
    fn wrap(cache: MemmapArray, remote: Option<RemoteDir>) -> Result<ArraysAt> {
        // The objects the arrays map (nothing refreshes the commit log in
        // between: this handle is its only owner yet).
        let bins = cache
            .schema()
            .arrays()
            .iter()
            .map(|a| {
                let file = memmap_array::bin_file(a.name());
                let object = remote.as_ref().and_then(|r| r.object(&file));
                (object, a.row_bytes() as u64)
            })
            .collect::<Vec<_>>();
        // The reader maps each array on its first read, by name. Map every
        // remote one now, while its link still names the object held above:
        // after a refresh that relinks the name, a first read would map the
        // new object while ensures fetch into this one (zeros served).
        for (k, (object, _)) in bins.iter().enumerate() {
            if object.is_some() {
                for i in 0..cache.len() {
                    if cache.array_at(i, k)?.is_some() {
                        break;
                    }
                }
            }
        }
        Ok(ArraysAt {
            cache,
            remote,
            bins,
        })
    }

    /// The cache. Its rows are local only after
    /// [`ensure_rows`](Self::ensure_rows) (or through [`row`](Self::row),
    /// [`array`](Self::array)); bytes not fetched read as zeros.
    pub fn cache(&self) -> &MemmapArray {
        &self.cache
    }

    /// The commit log behind a remote cache (`None` for a local one).
    pub fn remote(&self) -> Option<&RemoteDir> {
        self.remote.as_ref()
    }

    /// Makes rows `rows` of every array local (their blocks fetched in
    /// parallel, the next ones prefetched).
    pub fn ensure_rows(&self, rows: Range<u64>) -> Result<()> {
        let rows = rows.start.min(self.cache.len())..rows.end.min(self.cache.len());
        for (object, row_bytes) in &self.bins {
            if let Some(object) = object {
                object.ensure(rows.start * row_bytes..rows.end * row_bytes)?;
            }
        }
        Ok(())
    }

    /// Starts fetching rows `rows` of every array into the local tier in
    /// the background, in that order (the next epoch's), at most the
    /// tier's budget of bytes in all. Reads meanwhile fetch what they need
    /// first; a row whose blocks arrived sends no request. A local cache
    /// asks the kernel to read the rows ahead instead
    /// ([`MemmapArray::prefetch`]), and the set returned is empty.
    pub fn prefetch(&self, rows: &[u64]) -> WarmingSet {
        if self.remote.is_none() {
            rows.iter().for_each(|&i| self.cache.prefetch(i));
            return WarmingSet::default();
        }
        let budget = self
            .remote
            .as_ref()
            .map_or(0, |r| r.tier().config().tier_budget);
        let objects = self.bins.iter().filter(|(o, _)| o.is_some()).count().max(1) as u64;
        let fills = self
            .bins
            .iter()
            .filter_map(|(object, row_bytes)| {
                let object = object.as_ref()?;
                let ranges: Vec<Range<u64>> = rows
                    .iter()
                    .filter(|&&i| i < self.cache.len())
                    .map(|&i| i * row_bytes..(i + 1) * row_bytes)
                    .collect();
                Some(object.warm(&ranges, budget / objects))
            })
            .collect();
        Warming::all(fills)
    }

    /// Row `i`, fetched first (see [`MemmapArray::row`]).
    pub fn row(&self, i: u64) -> Result<Row<'_>> {
        self.ensure_rows(i..i.saturating_add(1))?;
        Ok(self.cache.row(i)?)
    }

    /// Array `name` of row `i`, fetched first (see [`MemmapArray::array`]).
    pub fn array(&self, i: u64, name: &str) -> Result<Option<TensorView<'_>>> {
        if let Some(k) = self.cache.schema().array_index(name)
            && let Some((Some(object), row_bytes)) = self.bins.get(k)
            && i < self.cache.len()
        {
            object.ensure(i * row_bytes..(i + 1) * row_bytes)?;
        }
        Ok(self.cache.array(i, name)?)
    }
}
