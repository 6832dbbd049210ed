//! Malicious or corrupt records of a commit log — paths that climb out
//! (`..`, absolute, into the state directory) in pieces and in removals,
//! huge ranges and sizes, checkpoints whose name and sequence number
//! disagree or whose pieces leave gaps, versions other than this build
//! writes, commits that name no log — are each a
//! typed error naming the record, and nothing is written (or removed)
//! outside the working directory. Run over the fuzz target's own commit
//! log in memory (`remote_cache::fuzz_entry`), as a reader meets them.

use remote_cache::Error;
use remote_cache::fuzz_entry::{CommitLog, payloads};
use remote_cache::{checkpoint_name, commit_name};
use serde_json::{Value as Json, json};

/// The log every commit of these tests names.
const LOG: &str = "0123456789abcdef0123456789abcdef";

fn sealed(value: Json) -> Vec<u8> {
    remote_cache::record::seal(value).unwrap()
}

fn piece(path: &str, payload: usize) -> Json {
    let p = &payloads()[payload];
    json!({"path": path, "offset": 0, "size": p.len(), "blake3": blake3::hash(p).to_hex().to_string()})
}

fn commit(pieces: Vec<Json>, removed: Vec<&str>) -> Vec<u8> {
    sealed(
        json!({"version": 3, "seq": 1, "writer": "w", "pieces": pieces, "removed": removed, "log": LOG}),
    )
}

fn checkpoint(seq: u64, pieces: Vec<Json>) -> Vec<u8> {
    sealed(json!({"version": 1, "seq": seq, "writer": "gc", "pieces": pieces}))
}

/// The record `name` refused as corrupt, with `problem` in the message.
fn assert_corrupt(got: remote_cache::Result<u64>, record: &str, problem: &str) {
    match got {
        Err(Error::Corrupt {
            name, problem: p, ..
        }) => {
            assert_eq!(name, record, "{p}");
            assert!(p.contains(problem), "{p:?} lacks {problem:?}");
        }
        other => panic!("expected {record} corrupt ({problem}), got {other:?}"),
    }
}

/// Every file under `dir`, relative.
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn paths_that_leave_the_working_directory_are_refused_in_pieces_and_removals() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let sentinel = outside.path().join("sentinel");
    std::fs::write(&sentinel, b"keep me").unwrap();
    let absolute = sentinel.to_str().unwrap().to_string();
    let climbing = format!("../../../../../../../../..{absolute}");
    let bad = [
        "../escape",
        "a/../../escape",
        absolute.as_str(),
        climbing.as_str(),
        ".cachex-remote/applied.jsonl",
        "a/./b",
        "",
    ];
    for path in bad {
        assert_corrupt(
            log.apply(&commit(vec![piece(path, 1)], vec![])),
            &commit_name(1),
            "not a relative path inside the cache",
        );
        assert_corrupt(
            log.apply(&commit(vec![], vec![path])),
            &commit_name(1),
            "not a relative path inside the cache",
        );
        assert_corrupt(
            log.apply_checkpoint(&checkpoint(1, vec![piece(path, 1)])),
            &checkpoint_name(1),
            "not a relative path inside the cache",
        );
    }
    assert_eq!(std::fs::read(&sentinel).unwrap(), b"keep me");
    assert_eq!(tree(outside.path()), vec!["sentinel"]);
    assert!(!scratch.path().join("escape").exists());
    assert!(!scratch.path().parent().unwrap().join("escape").exists());
    // Nothing but the state directory in the working directory.
    let left: Vec<String> = tree(&log.apply_dir())
        .into_iter()
        .filter(|p| !p.starts_with(".cachex-remote"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_file_both_written_and_removed_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    assert_corrupt(
        log.apply(&commit(vec![piece("a.dat", 1)], vec!["a.dat"])),
        &commit_name(1),
        "both written and removed",
    );
}

#[test]
fn huge_ranges_and_sizes_are_refused_before_anything_is_fetched() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    let hash = blake3::hash(&payloads()[1]).to_hex().to_string();
    for (offset, size) in [
        (0u64, u64::MAX),
        (u64::MAX, 1),
        (1u64 << 63, 0),
        (1, i64::MAX as u64),
    ] {
        let p = json!({"path": "big.dat", "offset": offset, "size": size, "blake3": hash});
        assert_corrupt(
            log.apply(&commit(vec![p.clone()], vec![])),
            &commit_name(1),
            "bad range",
        );
        assert_corrupt(
            log.apply_checkpoint(&checkpoint(1, vec![p])),
            &checkpoint_name(1),
            "bad range",
        );
    }
    // A size the object does not have: refused by the fetch, nothing kept.
    let lying = json!({"path": "big.dat", "offset": 0, "size": 1u64 << 40, "blake3": hash});
    let err = log.apply(&commit(vec![lying], vec![])).unwrap_err();
    assert!(matches!(err, Error::Tier(_)), "{err:?}");
    assert!(!log.apply_dir().join("big.dat").exists());
    // A block list whose count does not match the size.
    let listed = json!({"path": "x.bin", "offset": 0, "size": 70_000, "blake3": hash,
        "blocks": {"version": 1, "block_size": 4096, "blake3": vec![hash.clone(); 3]}});
    assert_corrupt(
        log.apply(&commit(vec![listed], vec![])),
        &commit_name(1),
        "x.bin",
    );
}

