//! Adopting staged stores: the segments other stores wrote (a Ray job's
//! write tasks, each a single-writer store of its own in a staging
//! directory) published into a cache under one multi-writer.
//!
//! Each staged segment gets a new id in the writer's residue class, above
//! every segment of the cache, so that the adopted records win over older
//! ones of the same keys; the staged groups are re-encoded for those ids
//! (each checksum redone) into the writer's index log. The segment files
//! themselves, their length and their content hash do not change: a
//! rename moves each into place, and the writer log — renamed last — makes
//! them all visible at once (`remote_cache::decide_staged_segments` runs
//! that protocol).

use std::path::{Path, PathBuf};

use durable_fs::FileLock;

use crate::format::{
    self, LOCK_FILE, MAX_WRITER_ID, SEGMENTS_DIR, WRITERS_DIR, encode_group,
    encode_writer_log_header, hashes_of, next_writer_segment, parse_segment_name, writer_lock_name,
    writer_log_name,
};
use crate::{Error, Result};

/// One group of a staged index log: a segment and its rows' key hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StagedGroup {
    group: format::Group,
    hashes: Vec<u64>,
}

/// A staged store's index log, every group checked: what
/// [`adopt_staged`] renumbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedLog {
    name: PathBuf,
    groups: Vec<StagedGroup>,
}

impl StagedLog {
    /// Reads and checks the index log at `path` (a staged store's
    /// `segment-index.log`).
    ///
    /// A staged store is whole when its task returned, so a bad header, a
    /// short group or a checksum that does not match is
    /// [`Error::CorruptLog`] naming the file, never a torn tail to drop.
    pub fn read(path: &Path) -> Result<StagedLog> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            op: "read staged index log",
            source,
        })?;
        StagedLog::parse(&bytes, path)
    }

    /// Checks the index log `bytes`; `name` says whose it is in errors
    /// (a path, or a write task's log received over the network).
    pub fn parse(bytes: &[u8], name: impl Into<PathBuf>) -> Result<StagedLog> {
        let name = name.into();
        let mut groups = Vec::new();
        let parsed = format::parse_index(bytes, |g, body| {
            groups.push(StagedGroup {
                group: g.clone(),
                hashes: hashes_of(body).collect(),
            })
        })
        .map_err(|detail| Error::CorruptLog {
            path: name.clone(),
            detail,
        })?;
        if let Some(detail) = parsed.torn {
            return Err(Error::CorruptLog { path: name, detail });
        }
        Ok(StagedLog { name, groups })
    }

    /// Whose log this is, as errors name it.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// The staged segment ids, in log order.
    pub fn segment_ids(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.groups.iter().map(|g| g.group.segment_id)
    }
}

/// Where one staged segment goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdoptedSegment {
    /// Which of the staged logs it is in (its index in the call's slice).
    pub log: usize,
    /// Its id in the staged store.
    pub staged_id: u32,
    /// Its id in the cache.
    pub id: u32,
}

/// Staged logs renumbered for one writer: the writer log's bytes and where
/// each staged segment goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoption {
    /// The multi-writer that adopts them.
    pub writer: u32,
    /// The writer's whole index log (`writers/writer-NNNN.log`): every
    /// staged group, in order, under its new id.
    pub log: Vec<u8>,
    /// Every staged segment, in the order of the log's groups.
    pub segments: Vec<AdoptedSegment>,
}

/// Renumbers the segments of `logs` (in order, each log's groups in
/// order) into ids of multi-writer `writer`, all greater than `above`
/// (the cache's greatest segment id, `None` for none), and encodes the
/// writer's index log that names them.
///
/// A writer id above [`MAX_WRITER_ID`], or a writer whose ids above
/// `above` run out, is [`Error::InvalidInput`].
pub fn adopt_staged(logs: &[StagedLog], writer: u32, above: Option<u32>) -> Result<Adoption> {
    if writer > MAX_WRITER_ID {
        return Err(Error::InvalidInput(format!(
            "writer_id {writer} exceeds {MAX_WRITER_ID}"
        )));
    }
    let mut log = encode_writer_log_header(writer).to_vec();
    let mut segments = Vec::new();
    let mut last = above;
    for (index, staged) in logs.iter().enumerate() {
        for g in &staged.groups {
            let id = next_writer_segment(writer, last).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "segment ids of writer {writer} are exhausted above {}",
                    last.map_or(-1, i64::from)
                ))
            })?;
            log.extend(encode_group(
                id,
                g.group.segment_len,
                g.group.segment_hash,
                &g.hashes,
            ));
            segments.push(AdoptedSegment {
                log: index,
                staged_id: g.group.segment_id,
                id,
            });
            last = Some(id);
        }
    }
    Ok(Adoption {
        writer,
        log,
        segments,
    })
}

/// The greatest multi-writer id for which `has_log` says the cache has no
/// writer log, or `None` when every id has one. Ids are tried from
/// [`MAX_WRITER_ID`] down, away from the small ids ranks take.
pub fn free_writer(has_log: impl Fn(u32) -> bool) -> Option<u32> {
    (0..=MAX_WRITER_ID).rev().find(|&w| !has_log(w))
}

