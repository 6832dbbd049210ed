//! Durable small-file writes and the `_COMPLETE` sentinel.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::{FingerprintError, Result};

/// The sentinel a finished cache directory holds.
pub const COMPLETE_FILE: &str = "_COMPLETE";

/// Writes `bytes` to `path` so that a crash leaves the old file or the new
/// one, never a mix: temp file beside it, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = parent_dir(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut file = File::create(&tmp).map_err(|e| FingerprintError::io(&tmp, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| FingerprintError::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| FingerprintError::io(path, e))?;
    sync_dir(dir)
}

/// Fsyncs a directory, making renames and creations in it durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| FingerprintError::io(dir, e))
}

fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Whether `dir` holds the `_COMPLETE` sentinel.
pub fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_FILE).is_file()
}

/// Marks `dir` complete: writes `_COMPLETE` by rename and fsyncs the
/// directory. Call it only after everything else in `dir` is durable.
pub fn mark_complete(dir: &Path) -> Result<()> {
    write_atomic(&dir.join(COMPLETE_FILE), b"")
}

/// Removes the `_COMPLETE` sentinel (before rebuilding a stale cache), durably.
pub fn clear_complete(dir: &Path) -> Result<()> {
    let path = dir.join(COMPLETE_FILE);
    match std::fs::remove_file(&path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FingerprintError::io(path, e)),
    }
}
