//! The remote path's fuzz seeds are valid inputs: each passes its
//! target's checks the way the target (`fuzz/fuzz_targets/`) runs it, so
//! the fuzzers start past the JSON, version and checksum checks.

use reliability::fuzz_seeds::Seed;
use reliability::remote_seeds::{TARGETS, seeds};
use remote_cache::fuzz_entry::CommitLog;
use remote_tier::BlockList;

/// `scripts/fuzz`'s `-max_len` for these targets.
const MAX_LEN: usize = 4096;

fn all_seeds() -> Vec<Seed> {
    let scratch = tempfile::tempdir().unwrap();
    seeds(scratch.path()).unwrap()
}

#[test]
fn every_target_has_seeds_within_max_len_and_they_repeat() {
    let all = all_seeds();
    for target in TARGETS {
        let mine: Vec<&Seed> = all.iter().filter(|s| s.target == target).collect();
        assert!(mine.len() >= 3, "{target}: {} seeds", mine.len());
        for s in mine {
            assert!(s.name.starts_with("seed-"), "{}", s.name);
            assert!(
                s.bytes.len() <= MAX_LEN,
                "{target}/{}: {}",
                s.name,
                s.bytes.len()
            );
        }
    }
    assert_eq!(all, all_seeds(), "seeds differ from run to run");
}

#[test]
fn commit_seeds_read_and_apply() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    for s in all_seeds().iter().filter(|s| s.target == "remote_commit") {
        let (&which, body) = s.bytes.split_first().unwrap();
        if which & 4 != 0 {
            let applied = log.apply_checkpoint(body);
            assert!(matches!(applied, Ok(1)), "{}: {applied:?}", s.name);
            continue;
        }
        let read = log.read(body);
        assert!(matches!(read, Ok(Some(_))), "{}: {read:?}", s.name);
        if which % 2 == 1 {
            let applied = log.apply(body);
            assert!(matches!(applied, Ok(1)), "{}: {applied:?}", s.name);
        }
    }
}

#[test]
fn block_list_and_block_map_seeds_check() {
    for s in all_seeds() {
        match s.target {
            "remote_block_list" => {
                let (size, json) = s.bytes.split_at(8);
                let size = u64::from_le_bytes(size.try_into().unwrap());
                let list: BlockList = serde_json::from_slice(json).unwrap();
                let checked = list.check(size);
                assert!(checked.is_ok(), "{}: {checked:?}", s.name);
            }
            "tier_block_map" => {
                let n = remote_tier::fuzz_entry::block_map(&s.bytes);
                assert!(n.is_ok(), "{}: {n:?}", s.name);
                assert_eq!(remote_tier::fuzz_entry::block_map_resealed(&s.bytes), n);
            }
            _ => {}
        }
    }
}

/// The fuzz target's apply never writes outside its working directory: a
/// commit naming `../escape` is refused before anything is written.
#[test]
fn a_commit_that_climbs_out_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let log = CommitLog::new(scratch.path()).unwrap();
    let p = &remote_cache::fuzz_entry::payloads()[1];
    let body = serde_json::json!({
        "version": remote_cache::COMMIT_VERSION,
        "seq": 1,
        "writer": "w",
        "pieces": [{"path": "../escape", "offset": 0, "size": p.len(), "blake3": blake3::hash(p).to_hex().to_string()}],
        "log": "0123456789abcdef0123456789abcdef",
    });
    let body = remote_cache::record::seal(body).unwrap();
    let err = log.apply(&body).unwrap_err();
    assert!(
        err.to_string().contains("not a relative path inside"),
        "{err}"
    );
    assert!(!scratch.path().join("escape").exists());
}
