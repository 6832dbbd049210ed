//! A commit log's identity: which log a working directory (or a pulled
//! directory) holds, so that it never takes another log at the same URL
//! for its own.

use std::hash::{BuildHasher, Hasher};
use std::path::Path;

use remote_tier::RemoteTier;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The object that names a log, under its URL (and the file that names
/// the log a directory holds, in its state directory).
///
/// A commit log's identity: which log a working directory (or a pulled
/// directory) holds, so that it never takes another log at the same URL
/// for its own.
///
/// ```text
/// <url>/log.json                        {"version":1,"id":"<32 hex>"}: created once, with a
///                                       conditional put, before the log's first commit
/// <url>/commits/<seq>.json              "log":"<id>" in each commit written since
/// <work dir>/.cachex-remote/log.json    the same record: the log this directory applied
/// ```
///
/// A log's URL does not name it: a prefix wiped and written again, or the
/// same `s3://` URL on another endpoint, holds another log whose commits
/// are numbered from 1 again. A reader that only asked for the commit
/// after its last would apply another log's commits on top of its own, or
/// find nothing and serve the old one.
///
/// - **Created once.** The first publisher of a log (a store's publish,
///   `push`, a staged commit) puts `log.json` with a random id
///   under `PutMode::Create` before it claims a commit; of two that race,
///   one id wins and both commit under it. gc never deletes it.
/// - **Checked on every refresh.** A refresh asks for `log.json` at the
///   same time as for the next commit (no extra round trip), and checks
///   the log every commit it applies names. A directory that holds
///   another log's commits (another id, or no `log.json` where the
///   directory recorded one) **starts over** when it is opened: every
///   file and record of it is dropped and the bucket's log applied from
///   scratch. A handle already open (its store maps the old files)
///   **refuses** instead: its refresh, publish and reads fail with
///   [`Error::OtherLog`] naming both ids, and the next open starts over.
///   A writer's files not yet published go too: they were written over
///   the old log, and are no part of the new one. `pull` refuses: a
///   pulled directory is the user's.
pub const LOG_OBJECT: &str = "log.json";
/// The identity record's format version.
pub const LOG_VERSION: u32 = 1;
/// The most bytes an identity record may have.
const MAX_LOG_RECORD: u64 = 4096;

/// The identity record: `{"version":1,"id":"<32 hex>"}`.
#[derive(Debug, Serialize, Deserialize)]
struct LogRecord {
    version: u32,
    id: String,
}

/// A fresh log id: 128 bits from the process's randomly seeded hasher
/// keys, the time and the process, hashed.
fn new_id() -> String {
    let mut h = blake3::Hasher::new();
    for _ in 0..2 {
        let mut s = std::collections::hash_map::RandomState::new().build_hasher();
        s.write_u64(0x6c6f67);
        h.update(&s.finish().to_le_bytes());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(&now.to_le_bytes());
    h.update(&std::process::id().to_le_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// Whether `id` is a log id as this crate writes them.
pub(crate) fn is_log_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Parses an identity record; `problem` on anything else.
fn parse(bytes: &[u8]) -> std::result::Result<String, String> {
    let r: LogRecord =
        serde_json::from_slice(bytes).map_err(|e| format!("not a log identity: {e}"))?;
    if r.version != LOG_VERSION {
        return Err(format!(
            "version {}, this build reads {LOG_VERSION}",
            r.version
        ));
    }
    if !is_log_id(&r.id) {
        return Err(format!("`{}` is not a log id (32 hex digits)", r.id));
    }
    Ok(r.id)
}

fn encode(id: &str) -> Vec<u8> {
    let record = LogRecord {
        version: LOG_VERSION,
        id: id.to_string(),
    };
    // A struct of a number and a string always encodes.
    serde_json::to_vec(&record).unwrap_or_default()
}

/// The id of the log at `tier`'s URL; `None` when there is none (no log
/// there, or one whose first publisher has not named it yet).
pub(crate) fn read_log_id(tier: &RemoteTier) -> Result<Option<String>> {
    let bytes = match tier.read_remote_capped(LOG_OBJECT, MAX_LOG_RECORD) {
        Ok(b) => b,
        Err(remote_tier::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    parse(&bytes).map(Some).map_err(|problem| Error::Corrupt {
        url: tier.url().to_string(),
        name: LOG_OBJECT.into(),
        problem,
    })
}

/// The id of the log at `tier`'s URL, created (with a conditional put)
/// if it has none: call before claiming a commit. `known` is what the
/// caller read of it already (`None`: nothing there when it looked).
pub(crate) fn ensure_log_id(tier: &RemoteTier, known: Option<String>) -> Result<String> {
    if let Some(id) = known {
        return Ok(id);
    }
    let id = new_id();
    match tier.commit(LOG_OBJECT, encode(&id)) {
        Ok(()) => Ok(id),
        // Another publisher named the log first: commit under its id.
        Err(remote_tier::Error::CommitTaken { .. }) => {
            read_log_id(tier)?.ok_or_else(|| Error::Corrupt {
                url: tier.url().to_string(),
                name: LOG_OBJECT.into(),
                problem: "taken by another publisher, then gone".into(),
            })
        }
        Err(e) => Err(e.into()),
    }
}

/// The id of the log a working directory holds, as its state directory
/// `state_dir` records it (`None`: none recorded).
pub(crate) fn read_local(state_dir: &Path) -> Result<Option<String>> {
    let path = state_dir.join(LOG_OBJECT);
    let bytes = match durable_fs::read_capped(&path, MAX_LOG_RECORD) {
        Ok(b) => b,
        Err(durable_fs::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    parse(&bytes).map(Some).map_err(|problem| Error::Corrupt {
        url: durable_fs::parent_dir(state_dir).display().to_string(),
        name: path.display().to_string(),
        problem,
    })
}

/// Records durably, in the state directory `state_dir` of a working
/// directory, that it holds the log `id` (`None`: no log, the URL having
/// none).
pub(crate) fn write_local(state_dir: &Path, id: Option<&str>) -> Result<()> {
    let path = state_dir.join(LOG_OBJECT);
    match id {
        Some(id) => durable_fs::write_atomic(&path, &encode(id))?,
        None => match std::fs::remove_file(&path) {
            Ok(()) => durable_fs::sync_dir(state_dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io("remove", &path)(e)),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_records_are_checked() {
        let (a, b) = (new_id(), new_id());
        assert!(is_log_id(&a) && is_log_id(&b) && a != b);
        assert_eq!(parse(&encode(&a)).unwrap(), a);
        for bad in [
            &br#"{"version":2,"id":"00000000000000000000000000000000"}"#[..],
            br#"{"version":1,"id":"../x"}"#,
            br#"{"version":1}"#,
            b"[]",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
