//! Durable file-system steps: temp name -> write -> fsync -> rename -> fsync dir.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::format::TMP_SUFFIX;
use crate::{Error, Result};

/// The temporary name `file` is written under before it is renamed into place.
pub(crate) fn tmp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}{TMP_SUFFIX}"))
}

/// Fsyncs a directory so that renames and deletions in it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(Error::io(dir))
}

/// Creates (truncating) the temporary file for `name` in `dir`.
pub(crate) fn create_tmp(dir: &Path, name: &str) -> Result<(File, PathBuf)> {
    let tmp = tmp_path(dir, name);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(Error::io(&tmp))?;
    Ok((file, tmp))
}

/// Fsyncs `file` (written at `tmp`) and renames it to `dir/name`. The
/// caller fsyncs the directory once after a group of renames.
pub(crate) fn commit_tmp(file: File, tmp: &Path, dir: &Path, name: &str) -> Result<()> {
    file.sync_all().map_err(Error::io(tmp))?;
    drop(file);
    let dest = dir.join(name);
    std::fs::rename(tmp, &dest).map_err(Error::io(&dest))
}

/// Writes `bytes` to `dir/name` durably (without the directory fsync).
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let (mut file, tmp) = create_tmp(dir, name)?;
    file.write_all(bytes).map_err(Error::io(&tmp))?;
    commit_tmp(file, &tmp, dir, name)
}

/// Reads a file that the format keeps small, refusing more than `cap` bytes
/// so a corrupt or hostile file cannot drive a huge allocation.
pub(crate) fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let file = File::open(path).map_err(Error::io(path))?;
    let mut out = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(Error::io(path))?;
    if out.len() as u64 > cap {
        return Err(Error::corrupt(
            path,
            format!("larger than the {cap}-byte limit for this file"),
        ));
    }
    Ok(out)
}

/// Removes leftover temporary files of an interrupted write.
pub(crate) fn remove_tmp_files(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(Error::io(dir))?;
    for entry in entries {
        let entry = entry.map_err(Error::io(dir))?;
        let name = entry.file_name();
        if name.to_string_lossy().ends_with(TMP_SUFFIX) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(Error::io(&path))?;
        }
    }
    Ok(())
}
