//! `verify` and `inspect` of a root: what the `cachex` CLI reports.

use std::path::{Path, PathBuf};

use cache_check::{Problem, ProblemKind};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::{
    self, COMPLETED_FILE, METADATA_FILE, Metadata, QUARANTINE_DIR, SCRATCH_DIR, SHARDS_DIR,
    ShardName,
};
use crate::reader::{list_shards, read_metadata_file, read_shard};
use crate::value::PickleValue;

/// A summary of a root, from [`inspect`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inspection {
    /// The root directory.
    pub root: PathBuf,
    /// The stored metadata.
    #[serde(skip)]
    pub metadata: Metadata,
    /// Items per full shard.
    pub max_shard_length: u64,
    /// The length if final.
    pub length: Option<u64>,
    /// `"zstd"` or `None`.
    pub compression: Option<String>,
    /// Shard files present.
    pub shards: usize,
    /// Items held by the shard files present.
    pub items_cached: u64,
    /// Bytes of the shard files present.
    pub bytes_on_disk: u64,
    /// Whether every shard of a known length is present.
    pub complete: bool,
    /// Files left in `scratch/` (interrupted writes).
    pub scratch_files: usize,
    /// Files in `quarantine/`.
    pub quarantined: usize,
}

impl Inspection {
    /// The summary in the shared shape the `cachex` tool prints.
    pub fn summary(&self) -> cache_check::Summary {
        cache_check::Summary::new("shard-store", &self.root)
            .fact("format_version", format::FORMAT_VERSION)
            .fact("max_shard_length", self.max_shard_length)
            .fact("length", self.length)
            .fact("compression", self.compression.clone())
            .fact("shards", self.shards)
            .fact("items_cached", self.items_cached)
            .fact("bytes_on_disk", self.bytes_on_disk)
            .fact("complete", self.complete)
            .fact("scratch_files", self.scratch_files)
            .fact("quarantined", self.quarantined)
            .fact("info", self.metadata.info.clone())
    }
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(|e| e.ok()).count())
}

/// Summarizes a root without decoding any shard.
pub fn inspect(root: impl AsRef<Path>) -> Result<Inspection> {
    let root = root.as_ref();
    let meta_path = root.join(METADATA_FILE);
    let metadata = read_metadata_file(&meta_path)?.ok_or_else(|| Error::BadMetadata {
        path: meta_path.clone(),
        reason: "missing".into(),
    })?;
    let compression = metadata.compression();
    let dir = root.join(SHARDS_DIR);
    let names = list_shards(&dir, compression)?;
    let mut bytes = 0;
    for n in &names {
        bytes += std::fs::metadata(dir.join(n.file_name(compression))).map_or(0, |m| m.len());
    }
    let length = metadata.length_final.then_some(metadata.length);
    let complete = length.is_some_and(|l| crate::writer::covers(&names, l));
    Ok(Inspection {
        root: root.to_path_buf(),
        max_shard_length: metadata.max_shard_length,
        length,
        compression: metadata.compression.clone(),
        shards: names.len(),
        items_cached: names.iter().map(|n| n.len()).sum(),
        bytes_on_disk: bytes,
        complete,
        scratch_files: count_files(&root.join(SCRATCH_DIR)),
        quarantined: count_files(&root.join(QUARANTINE_DIR)),
        metadata,
    })
}

/// Checks a root and returns every problem found (empty: healthy).
/// Decodes every shard as generic pickle values; never modifies anything.
/// Never fails: a root that cannot be listed is a problem naming the
/// directory that stopped the check.
pub fn verify(root: impl AsRef<Path>) -> Vec<Problem> {
    let root = root.as_ref();
    let mut problems = Vec::new();
    let meta_path = root.join(METADATA_FILE);
    let metadata = match read_metadata_file(&meta_path) {
        Ok(Some(m)) => m,
        Ok(None) => {
            problems.push(Problem::new(meta_path, ProblemKind::Missing, "missing"));
            return problems;
        }
        Err(e) => {
            problems.push(problem_of(&e, &meta_path));
            return problems;
        }
    };
    let compression = metadata.compression();
    let dir = root.join(SHARDS_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) => {
            problems.push(problem_of(&Error::io("list shards", &dir)(e), &dir));
            return problems;
        }
    };
    let mut names: Vec<ShardName> = Vec::new();
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                problems.push(problem_of(&Error::io("list shards", &dir)(e), &dir));
                continue;
            }
        };
        let path = entry.path();
        let structure = |detail: String| Problem::new(&path, ProblemKind::Structure, detail);
        let Some(file) = entry.file_name().to_str().map(str::to_owned) else {
            problems.push(structure("file name is not UTF-8".into()));
            continue;
        };
        let Some(name) = ShardName::parse(&file, compression) else {
            problems.push(structure(format!(
                "not a shard name <start>.<end>.{} for this root",
                compression.suffix()
            )));
            continue;
        };
        let l = metadata.max_shard_length;
        if name.start % l != 0 {
            problems.push(structure(format!(
                "start {} is not a multiple of {l}",
                name.start
            )));
        }
        if name.len() > l {
            problems.push(structure(format!(
                "{} items, more than max_shard_length {l}",
                name.len()
            )));
        }
        if metadata.length_final && name.end > metadata.length {
            problems.push(structure(format!(
                "ends at {} beyond the final length {}",
                name.end, metadata.length
            )));
        }
        if name.len() < l && metadata.length_final && name.end != metadata.length {
            problems.push(structure(format!(
                "short shard but the final length is {}",
                metadata.length
            )));
        }
        if let Err(e) = read_shard::<PickleValue>(&path, name, compression) {
            problems.push(problem_of(&e, &path));
        }
        names.push(name);
    }
    if root.join(COMPLETED_FILE).exists()
        && !(metadata.length_final && crate::writer::covers(&names, metadata.length))
    {
        problems.push(Problem::new(
            root.join(COMPLETED_FILE),
            ProblemKind::Missing,
            "flag set but shards are missing",
        ));
    }
    let scratch = root.join(SCRATCH_DIR);
    if let Ok(d) = std::fs::read_dir(&scratch) {
        for e in d.filter_map(|e| e.ok()) {
            problems.push(Problem::new(
                e.path(),
                ProblemKind::Interrupted,
                "leftover of an interrupted write (ignored by readers)",
            ));
        }
    }
    let _ = format::FORMAT_VERSION;
    problems
}

/// `e` as a problem of the file it names (else `fallback`), its kind
/// shared by every cachex store.
fn problem_of(e: &Error, fallback: &Path) -> Problem {
    let (path, kind) = match e {
        Error::Io { path, source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            (path.as_path(), ProblemKind::Missing)
        }
        Error::Io { path, .. } => (path.as_path(), ProblemKind::Io),
        Error::BadMetadata { path, .. } | Error::CorruptShard { path, .. } => {
            (path.as_path(), ProblemKind::Structure)
        }
        _ => (fallback, ProblemKind::Structure),
    };
    Problem::from_error(path, kind, e)
}
