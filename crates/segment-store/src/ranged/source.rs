//! [`SegmentRanges`]: what a reader of byte ranges provides, and the
//! checked reads of it the other stages make.

use std::ops::Range;
use std::path::Path;

use crate::BoxError;
use crate::{Error, Result};

/// Byte ranges of segment files that are not whole on local disk.
pub trait SegmentRanges: Sync {
    /// Whether the segment at `path` is whole locally: the store then maps
    /// and reads it as usual.
    fn is_local(&self, path: &Path) -> bool;

    /// Whether every segment is whole locally right now, when the source
    /// can tell at once (a warm cache): the lookup is then the usual one,
    /// with no pass over the keys to sort them first. `false` when unsure.
    fn all_local(&self) -> bool {
        false
    }

    /// The bytes of each of `ranges` of the segment at `path`, fetched as
    /// needed and checked against what their publisher recorded; all of a
    /// call's ranges may be fetched at once.
    fn read_ranges(
        &self,
        path: &Path,
        ranges: &[Range<u64>],
    ) -> std::result::Result<Vec<Vec<u8>>, BoxError>;

    /// Whether to read the segment at `path` whole (made whole, then
    /// mapped, as the usual read does) rather than `rows` of its `of`
    /// rows through ranges: where many of its rows are read, a few large
    /// requests beat many small ones. Never, unless the reader says so.
    fn read_whole(&self, path: &Path, rows: usize, of: usize) -> bool {
        let _ = (path, rows, of);
        false
    }
}

/// `src.read_ranges`, its answer checked for shape.
pub(super) fn read(
    path: &Path,
    src: &dyn SegmentRanges,
    ranges: &[Range<u64>],
) -> Result<Vec<Vec<u8>>> {
    let got = src
        .read_ranges(path, ranges)
        .map_err(|source| Error::Fetch {
            path: path.to_path_buf(),
            source,
        })?;
    let fits = got.len() == ranges.len()
        && got
            .iter()
            .zip(ranges)
            .all(|(g, r)| g.len() as u64 == r.end - r.start);
    if !fits {
        return Err(Error::Fetch {
            path: path.to_path_buf(),
            source: "the reader returned other lengths than the ranges asked".into(),
        });
    }
    Ok(got)
}

/// [`read`] of one range.
pub(super) fn read_one(path: &Path, src: &dyn SegmentRanges, range: Range<u64>) -> Result<Vec<u8>> {
    let mut got = read(path, src, std::slice::from_ref(&range))?;
    Ok(got.pop().unwrap_or_default())
}
