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
    write_through(&temp_path(path), path, bytes)
}

/// Writes `bytes` to the temporary file `tmp`, fsyncs it, renames it over
/// `path` and fsyncs the directory; the temporary file goes on failure.
fn write_through(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    write_synced(tmp, bytes)?;
    if let Err(e) = rename(tmp, path) {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    sync_parent_dir(path)
}

/// [`write_atomic`] for a directory that many writers share (processes
/// on one machine or several): the temporary file is a
/// [`unique_temp_path`](crate::unique_temp_path) of its own, so writers
/// never build theirs in one file; the last rename wins.
pub fn write_atomic_shared(path: &Path, bytes: &[u8]) -> Result<()> {
    write_through(&unique_sibling(path), path, bytes)
}

/// Creates `path` holding `bytes` unless it exists, durably and
/// atomically: a reader sees no file or the whole one, and of writers
/// racing to create it exactly one wins (the file is linked into place,
/// never renamed over another). Returns whether this call created it.
pub fn write_new_atomic(path: &Path, bytes: &[u8]) -> Result<bool> {
    let tmp = unique_sibling(path);
    write_synced(&tmp, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => sync_parent_dir(path).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io("link into place", path)(e)),
    }
}

/// A [`unique_temp_path`](crate::unique_temp_path) beside `path`, named
/// after it.
fn unique_sibling(path: &Path) -> std::path::PathBuf {
    let stem = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    crate::unique_temp_path(parent_dir(path), &stem)
}

/// Replaces `path` by `bytes` atomically for other processes (`<path>.tmp`,
/// rename) but without any fsync: a process crash leaves the old file or
/// the new one; a power cut may leave either, a missing file or a torn
/// one. Only for files their readers validate (a checksum) and can do
/// without, such as a record of what is cached.
pub fn replace_unsynced(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_path(path);
    let written =
        create_temp(&tmp).and_then(|mut f| f.write_all(bytes).map_err(Error::io("write", &tmp)));
    if let Err(e) = written.and_then(|()| rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// This boot of the machine: Linux's `/proc/sys/kernel/random/boot_id`,
/// read once. Bytes written without fsync live in the page cache of the
/// boot that wrote them, which every process of that boot reads; a file
/// that records such bytes with the boot id can tell, after a reboot or a
/// power cut, that they may be gone. `None` where the id cannot be read
/// (another OS): then nothing may rely on unsynced bytes.
pub fn boot_id() -> Option<[u8; 16]> {
    static BOOT: std::sync::OnceLock<Option<[u8; 16]>> = std::sync::OnceLock::new();
    *BOOT.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        parse_uuid(text.trim())
    })
}

/// The 16 bytes of a UUID written as 32 hex digits and dashes.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_boot_id_is_read_as_sixteen_bytes() {
        assert_eq!(
            parse_uuid("0123abcd-4567-89ef-0123-456789abcdef"),
            Some([
                0x01, 0x23, 0xab, 0xcd, 0x45, 0x67, 0x89, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
                0xcd, 0xef
            ])
        );
        assert_eq!(parse_uuid("0123"), None);
        assert_eq!(parse_uuid(&"z".repeat(32)), None);
        if cfg!(target_os = "linux") {
            assert!(boot_id().is_some());
            assert_eq!(boot_id(), boot_id());
        }
    }

    #[test]
    fn shared_and_new_writes_leave_one_whole_file_and_no_temporary_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("schema.json");
        assert!(write_new_atomic(&path, b"first").unwrap());
        assert!(!write_new_atomic(&path, b"second").unwrap());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        write_atomic_shared(&path, b"third").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"third");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        let missing = dir.path().join("no-such-dir").join("f");
        assert!(write_new_atomic(&missing, b"x").is_err());
    }

    #[test]
    fn an_unsynced_replace_leaves_the_new_bytes_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map");
        replace_unsynced(&path, b"one").unwrap();
        replace_unsynced(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
