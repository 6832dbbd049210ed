//! Temporary names, and removing the ones a crashed writer left.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

/// The suffix of every temporary file this crate names.
pub const TMP_SUFFIX: &str = ".tmp";

/// `<path>.tmp`: where the one writer of `path` builds it.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(TMP_SUFFIX);
    PathBuf::from(name)
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// `<dir>/<stem>.<pid>.<n>.tmp`: a name no other thread or process uses,
/// for a scratch directory that many writers share.
pub fn unique_temp_path(dir: &Path, stem: &str) -> PathBuf {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("{stem}.{}.{n}{TMP_SUFFIX}", std::process::id()))
}

/// Removes every `*.tmp` file directly in `dir` (a missing `dir` has none)
/// and returns their paths. Only for a directory whose one writer the
/// caller is: a temporary file there belongs to a crashed writer.
pub fn remove_temp_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("list directory", dir)(e)),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("list directory", dir))?;
        if entry.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
            let path = entry.path();
            match std::fs::remove_file(&path) {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io("remove stale temporary file", &path)(e)),
            }
        }
    }
    Ok(removed)
}

/// Removes the [`unique_temp_path`] files in `dir` whose process is gone
/// (Linux: no `/proc/<pid>`), best effort. Other files are left alone, and
/// so is everything where `/proc` is not mounted.
pub fn remove_dead_temp_files(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_owner) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The pid in a `<stem>.<pid>.<n>.tmp` name.
fn temp_owner(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(TMP_SUFFIX)?;
    let mut parts = stem.rsplit('.');
    let n = parts.next()?;
    let pid = parts.next()?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_path_appends_the_suffix() {
        assert_eq!(temp_path(Path::new("a/b.json")), Path::new("a/b.json.tmp"));
        assert_eq!(temp_path(Path::new("bare")), Path::new("bare.tmp"));
    }

    #[test]
    fn unique_names_differ_and_name_their_owner() {
        let a = unique_temp_path(Path::new("s"), "x.pickle");
        let b = unique_temp_path(Path::new("s"), "x.pickle");
        assert_ne!(a, b);
        let name = a.file_name().and_then(|n| n.to_str()).unwrap();
        assert_eq!(temp_owner(name), Some(std::process::id()));
        assert_eq!(temp_owner("metadata.json"), None);
        assert_eq!(temp_owner("x.tmp"), None);
    }
}
