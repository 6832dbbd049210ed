//! The commit path: temporary file, fsync, rename, directory fsync.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use crate::temp::temp_path;
use crate::{Error, Result};

/// The directory that holds `path`: its parent, or `.` for a bare file
/// name (whose parent is the empty path, which cannot be opened).
pub fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Fsyncs a directory, making the creations, renames and removals in it
/// durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(Error::io("open directory", dir))?;
    d.sync_all().map_err(Error::io("fsync directory", dir))
}

/// Fsyncs the directory that holds `path` (see [`parent_dir`]).
pub fn sync_parent_dir(path: &Path) -> Result<()> {
    sync_dir(parent_dir(path))
}

/// Creates (truncating) the temporary file `tmp`, open for reading and
/// writing.
pub fn create_temp(tmp: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(Error::io("create temporary file", tmp))
}

/// Writes `bytes` to a new file at `tmp` and fsyncs it. On failure the
/// partial file is removed (best effort).
pub fn write_synced(tmp: &Path, bytes: &[u8]) -> Result<()> {
    let result = create_temp(tmp).and_then(|mut f| {
        f.write_all(bytes).map_err(Error::io("write", tmp))?;
        f.sync_all().map_err(Error::io("fsync", tmp))
    });
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// Fsyncs `file` (written at `tmp`), closes it and renames it to `dest`.
/// The directory is not fsynced: call [`sync_dir`] once after a group of
/// commits.
pub fn commit_temp(file: File, tmp: &Path, dest: &Path) -> Result<()> {
    file.sync_all().map_err(Error::io("fsync", tmp))?;
    drop(file);
    rename(tmp, dest)
}

/// Renames `from` (a file already fsynced) to `to`, replacing `to`
/// atomically. The directory is not fsynced; see [`rename_and_sync`].
pub fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(Error::io("rename into place", to))
}

/// Renames `from` (a file already fsynced) to `to` and fsyncs `to`'s
/// directory, so the new name survives a crash. When `from` lies in
/// another directory that one is not fsynced: a crash may leave a stale
/// temporary name there, which [`remove_temp_files`](crate::remove_temp_files)
/// or [`remove_dead_temp_files`](crate::remove_dead_temp_files) clean up.
pub fn rename_and_sync(from: &Path, to: &Path) -> Result<()> {
    rename(from, to)?;
    sync_parent_dir(to)
}

/// Replaces `path` by `bytes` so that a crash leaves the old file or the
/// new one, never a mix: `<path>.tmp`, fsync, rename, fsync the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    write_synced(&tmp, bytes)?;
    if let Err(e) = rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_parent_dir(path)
}

/// Removes `path` if it exists and fsyncs its directory; returns whether
/// there was a file to remove.
pub fn remove_and_sync(path: &Path) -> Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_parent_dir(path).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("remove", path)(e)),
    }
}

/// Reads a file that the format keeps small, refusing more than `cap`
/// bytes ([`Error::TooLarge`]) so that a corrupt or hostile file cannot
/// drive a huge allocation.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    let mut out = Vec::new();
    file.take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(Error::io("read", path))?;
    if out.len() as u64 > cap {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
            cap,
        });
    }
    Ok(out)
}