/// The cache's lock, held *shared* as every multi-writer holds it: a
/// single writer or a compaction cannot run meanwhile, other
/// multi-writers can. [`Error::Locked`] when one of those holds it.
pub fn lock_as_multi_writer(dir: &Path) -> Result<FileLock> {
    let path = dir.join(LOCK_FILE);
    match FileLock::try_shared(&path).map_err(Error::durable)? {
        Some(lock) => Ok(lock),
        None => Err(Error::Locked { path }),
    }
}

/// Takes the greatest multi-writer id of the cache at `dir` that has no
/// writer log and whose lock is free, and returns it with its lock held;
/// [`Error::Locked`] (naming `writers/`) when every id is in use (compact
/// the cache to free them).
pub fn claim_free_writer(dir: &Path) -> Result<(u32, FileLock)> {
    let writers = dir.join(WRITERS_DIR);
    std::fs::create_dir_all(&writers).map_err(|source| Error::Io {
        path: writers.clone(),
        op: "create",
        source,
    })?;
    let has_log = |w: u32| writers.join(writer_log_name(w)).exists();
    for w in (0..=MAX_WRITER_ID).rev() {
        if has_log(w) {
            continue;
        }
        let Some(lock) =
            FileLock::try_exclusive(&writers.join(writer_lock_name(w))).map_err(Error::durable)?
        else {
            continue;
        };
        // Another process may have taken and released it meanwhile.
        if !has_log(w) {
            return Ok((w, lock));
        }
    }
    Err(Error::Locked { path: writers })
}

/// The greatest id of the segment files under `dir/segments` (`None`:
/// none), whatever log names them.
pub fn last_segment_id(dir: &Path) -> Result<Option<u32>> {
    Ok(crate::recover::list_segments(dir)?.into_keys().next_back())
}

/// The greatest id among segment file paths (relative to a cache,
/// `/`-separated, as a commit log lists them); other paths are ignored.
pub fn last_segment_id_of<'a>(paths: impl IntoIterator<Item = &'a str>) -> Option<u32> {
    paths
        .into_iter()
        .filter_map(|p| p.strip_prefix(SEGMENTS_DIR)?.strip_prefix('/'))
        .filter_map(parse_segment_name)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{WRITER_STRIDE, encode_index_header, parse_index};

    fn staged(groups: &[(u32, &[u64])]) -> Vec<u8> {
        let mut log = encode_index_header().to_vec();
        for (id, hashes) in groups {
            log.extend(encode_group(*id, 100 + u64::from(*id), 7, hashes));
        }
        log
    }

    #[test]
    fn adoption_renumbers_into_the_writer_class_above_the_cache() {
        let a = StagedLog::parse(&staged(&[(0, &[1, 2]), (1, &[3])]), "a").unwrap();
        let b = StagedLog::parse(&staged(&[(0, &[4])]), "b").unwrap();
        let done = adopt_staged(&[a, b], 4095, Some(9000)).unwrap();
        let ids: Vec<u32> = done.segments.iter().map(|s| s.id).collect();
        assert_eq!(
            ids,
            [
                3 * WRITER_STRIDE - 1,
                4 * WRITER_STRIDE - 1,
                5 * WRITER_STRIDE - 1
            ]
        );
        assert_eq!(
            done.segments
                .iter()
                .map(|s| (s.log, s.staged_id))
                .collect::<Vec<_>>(),
            [(0, 0), (0, 1), (1, 0)]
        );
        let mut seen = Vec::new();
        let parsed = parse_index(&done.log, |g, body| {
            seen.push((
                g.segment_id,
                g.segment_len,
                hashes_of(body).collect::<Vec<_>>(),
            ))
        })
        .unwrap();
        assert_eq!(parsed.writer, Some(4095));
        assert!(parsed.torn.is_none());
        assert_eq!(
            seen,
            [
                (ids[0], 100, vec![1, 2]),
                (ids[1], 101, vec![3]),
                (ids[2], 100, vec![4])
            ]
        );
    }

    #[test]
    fn exhausted_ids_and_bad_writers_are_refused() {
        let a = StagedLog::parse(&staged(&[(0, &[1])]), "a").unwrap();
        assert!(matches!(
            adopt_staged(std::slice::from_ref(&a), 4096, None),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            adopt_staged(&[a], 5, Some(u32::MAX - 1)),
            Err(Error::InvalidInput(_))
        ));
    }

    #[test]
    fn free_writers_and_last_ids() {
        assert_eq!(free_writer(|_| false), Some(MAX_WRITER_ID));
        assert_eq!(free_writer(|w| w > 10), Some(10));
        assert_eq!(free_writer(|_| true), None);
        let paths = ["schema.json", "segments/segment_000007.arrow", "segments/x"];
        assert_eq!(last_segment_id_of(paths), Some(7));
        assert_eq!(last_segment_id_of(["writers/writer-0001.log"]), None);
    }
}
