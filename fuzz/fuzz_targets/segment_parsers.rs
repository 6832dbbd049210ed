//! segment-store's on-disk parsers on arbitrary bytes. The first byte picks
//! the index-log parser alone, or a whole read-only open (plus lookups and
//! `verify`) of a directory whose segment, index log or `schema.json` is
//! the rest of the input.
//!
//! One scratch directory serves every input (emptied, then the input
//! written): creating and removing a directory per input cost more than
//! the parsing, and on file systems that discard freed blocks it waited on
//! the disk. `scripts/fuzz` points `TMPDIR` at a tmpfs for this target.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use segment_store::format::{INDEX_FILE, SCHEMA_FILE, SEGMENTS_DIR};

const SEGMENT: &str = "segments/segment_000000.arrow";

/// The scratch directory (never removed by the process: libFuzzer exits
/// without running destructors; `scripts/fuzz` removes its TMPDIR).
fn scratch() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().ok()?.keep();
        std::fs::create_dir_all(dir.join(SEGMENTS_DIR)).ok()?;
        Some(dir)
    })
    .as_deref()
}

/// Removes every entry but `segments/` itself, so that each input starts
/// from an empty cache directory whatever the previous open left there.
fn clear(dir: &Path) -> std::io::Result<()> {
    for sub in [dir.to_path_buf(), dir.join(SEGMENTS_DIR)] {
        for entry in std::fs::read_dir(&sub)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                if entry.file_name() != SEGMENTS_DIR {
                    std::fs::remove_dir_all(entry.path())?;
                }
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    if which % 4 == 0 {
        let _ = segment_store::format::parse_index(body, |_, _| {});
        return;
    }
    let Some(dir) = scratch() else { return };
    let name = match which % 4 {
        1 => SEGMENT,
        2 => INDEX_FILE,
        _ => SCHEMA_FILE,
    };
    if clear(dir).is_err() || std::fs::write(dir.join(name), body).is_err() {
        return;
    }
    let opts = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    if let Ok(store) = segment_store::SegmentStore::open(dir, opts) {
        let _ = store.get_batch(&["a", "sample_0", ""]);
        let _ = store.verify();
        let _ = store.inspect();
    }
});
