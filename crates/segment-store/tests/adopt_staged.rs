//! Adopting staged stores: segments written by stores of their own
//! (a Ray job's write tasks), renumbered into one multi-writer of a cache,
//! read back as the cache's records; a damaged staged log is refused with
//! an error naming it.

use std::path::Path;

use segment_store::format::{self, INDEX_FILE, SEGMENTS_DIR, WRITERS_DIR};
use segment_store::{
    Error, Options, SegmentStore, StagedLog, adopt_staged, claim_free_writer, last_segment_id,
    lock_as_multi_writer,
};
use tensor_core::{Tensor, Value};

fn record(v: f32) -> Value {
    Value::from(Tensor::from_vec([2], vec![v, v + 0.5]).expect("tensor"))
}

/// A single-writer store at `dir` holding `keys` (value `v`), one segment
/// per two keys.
fn staged_store(dir: &Path, keys: &[&str], v: f32) {
    let store = SegmentStore::open(
        dir,
        Options {
            flush_every: 2,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let batch: Vec<(&str, Value)> = keys.iter().map(|k| (*k, record(v))).collect();
    store.put_batch(&batch).unwrap();
    store.flush().unwrap();
}

fn open_reader(cache: &Path) -> SegmentStore {
    SegmentStore::open(
        cache,
        Options {
            read_only: true,
            ..Options::default()
        },
    )
    .unwrap()
}

/// Moves the adopted segments and the writer log into `cache`.
fn adopt_into(cache: &Path, staged: &[&Path]) {
    let logs: Vec<StagedLog> = staged
        .iter()
        .map(|d| StagedLog::read(&d.join(INDEX_FILE)).unwrap())
        .collect();
    let _shared = lock_as_multi_writer(cache).unwrap();
    let (writer, _lock) = claim_free_writer(cache).unwrap();
    let adoption = adopt_staged(&logs, writer, last_segment_id(cache).unwrap()).unwrap();
    assert_eq!(adoption.writer, writer);
    for s in &adoption.segments {
        std::fs::rename(
            format::segment_path(staged[s.log], s.staged_id),
            format::segment_path(cache, s.id),
        )
        .unwrap();
    }
    std::fs::write(
        cache
            .join(WRITERS_DIR)
            .join(format::writer_log_name(writer)),
        &adoption.log,
    )
    .unwrap();
}

#[test]
fn adopted_segments_read_back_and_win_over_older_records() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    staged_store(&cache, &["a", "b", "c"], 1.0);
    let (t0, t1) = (tmp.path().join("t0"), tmp.path().join("t1"));
    staged_store(&t0, &["b", "d", "e"], 2.0);
    staged_store(&t1, &["f"], 3.0);
    std::fs::copy(t0.join("schema.json"), cache.join("schema.json")).unwrap();

    adopt_into(&cache, &[&t0, &t1]);

    let reader = open_reader(&cache);
    assert_eq!(reader.len(), 6);
    let (got, missing) = reader.get_batch(&["a", "b", "d", "f"]).unwrap();
    assert!(missing.is_empty());
    let got: Vec<Value> = got.into_iter().map(Option::unwrap).collect();
    assert_eq!(got, [record(1.0), record(2.0), record(2.0), record(3.0)]);
    let problems = segment_store::verify(&cache);
    assert!(problems.is_empty(), "{problems:?}");
    // Every staged segment moved; the writer is the greatest free id.
    assert!(
        std::fs::read_dir(t0.join(SEGMENTS_DIR))
            .unwrap()
            .next()
            .is_none()
    );
    assert!(
        cache
            .join(WRITERS_DIR)
            .join(format::writer_log_name(format::MAX_WRITER_ID))
            .exists()
    );

    // A second adoption takes the next free writer, above every id.
    let t2 = tmp.path().join("t2");
    staged_store(&t2, &["a"], 4.0);
    adopt_into(&cache, &[&t2]);
    let reader = open_reader(&cache);
    assert_eq!(reader.get_batch(&["a"]).unwrap().0[0], Some(record(4.0)));
}

#[test]
fn a_damaged_staged_log_is_a_typed_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let staged = tmp.path().join("t0");
    staged_store(&staged, &["a", "b", "c", "d"], 1.0);
    let log = staged.join(INDEX_FILE);
    let bytes = std::fs::read(&log).unwrap();

    let cases: [(&str, Vec<u8>); 4] = [
        ("truncated", bytes[..bytes.len() - 3].to_vec()),
        ("short header", bytes[..5].to_vec()),
        ("bad magic", {
            let mut b = bytes.clone();
            b[0] ^= 0xff;
            b
        }),
        ("flipped hash", {
            let mut b = bytes.clone();
            let last = b.len() - 1;
            b[last] ^= 1;
            b
        }),
    ];
    for (what, damaged) in cases {
        std::fs::write(&log, &damaged).unwrap();
        let err = StagedLog::read(&log).unwrap_err();
        assert!(
            matches!(&err, Error::CorruptLog { path, .. } if path == &log),
            "{what}: {err:?}"
        );
        assert!(err.to_string().contains(INDEX_FILE), "{what}: {err}");
        let err = StagedLog::parse(&damaged, "write task 3's index log").unwrap_err();
        assert!(
            err.to_string().starts_with("write task 3's index log: "),
            "{what}: {err}"
        );
    }
    let missing = StagedLog::read(&tmp.path().join("none.log")).unwrap_err();
    assert!(matches!(missing, Error::Io { .. }), "{missing:?}");
}

#[test]
fn a_single_writer_keeps_adoption_out() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let store = SegmentStore::open(&cache, Options::default()).unwrap();
    assert!(matches!(
        lock_as_multi_writer(&cache),
        Err(Error::Locked { .. })
    ));
    drop(store);
    assert!(lock_as_multi_writer(&cache).is_ok());
}
