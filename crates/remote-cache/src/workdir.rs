//! The working directory's own files and records: which files a commit
//! may hold, what this handle last left in each (`applied.jsonl`), and
//! the durable local writes a commit's pieces land with.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use remote_tier::{BlockHasher, BlockHashes, RemoteFile};
use serde::{Deserialize, Serialize};

use crate::commit::STATE_DIR;
use crate::{Error, Result};

/// A local file as this handle last left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Known {
    /// Its length.
    pub(crate) len: u64,
    /// Its inode; 0 for a file read by blocks (a link into the tier).
    pub(crate) ino: u64,
    /// A file read by blocks whose commit recorded a block list: kept in
    /// `.cachex-remote/blocks/<blake3>.json` for when the file is linked
    /// again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) blocks: bool,
}

/// One line of `applied.jsonl`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Applied {
    /// The commit (or checkpoint) applied.
    pub(crate) seq: u64,
    /// The files it wrote, as left.
    pub(crate) files: BTreeMap<String, Known>,
    /// The files it removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) removed: Vec<String>,
}

/// The applied commits recorded in a working directory: the last seq,
/// each file as it was left, and the length of the log's whole lines. A
/// torn tail (a crash, or a failed write, while recording) ends the log
/// there: that commit is applied again, finding its bytes in place, and
/// the caller cuts the tail off so the next record does not land behind
/// it.
pub(crate) fn read_applied(path: &Path) -> Result<(u64, HashMap<String, Known>, u64)> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(Error::io("read", path)(e)),
    };
    let mut seq = 0;
    let mut files = HashMap::new();
    let mut good = 0usize;
    let mut rest = &bytes[..];
    // Only lines ended by their newline count: a record is written with
    // its newline in one write, so a line without one is torn.
    while let Some(end) = rest.iter().position(|&b| b == b'\n') {
        let line = &rest[..end];
        if !line.is_empty() {
            let Ok(a) = serde_json::from_slice::<Applied>(line) else {
                break;
            };
            seq = seq.max(a.seq);
            files.extend(a.files);
            for path in &a.removed {
                files.remove(path);
            }
        }
        good += end + 1;
        rest = &rest[end + 1..];
    }
    Ok((seq, files, good as u64))
}

/// Cuts `log` (at `path`) back to `len` bytes, durably: what lies beyond
/// is a torn record.
pub(crate) fn cut_log(log: &File, path: &Path, len: u64) -> Result<()> {
    log.set_len(len).map_err(Error::io("truncate", path))?;
    log.sync_all().map_err(Error::io("fsync", path))?;
    Ok(())
}

/// Every file of `dir` a commit may hold, with its relative path: not the
/// state directory, locks, temporary files, links into the tier, or what
/// `private` names.
pub(crate) fn local_files(dir: &Path, private: fn(&str) -> bool) -> Result<Vec<(String, PathBuf)>> {
    Ok(local_entries(dir, private)?.0)
}

/// [`local_files`], and the symbolic links the walk passed over (their
/// relative paths): links into the tier in a working directory, links of
/// the user's own in a directory pushed.
#[allow(clippy::type_complexity)]
pub(crate) fn local_entries(
    dir: &Path,
    private: fn(&str) -> bool,
) -> Result<(Vec<(String, PathBuf)>, Vec<String>)> {
    let mut out = Vec::new();
    let mut links = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(Error::io("list directory", &d))?;
        for entry in entries {
            let entry = entry.map_err(Error::io("list directory", &d))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(Error::io("stat", &path))?;
            let Ok(rel) = path.strip_prefix(dir) else {
                continue;
            };
            let rel: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let rel = rel.join("/");
            if rel == STATE_DIR || private(&rel) {
                continue;
            }
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".lock") || name.ends_with(durable_fs::TMP_SUFFIX) {
                continue;
            }
            if kind.is_symlink() {
                links.push(rel);
            } else if kind.is_file() {
                out.push((rel, path));
            }
        }
    }
    out.sort();
    links.sort();
    Ok((out, links))
}

/// BLAKE3 (hex) of `size` bytes of `path` at `offset`.
pub(crate) fn hash_range(path: &Path, offset: u64, size: u64) -> Result<String> {
    let file = File::open(path).map_err(Error::io("open", path))?;
    Ok(hash_open(&file, path, offset, size, None)?.0)
}

/// BLAKE3 (hex) of `size` bytes of `file` at `offset` and, given a block
/// size, the BLAKE3 of each block of them, in one read.
pub(crate) fn hash_open(
    file: &File,
    path: &Path,
    offset: u64,
    size: u64,
    block_size: Option<u64>,
) -> Result<(String, Option<BlockHashes>)> {
    let mut by_block = block_size.map(BlockHasher::new);
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; (1 << 20).min(size.max(1)) as usize];
    let mut at = offset;
    let end = offset + size;
    while at < end {
        let n = (end - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(Error::io("read", path))?;
        hasher.update(&buf[..n]);
        if let Some(b) = &mut by_block {
            b.update(&buf[..n]);
        }
        at += n as u64;
    }
    let blocks = match by_block {
        Some(b) => Some(b.finalize().map_err(|problem| {
            Error::io("hash by blocks", path)(std::io::Error::other(problem))
        })?),
        None => None,
    };
    Ok((hasher.finalize().to_hex().to_string(), blocks))
}

/// Writes a new file (temp, fsync, rename, dir fsync) from `source`;
/// returns its inode.
pub(crate) fn write_new(dest: &Path, source: Option<&RemoteFile>, size: u64) -> Result<u64> {
    let parent = durable_fs::parent_dir(dest).to_path_buf();
    std::fs::create_dir_all(&parent).map_err(Error::io("create directory", &parent))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = durable_fs::unique_temp_path(&parent, &name);
    let out = durable_fs::create_temp(&tmp)?;
    let copied = match source {
        Some(src) => copy_at(src, &out, &tmp, 0, size),
        None => Ok(()),
    };
    let ino = out.metadata().map_err(Error::io("stat", &tmp))?.ino();
    if let Err(e) = copied.and_then(|()| Ok(durable_fs::commit_temp(out, &tmp, dest)?)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    durable_fs::sync_dir(&parent)?;
    Ok(ino)
}

/// Appends `size` bytes of `source` at `offset` of `dest`, fsynced;
/// returns its inode.
pub(crate) fn append(
    dest: &Path,
    source: Option<&RemoteFile>,
    offset: u64,
    size: u64,
) -> Result<u64> {
    let out = std::fs::OpenOptions::new()
        .write(true)
        .open(dest)
        .map_err(Error::io("open", dest))?;
    if let Some(src) = source {
        copy_at(src, &out, dest, offset, size)?;
    }
    out.sync_data().map_err(Error::io("fsync", dest))?;
    Ok(out.metadata().map_err(Error::io("stat", dest))?.ino())
}

/// Copies the object `from` (whole, `size` bytes) to `offset` of `to`.
fn copy_at(from: &RemoteFile, to: &File, to_path: &Path, offset: u64, size: u64) -> Result<()> {
    let mut buf = vec![0u8; (4 << 20).min(size.max(1)) as usize];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        from.file()?
            .read_exact_at(&mut buf[..n], at)
            .map_err(Error::io("read", from.path()))?;
        to.write_all_at(&buf[..n], offset + at)
            .map_err(Error::io("write", to_path))?;
        at += n as u64;
    }
    to.sync_data().map_err(Error::io("fsync", to_path))?;
    Ok(())
}
