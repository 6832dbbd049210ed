//! Quarantine of corrupt shards, and `verify` / `inspect` of a root.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::format::{
    self, COMPLETED_FILE, METADATA_FILE, Metadata, QUARANTINE_DIR, SCRATCH_DIR, SHARDS_DIR,
    ShardName,
};
use crate::reader::{list_shards, read_metadata_file, read_shard};
use crate::store::{Inner, StoreItem};
use crate::value::PickleValue;
use crate::writer::{FileLock, fsync_dir, temp_path};

impl<T: StoreItem> Inner<T> {
    /// Moves a corrupt shard file into `quarantine/` under the writer lock.
    pub(crate) fn quarantine(&self, path: &Path) -> Result<()> {
        let _lock = FileLock::exclusive(&self.paths.writer_lock)?;
        let dir = self.root.join(QUARANTINE_DIR);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "create", e))?;
        let stem = path.file_name().and_then(|n| n.to_str()).unwrap_or("shard");
        let dest = temp_path(&dir, stem);
        match std::fs::rename(path, &dest) {
            Ok(()) => {}
            // Someone else quarantined or replaced it already.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(path, "quarantine", e)),
        }
        let _ = std::fs::remove_file(self.root.join(COMPLETED_FILE));
        fsync_dir(&self.paths.shards)
    }
}

/// Removes `scratch/` files of ours (`<name>.<pid>.<n>.tmp`) whose writer
/// process is gone (Linux: no `/proc/<pid>`). Other files are left alone.
pub(crate) fn remove_dead_temp_files(scratch: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(dir) = std::fs::read_dir(scratch) else {
        return;
    };
    for entry in dir.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".tmp") else {
            continue;
        };
        let mut parts = stem.rsplit('.');
        let (Some(_n), Some(pid)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// One problem found by [`verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file concerned.
    pub path: PathBuf,
    /// What is wrong.
    pub reason: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// A summary of a root, from [`inspect`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
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

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(|e| e.ok()).count())
}

/// Summarizes a root without decoding any shard.
pub fn inspect(root: &Path) -> Result<Summary> {
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
    Ok(Summary {
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
pub fn verify(root: &Path) -> Result<Vec<Problem>> {
    let mut problems = Vec::new();
    let meta_path = root.join(METADATA_FILE);
    let metadata = match read_metadata_file(&meta_path) {
        Ok(Some(m)) => m,
        Ok(None) => {
            problems.push(Problem {
                path: meta_path,
                reason: "missing".into(),
            });
            return Ok(problems);
        }
        Err(Error::BadMetadata { path, reason }) => {
            problems.push(Problem { path, reason });
            return Ok(problems);
        }
        Err(e) => return Err(e),
    };
    let compression = metadata.compression();
    let dir = root.join(SHARDS_DIR);
    let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, "list shards", e))?;
    let mut names: Vec<ShardName> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(&dir, "list shards", e))?;
        let path = entry.path();
        let Some(file) = entry.file_name().to_str().map(str::to_owned) else {
            problems.push(Problem {
                path,
                reason: "file name is not UTF-8".into(),
            });
            continue;
        };
        let Some(name) = ShardName::parse(&file, compression) else {
            problems.push(Problem {
                path,
                reason: format!(
                    "not a shard name <start>.<end>.{} for this root",
                    compression.suffix()
                ),
            });
            continue;
        };
        let l = metadata.max_shard_length;
        if name.start % l != 0 {
            problems.push(Problem {
                path: path.clone(),
                reason: format!("start {} is not a multiple of {l}", name.start),
            });
        }
        if name.len() > l {
            problems.push(Problem {
                path: path.clone(),
                reason: format!("{} items, more than max_shard_length {l}", name.len()),
            });
        }
        if metadata.length_final && name.end > metadata.length {
            problems.push(Problem {
                path: path.clone(),
                reason: format!(
                    "ends at {} beyond the final length {}",
                    name.end, metadata.length
                ),
            });
        }
        if name.len() < l && metadata.length_final && name.end != metadata.length {
            problems.push(Problem {
                path: path.clone(),
                reason: format!("short shard but the final length is {}", metadata.length),
            });
        }
        match read_shard::<PickleValue>(&path, name, compression) {
            Ok(_) => {}
            Err(Error::CorruptShard { reason, .. } | Error::BadMetadata { reason, .. }) => {
                problems.push(Problem { path, reason })
            }
            Err(e @ (Error::UnsupportedPickle { .. } | Error::ItemType { .. })) => {
                problems.push(Problem {
                    path,
                    reason: e.to_string(),
                })
            }
            Err(e) => return Err(e),
        }
        names.push(name);
    }
    if root.join(COMPLETED_FILE).exists()
        && !(metadata.length_final && crate::writer::covers(&names, metadata.length))
    {
        problems.push(Problem {
            path: root.join(COMPLETED_FILE),
            reason: "flag set but shards are missing".into(),
        });
    }
    let scratch = root.join(SCRATCH_DIR);
    if let Ok(d) = std::fs::read_dir(&scratch) {
        for e in d.filter_map(|e| e.ok()) {
            problems.push(Problem {
                path: e.path(),
                reason: "leftover of an interrupted write (ignored by readers)".into(),
            });
        }
    }
    let _ = format::FORMAT_VERSION;
    Ok(problems)
}
