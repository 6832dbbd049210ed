//! The fuzz seeds are valid inputs: each passes its target's parser, so
//! the fuzzers start past magic numbers and checksums. Each seed is run
//! the way its fuzz target (`fuzz/fuzz_targets/`) runs its input.

use std::path::Path;

use reliability::fuzz_seeds::{BETON_SEED_PAGE, Seed, TARGETS, seeds, shrink_beton};

/// The longest input `scripts/fuzz` lets each target's fuzzer make.
fn max_len(target: &str) -> usize {
    match target {
        "page_alloc_open" | "beton_read" => 16384,
        _ => 4096,
    }
}

fn all_seeds() -> Vec<Seed> {
    let scratch = tempfile::tempdir().unwrap();
    seeds(&test_support::fixtures_dir(), scratch.path()).unwrap()
}

#[test]
fn every_target_has_seeds_within_its_max_len() {
    let all = all_seeds();
    for target in TARGETS {
        let mine: Vec<&Seed> = all.iter().filter(|s| s.target == target).collect();
        assert!(mine.len() >= 3, "{target}: {} seeds", mine.len());
        for s in mine {
            assert!(s.name.starts_with("seed-"), "{}", s.name);
            assert!(
                s.bytes.len() <= max_len(target),
                "{target}/{}: {} bytes, max_len {}",
                s.name,
                s.bytes.len(),
                max_len(target)
            );
        }
    }
    let mut names: Vec<(&str, &str)> = all.iter().map(|s| (s.target, s.name.as_str())).collect();
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n, "seed names repeat");
}

#[test]
fn seeds_are_the_same_on_every_run() {
    assert_eq!(all_seeds(), all_seeds());
}

#[test]
fn page_and_beton_seeds_open_and_read() {
    for s in all_seeds() {
        match s.target {
            "page_alloc_open" => {
                let n = page_alloc::fuzz_entry::open_and_read(&s.bytes);
                assert!(n.is_ok(), "{}: {n:?}", s.name);
                let resealed = page_alloc::fuzz_entry::open_and_read_resealed(&s.bytes);
                assert_eq!(resealed.ok(), n.ok(), "{}", s.name);
            }
            "beton_read" => {
                let n = page_alloc::fuzz_entry::beton_read(&s.bytes);
                assert!(n.is_ok(), "{}: {n:?}", s.name);
                let file =
                    page_alloc::beton::BetonFile::from_bytes(s.bytes.clone(), &s.name).unwrap();
                assert_eq!(file.page_size(), BETON_SEED_PAGE, "{}", s.name);
            }
            _ => {}
        }
    }
}

/// The FFCV fixture cut to its first samples reads back the same values
/// as the whole file.
#[test]
fn shrunk_ffcv_file_keeps_its_first_samples() {
    let real = std::fs::read(test_support::fixtures_dir().join("ffcv/small_w1.beton")).unwrap();
    let whole = page_alloc::beton::BetonFile::from_bytes(real.clone(), "whole").unwrap();
    let cut = shrink_beton(&real, 3).unwrap();
    let cut = page_alloc::beton::BetonFile::from_bytes(cut, "cut").unwrap();
    assert_eq!(cut.len(), 3);
    assert_eq!(cut.fields(), whole.fields());
    for i in 0..3 {
        assert_eq!(
            cut.sample(i).unwrap(),
            whole.sample(i).unwrap(),
            "sample {i}"
        );
    }
    // All 40 samples span more than one 4 KiB page.
    assert_eq!(shrink_beton(&real, 40), None);
}

#[test]
fn memmap_seeds_parse() {
    use memmap_array::fuzz_entry::{manifest_jsonl, shapes_json, sidecar_json};
    for s in all_seeds().iter().filter(|s| s.target == "memmap_parsers") {
        let (&which, body) = s.bytes.split_first().unwrap();
        let count = match which % 3 {
            0 => shapes_json(body).map(|n| n as usize),
            1 => manifest_jsonl(body).map(|n| n as usize),
            _ => sidecar_json(body),
        };
        assert!(matches!(count, Ok(n) if n > 0), "{}: {count:?}", s.name);
    }
}

#[test]
fn shard_seeds_parse_and_decode() {
    use shard_store::format::{self, ShardName};
    let path = Path::new("seed");
    for s in all_seeds().iter().filter(|s| s.target == "shard_parsers") {
        let (&which, body) = s.bytes.split_first().unwrap();
        if which % 2 == 0 {
            let meta = format::Metadata::parse(path, body);
            assert!(meta.is_ok(), "{}: {meta:?}", s.name);
        } else {
            let count = format::check_pickle(path, body).unwrap();
            let name = ShardName {
                start: 0,
                end: u64::from(which / 2),
            };
            assert_eq!(count, Some(name.end), "{}", s.name);
            let items = format::decode_shard::<shard_store::PickleValue>(path, name, body);
            assert!(
                matches!(&items, Ok(v) if v.len() as u64 == name.end),
                "{}: {items:?}",
                s.name
            );
        }
    }
}

#[test]
fn segment_seeds_open_cleanly() {
    use segment_store::format::{INDEX_FILE, SCHEMA_FILE, parse_index};
    use segment_store::{Options, SegmentStore};
    for s in all_seeds().iter().filter(|s| s.target == "segment_parsers") {
        let (&which, body) = s.bytes.split_first().unwrap();
        if which % 4 == 0 {
            let log = parse_index(body, |_, _| {}).unwrap();
            assert_eq!(log.valid_len, body.len() as u64, "{}", s.name);
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let name = match which % 4 {
            1 => "segments/segment_000000.arrow",
            2 => INDEX_FILE,
            _ => SCHEMA_FILE,
        };
        std::fs::create_dir_all(dir.path().join("segments")).unwrap();
        std::fs::write(dir.path().join(name), body).unwrap();
        let opts = Options {
            read_only: true,
            ..Options::default()
        };
        let store = SegmentStore::open(dir.path(), opts).unwrap();
        match which % 4 {
            1 => {
                // A segment alone is indexed from its key column and reads
                // (its schema is derived: schema.json is missing).
                assert!(!store.is_empty(), "{}", s.name);
                let keys: Vec<String> = (0..20).map(|i| format!("sample_{i}")).collect();
                let (records, _) = store.get_batch(&keys).unwrap();
                assert!(records.iter().any(Option::is_some), "{}", s.name);
                let segment_problems: Vec<_> = (store.problems().into_iter())
                    .chain(store.verify())
                    .filter(|p| !p.path.ends_with(SCHEMA_FILE))
                    .collect();
                assert_eq!(segment_problems, vec![], "{}", s.name);
            }
            3 => assert!(store.schema().is_some(), "{}", s.name),
            _ => {}
        }
    }
}
