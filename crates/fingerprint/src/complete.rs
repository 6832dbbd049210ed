//! The `_COMPLETE` sentinel of a finished cache directory.

use std::path::Path;

use crate::{FingerprintError, Result};

/// The sentinel a finished cache directory holds.
pub const COMPLETE_FILE: &str = "_COMPLETE";

/// Whether `dir` holds the `_COMPLETE` sentinel.
pub fn is_complete(dir: &Path) -> bool {
    dir.join(COMPLETE_FILE).is_file()
}

/// Marks `dir` complete: writes `_COMPLETE` by rename and fsyncs the
/// directory. Call it only after everything else in `dir` is durable.
pub fn mark_complete(dir: &Path) -> Result<()> {
    durable_fs::write_atomic(&dir.join(COMPLETE_FILE), b"").map_err(FingerprintError::durable)
}

/// Removes the `_COMPLETE` sentinel (before rebuilding a stale cache), durably.
pub fn clear_complete(dir: &Path) -> Result<()> {
    durable_fs::remove_and_sync(&dir.join(COMPLETE_FILE))
        .map(drop)
        .map_err(FingerprintError::durable)
}