#[test]
fn records_whose_name_and_number_disagree_are_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    // A checkpoint stored as 1 that says it is a later (or an earlier)
    // one: no record can send a reader to another number than its name's.
    for seq in [2u64, 0, u64::MAX] {
        assert_corrupt(
            log.apply_checkpoint(&checkpoint(seq, vec![piece("a.dat", 1)])),
            &checkpoint_name(1),
            &format!("says seq {seq} under the name of 1"),
        );
    }
    let later = sealed(json!({"version": 3, "seq": 5, "writer": "w", "pieces": [], "log": LOG}));
    assert_corrupt(
        log.apply(&later),
        &commit_name(1),
        "says seq 5 under the name of 1",
    );
    // Versions this build does not write: a newer one, and the older
    // ones of this project (2: no `removed`; 1: no checksum either).
    for version in [4, 2, 1] {
        let other =
            sealed(json!({"version": version, "seq": 1, "writer": "w", "pieces": [], "log": LOG}));
        assert_corrupt(
            log.apply(&other),
            &commit_name(1),
            &format!("version {version}, this build reads 3"),
        );
    }
    // A commit that names no log.
    let unnamed = sealed(json!({"version": 3, "seq": 1, "writer": "w", "pieces": []}));
    assert_corrupt(log.apply(&unnamed), &commit_name(1), "missing field `log`");
    let newer = sealed(json!({"version": 2, "seq": 1, "writer": "gc", "pieces": []}));
    assert_corrupt(
        log.apply_checkpoint(&newer),
        &checkpoint_name(1),
        "version 2",
    );
    // A checkpoint without its checksum, or with a byte changed under it.
    let bare = json!({"version": 1, "seq": 1, "writer": "gc", "pieces": [piece("a.dat", 1)]});
    assert_corrupt(
        log.apply_checkpoint(bare.to_string().as_bytes()),
        &checkpoint_name(1),
        "without its checksum",
    );
    let mut flipped = checkpoint(1, vec![piece("a.dat", 1)]);
    let at = flipped.windows(5).position(|w| w == b"a.dat").unwrap();
    flipped[at] = b'b';
    assert_corrupt(
        log.apply_checkpoint(&flipped),
        &checkpoint_name(1),
        "checksum",
    );
}

#[test]
fn a_checkpoint_with_gaps_is_refused_and_a_sound_one_applies() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    let p = payloads();
    let first = piece("index.log", 1);
    let mut gapped = piece("index.log", 2);
    gapped["offset"] = json!(p[1].len() + 1);
    assert_corrupt(
        log.apply_checkpoint(&checkpoint(1, vec![first.clone(), gapped])),
        &checkpoint_name(1),
        "where the file so far ends at 11",
    );
    let mut next = piece("index.log", 2);
    next["offset"] = json!(p[1].len());
    let applied = log
        .apply_checkpoint(&checkpoint(1, vec![first, next, piece("a/b.dat", 3)]))
        .unwrap();
    assert_eq!(applied, 1);
    let dir = log.apply_dir();
    let mut index = p[1].clone();
    index.extend_from_slice(&p[2]);
    assert_eq!(std::fs::read(dir.join("index.log")).unwrap(), index);
    assert_eq!(std::fs::read(dir.join("a/b.dat")).unwrap(), p[3]);
}
