//! segment-store's on-disk parsers on arbitrary bytes. The first byte picks
//! the index-log parser alone, or a whole read-only open (plus lookups and
//! `verify`) of a directory whose segment, index log or `schema.json` is
//! the rest of the input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    if which % 4 == 0 {
        let _ = segment_store::format::parse_index(body, |_, _| {});
        return;
    }
    let Ok(dir) = tempfile::tempdir() else { return };
    let name = match which % 4 {
        1 => "segments/segment_000000.arrow",
        2 => segment_store::format::INDEX_FILE,
        _ => segment_store::format::SCHEMA_FILE,
    };
    if std::fs::create_dir_all(dir.path().join("segments")).is_err()
        || std::fs::write(dir.path().join(name), body).is_err()
    {
        return;
    }
    let opts = segment_store::Options {
        read_only: true,
        ..segment_store::Options::default()
    };
    if let Ok(store) = segment_store::SegmentStore::open(dir.path(), opts) {
        let _ = store.get_batch(&["a", "sample_0", ""]);
        let _ = store.verify();
        let _ = store.inspect();
    }
});
