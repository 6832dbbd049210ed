//! remote-cache's commit record on arbitrary bytes, as a reader meets it:
//! published as commit 1 of a commit log in memory, then read (size cap,
//! JSON, version, sequence number, paths, hashes, ranges, block lists) and,
//! when the first byte is odd, applied to a fresh working directory (the
//! pieces point at the objects of `remote_cache::fuzz_entry::payloads`).
//! When bit 1 of the first byte is set, a body that is a JSON object is
//! sealed with its checksum first (`remote_cache::record::seal`), so that
//! mutations reach the checks behind the checksum instead of all stopping
//! at it. When bit 2 is set, the body is published as a checkpoint
//! instead, and a fresh working directory starts from it.
//!
//! The working directories live in one scratch directory under `TMPDIR`
//! (`scripts/fuzz` points it at a tmpfs and removes it after the run).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use remote_cache::fuzz_entry::CommitLog;

fn log() -> Option<&'static CommitLog> {
    static LOG: OnceLock<Option<CommitLog>> = OnceLock::new();
    LOG.get_or_init(|| {
        let dir = tempfile::tempdir().ok()?.keep();
        CommitLog::new(&dir).ok()
    })
    .as_ref()
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let Some(log) = log() else { return };
    let sealed;
    let body = match serde_json::from_slice(body) {
        Ok(value) if which & 2 != 0 => match remote_cache::record::seal(value) {
            Ok(bytes) => {
                sealed = bytes;
                &sealed[..]
            }
            Err(_) => body,
        },
        _ => body,
    };
    if which & 4 != 0 {
        let _ = log.apply_checkpoint(body);
    } else if which % 2 == 0 {
        let _ = log.read(body);
    } else {
        let _ = log.apply(body);
    }
});
