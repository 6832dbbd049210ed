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

/// The longest host name a temporary name carries.
const MAX_HOST: usize = 64;

/// This machine's name as temporary names carry it: the host name with
/// every byte but ASCII letters, digits, `-` and `_` made `_` (so it holds
/// no `.`, which separates the parts of a name), at most 64 bytes;
/// `host` when the system gives none.
pub fn host_name() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let mut buf = [0u8; 256];
        // SAFETY: `buf` is valid for writes of its length; gethostname
        // writes at most that many bytes.
        let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        let raw = if r == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            &buf[..end]
        } else {
            &[][..]
        };
        let name: String = raw
            .iter()
            .take(MAX_HOST)
            .map(|&b| {
                if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
                    b as char
                } else {
                    '_'
                }
            })
            .collect();
        if name.is_empty() { "host".into() } else { name }
    })
}

/// `<dir>/<stem>.<host>.<pid>.<n>.tmp`: a name no other thread, process
/// or machine uses, for a scratch directory that many writers share (on
/// a shared file system too: the host tells whose a file is, see
/// [`remove_dead_temp_files`]).
pub fn unique_temp_path(dir: &Path, stem: &str) -> PathBuf {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        "{stem}.{}.{}.{n}{TMP_SUFFIX}",
        host_name(),
        std::process::id()
    ))
}

/// `<host>-<pid>-<nanoseconds>-<n>`: a token no other process, machine or
/// call uses, for naming a writer or a probe.
pub fn host_pid_token() -> String {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{}-{nanos}-{n}", host_name(), std::process::id())
}

/// The host and pid of a token [`host_pid_token`] made (the host may hold
/// `-` itself); `None` for any other string.
pub fn parse_host_pid_token(token: &str) -> Option<(&str, u32)> {
    let mut parts = token.rsplitn(4, '-');
    let (Some(_n), Some(_nanos), Some(pid), Some(host)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    Some((host, pid.parse().ok()?))
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

/// Removes the [`unique_temp_path`] files in `dir` that this machine's
/// processes made and that are gone (Linux: no `/proc/<pid>`), best
/// effort. Files of another host (a directory on a shared file system),
/// files without a host in their name (an older build's, or another
/// program's) and everything where `/proc` is not mounted are left alone:
/// this machine cannot tell whether their writer lives.
pub fn remove_dead_temp_files(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some((host, pid)) = name.to_str().and_then(temp_owner) else {
            continue;
        };
        if host == host_name() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The host and pid in a `<stem>.<host>.<pid>.<n>.tmp` name.
fn temp_owner(name: &str) -> Option<(&str, u32)> {
    let stem = name.strip_suffix(TMP_SUFFIX)?;
    let mut parts = stem.rsplit('.');
    let n = parts.next()?;
    let pid = parts.next()?;
    let host = parts.next()?;
    // A stem is there too: `<host>` is never the whole rest.
    parts.next()?;
    n.parse::<u64>().ok()?;
    Some((host, pid.parse().ok()?))
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
        assert_eq!(temp_owner(name), Some((host_name(), std::process::id())));
        assert_eq!(temp_owner("metadata.json"), None);
        assert_eq!(temp_owner("x.tmp"), None);
        assert_eq!(temp_owner("x.12.3.tmp"), None, "no host: an older name");
        assert!(!host_name().is_empty() && !host_name().contains('.'));
    }
}
