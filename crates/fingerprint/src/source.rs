//! Source stamps: what a cache was built from.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::{FingerprintError, Result};

/// Files at least this large are hashed with blake3's mmap + rayon path.
const PARALLEL_HASH_MIN: u64 = 1 << 20;

/// How much of a source file goes into its stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Size and modification time: cheap, but a touched file reads as changed.
    #[default]
    Metadata,
    /// Size, modification time and a BLAKE3 hash of the content; a file whose
    /// content is unchanged is not stale even if its mtime moved.
    Content,
}

/// One source file's identity at stamping time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStamp {
    /// Path relative to the stamping root, with `/` separators.
    pub rel_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the Unix epoch (negative before it).
    pub mtime_ns: i64,
    /// BLAKE3 of the content (64 hex characters), in [`Mode::Content`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// Stamps `paths` (relative to `root`, or absolute under it), sorted by
/// relative path with duplicates removed. Moving the whole root elsewhere
/// keeps every stamp's `rel_path`.
pub fn stamp_sources<P: AsRef<Path>>(
    root: &Path,
    paths: impl IntoIterator<Item = P>,
    mode: Mode,
) -> Result<Vec<SourceStamp>> {
    let mut stamps = Vec::new();
    for path in paths {
        let path = path.as_ref();
        let rel = relative_to(root, path)?;
        let full = root.join(&rel);
        let meta = std::fs::metadata(&full).map_err(FingerprintError::io("stat", &full))?;
        let mtime_ns = meta
            .modified()
            .map_err(FingerprintError::io("read mtime", &full))
            .map(|t| match t.duration_since(UNIX_EPOCH) {
                Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
                Err(before) => i64::try_from(before.duration().as_nanos()).map_or(i64::MIN, |n| -n),
            })?;
        let content = match mode {
            Mode::Metadata => None,
            Mode::Content => Some(hash_file(&full, meta.len())?),
        };
        stamps.push(SourceStamp {
            rel_path: rel_string(&rel),
            size: meta.len(),
            mtime_ns,
            content,
        });
    }
    stamps.sort_by(|a, b| a.rel_path.cmp(&b.rel_path));
    stamps.dedup_by(|a, b| a.rel_path == b.rel_path);
    Ok(stamps)
}

/// `path` relative to `root`, refusing anything that escapes it.
fn relative_to(root: &Path, path: &Path) -> Result<PathBuf> {
    let outside = || FingerprintError::OutsideRoot {
        path: path.to_path_buf(),
        root: root.to_path_buf(),
    };
    let rel = if path.is_absolute() {
        path.strip_prefix(root)
            .map_err(|_| outside())?
            .to_path_buf()
    } else {
        path.to_path_buf()
    };
    let mut clean = PathBuf::new();
    for part in rel.components() {
        match part {
            Component::Normal(p) => clean.push(p),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside());
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(outside());
    }
    Ok(clean)
}

fn rel_string(rel: &Path) -> String {
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn hash_file(path: &Path, len: u64) -> Result<String> {
    let mut hasher = blake3::Hasher::new();
    if len >= PARALLEL_HASH_MIN {
        hasher
            .update_mmap_rayon(path)
            .map_err(FingerprintError::io("hash", path))?;
    } else {
        let mut file = std::fs::File::open(path).map_err(FingerprintError::io("open", path))?;
        let mut buf = Vec::with_capacity(len as usize);
        file.read_to_end(&mut buf)
            .map_err(FingerprintError::io("read", path))?;
        hasher.update(&buf);
    }
    Ok(hasher.finalize().to_hex().to_string())
}
