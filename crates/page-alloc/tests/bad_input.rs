//! Damaged files and bad caller input: typed errors naming the file,
//! never a panic.

mod common;

use common::{meta_offset, reseal, write_blobs};
use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
use page_alloc::fuzz_entry::{beton_read, open_and_read, open_and_read_resealed};
use page_alloc::{
    Error, PageReader, PageWriter, Schema, Value, WriterOptions, verify, verify_with,
};
use tensor_core::DType;

fn sample_file() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.pages");
    write_blobs(&path, &[100, 3000, 0, 700, 9000, 12]);
    std::fs::read(&path).unwrap()
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn open_bytes(bytes: &[u8]) -> Result<PageReader, Error> {
    PageReader::from_bytes(bytes.to_vec(), "edited.pages")
}

#[test]
fn bit_flips_in_header_tables_and_footer_are_errors() {
    let good = sample_file();
    assert!(open_and_read(&good).is_ok());
    let header_len = u32::from_le_bytes(good[12..16].try_into().unwrap()) as usize;
    let meta = meta_offset(&good);
    let checked: Vec<usize> = (0..header_len).chain(meta..good.len()).collect();
    for &at in &checked {
        for bit in [0, 3, 7] {
            let mut bad = good.clone();
            bad[at] ^= 1 << bit;
            let err = open_and_read(&bad).unwrap_err();
            assert!(err.is_bad_file(), "flip at {at}: {err}");
        }
    }
}

/// `verify_with` asks for every byte of the pages and the padding before
/// it reads it, holds each range only while it checks it, finds what
/// `verify` finds, and names a range it could not get as an `io` problem.
#[test]
fn verify_with_holds_each_range_while_it_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let good = sample_file();
    let data_offset = u64_at(&good, 40);
    let meta = meta_offset(&good) as u64;
    let path = dir.path().join("held.pages");
    std::fs::write(&path, &good).unwrap();

    let live = std::cell::Cell::new(0usize);
    struct Guard<'a>(&'a std::cell::Cell<usize>);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() - 1);
        }
    }
    let mut asked: Vec<std::ops::Range<u64>> = Vec::new();
    let problems = verify_with(&path, |r| {
        assert_eq!(live.get(), 0, "{r:?} asked for while another range is held");
        live.set(1);
        asked.push(r);
        Ok(Guard(&live))
    });
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(live.get(), 0);
    // Every byte from the data's start to the tables was asked for.
    asked.sort_by_key(|r| r.start);
    let mut covered = data_offset;
    for r in asked
        .iter()
        .filter(|r| r.start >= data_offset && !r.is_empty())
    {
        assert!(
            r.start <= covered,
            "bytes {covered}..{} never asked for",
            r.start
        );
        covered = covered.max(r.end);
    }
    assert_eq!(covered, meta);

    let mut bad = good.clone();
    bad[data_offset as usize + 1] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    assert_eq!(verify_with(&path, |_| Ok(())), verify(&path));
    assert!(!verify(&path).is_empty());

    std::fs::write(&path, &good).unwrap();
    let failed = verify_with(&path, |r| match r.start >= data_offset {
        true => Err(std::io::Error::other("the bucket said no")),
        false => Ok(()),
    });
    assert_eq!(failed.len(), 1, "{failed:?}");
    let text = failed[0].to_string();
    assert!(
        text.contains("held.pages") && text.contains("the bucket said no"),
        "{text}"
    );
}

#[test]
fn bit_flips_in_pages_are_caught_by_verify() {
    let dir = tempfile::tempdir().unwrap();
    let good = sample_file();
    let data_offset = u64_at(&good, 40) as usize;
    let meta = meta_offset(&good);
    let path = dir.path().join("flipped.pages");
    let mut caught = 0;
    for at in (data_offset..meta).step_by(61) {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        // Opening only checks the index: it still works (and never panics).
        assert!(open_and_read(&bad).is_ok());
        std::fs::write(&path, &bad).unwrap();
        let problems = verify(&path);
        // Data bytes are hashed; padding past a run's used length must be
        // zero: every flip is caught.
        assert!(!problems.is_empty(), "flip at {at} not caught");
        caught += 1;
        let first = problems[0].to_string();
        assert!(first.contains("flipped.pages"), "{first}");
        assert!(
            first.contains("checksum") || first.contains("padding is not zero"),
            "{first}"
        );
    }
    assert!(caught > 100, "only {caught} flips caught");

    // Damage in several runs (pages 0, 1-3 for the 9000-byte sample, 4):
    // every damaged run is listed.
    let mut bad = good.clone();
    for page in [0, 2, 4] {
        bad[data_offset + page * 4096 + 1] ^= 1;
    }
    std::fs::write(&path, &bad).unwrap();
    let problems = verify(&path);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems
            .iter()
            .all(|p| p.kind == cache_check::ProblemKind::ChecksumMismatch && p.path == path),
        "{problems:?}"
    );
}

#[test]
fn random_mutations_and_truncations_never_panic() {
    let good = sample_file();
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..3000 {
        let mut bad = good.clone();
        for _ in 0..(next() % 4 + 1) {
            let at = (next() % bad.len() as u64) as usize;
            bad[at] = next() as u8;
        }
        if next() % 3 == 0 {
            let len = (next() % bad.len() as u64) as usize;
            bad.truncate(len);
            // A shorter file has lost its footer or the bytes it counts.
            assert!(
                open_and_read(&bad).is_err(),
                "truncated to {len} but opened"
            );
        }
        let _ = open_and_read(&bad);
        // Re-sealed mutations reach the structural checks.
        let _ = open_and_read_resealed(&bad);
    }
}

/// Edits the metadata row of sample `s` (blob schema: id i64, ptr, size).
fn edit_row(bytes: &mut [u8], s: usize, ptr: Option<u64>, size: Option<u64>) {
    let row = meta_offset(bytes) + s * 24;
    if let Some(p) = ptr {
        bytes[row + 8..row + 16].copy_from_slice(&p.to_le_bytes());
    }
    if let Some(n) = size {
        bytes[row + 16..row + 24].copy_from_slice(&n.to_le_bytes());
    }
    reseal(bytes);
}

fn expect_corrupt(bytes: &[u8], needle: &str) {
    let err = open_bytes(bytes).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("edited.pages") && text.contains(needle),
        "{text}"
    );
}

#[test]
fn structural_damage_behind_valid_checksums_is_caught() {
    let good = sample_file();
    let row = |s: usize| meta_offset(&good) + s * 24;
    let ptr0 = u64_at(&good, row(0) + 8);
    let ptr1 = u64_at(&good, row(1) + 8);

    let mut b = good.clone();
    edit_row(&mut b, 1, Some(ptr0 + 64), None);
    expect_corrupt(&b, "overlaps");

    let mut b = good.clone();
    edit_row(&mut b, 1, None, Some(u64::MAX));
    expect_corrupt(&b, "run past");

    let mut b = good.clone();
    edit_row(&mut b, 1, Some(ptr1 + 1), None);
    expect_corrupt(&b, "aligned");

    let mut b = good.clone();
    edit_row(&mut b, 5, Some(u64::MAX - 3), Some(10));
    expect_corrupt(&b, "");

    // Run table: first run's sample count.
    let mut b = good.clone();
    let runs = u64_at(&b, 72) as usize;
    b[runs + 32..runs + 40].copy_from_slice(&99u64.to_le_bytes());
    reseal(&mut b);
    expect_corrupt(&b, "run 0");

    // Header counts that disagree with the tables.
    let mut b = good.clone();
    b[32..40].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    reseal(&mut b);
    assert!(open_bytes(&b).unwrap_err().is_bad_file());

    // Footer missing: never committed.
    let mut b = good.clone();
    let n = b.len();
    b[n - 8..].fill(0);
    assert!(matches!(
        open_bytes(&b).unwrap_err(),
        Error::Incomplete { .. }
    ));

    // Another version.
    let mut b = good.clone();
    b[8] = 9;
    assert!(matches!(
        open_bytes(&b).unwrap_err(),
        Error::UnsupportedVersion { found: 9, .. }
    ));
}

#[test]
fn damaged_beton_files_are_errors_never_panics() {
    let good = std::fs::read(test_support::fixtures_dir().join("ffcv/small_w2.beton")).unwrap();
    assert!(beton_read(&good).is_ok());
    let open = |b: &[u8]| beton::BetonFile::from_bytes(b.to_vec(), "edited.beton");
    let meta = 24 + 1041 * 5;
    let atp = u64_at(&good, 16) as usize;

    // Header, descriptors (their argument bytes sparsely), the first rows of
    // metadata and of the allocation table, and a stride of the pages.
    let offsets = (0..24 + 1041 * 5)
        .filter(|at| *at < 24 || (at - 24) % 1041 < 17 || at % 7 == 0)
        .chain(meta..meta + 56 * 5)
        .chain(atp..atp + 24 * 8)
        .chain((meta..good.len()).step_by(16411));
    for at in offsets {
        let mut bad = good.clone();
        bad[at] ^= 0x5a;
        let _ = beton_read(&bad);
    }
    for len in (0..good.len())
        .step_by(65521)
        .chain([good.len() - 1, atp + 5])
    {
        assert!(beton_read(&good[..len]).is_err(), "truncated to {len}");
    }
    let case = |edit: &dyn Fn(&mut Vec<u8>), needle: &str| {
        let mut b = good.clone();
        edit(&mut b);
        let err = open(&b).unwrap_err();
        assert!(err.to_string().contains("edited.beton"), "{err}");
        assert!(err.to_string().contains(needle), "{needle}: {err}");
    };
    case(&|b| b[0] = 1, "version 1");
    case(
        &|b| b[4..8].copy_from_slice(&0u32.to_le_bytes()),
        "page size",
    );
    case(
        &|b| b[16..24].copy_from_slice(&(u64::MAX).to_le_bytes()),
        "allocation table",
    );
    case(&|b| b[24] = 6, "type id 6");
    // Sample 1's blob pointer moved onto sample 0's blob.
    case(
        &|b| {
            let p = u64_at(b, meta + 16);
            b[meta + 56 + 16..meta + 56 + 24].copy_from_slice(&p.to_le_bytes());
        },
        "no free allocation",
    );
    // An allocation row made to overlap its neighbour.
    case(
        &|b| {
            let p = u64_at(b, atp + 8) + 4;
            b[atp + 24 + 8..atp + 24 + 16].copy_from_slice(&p.to_le_bytes());
        },
        "overlaps",
    );
    // An allocation row pointing past the data region.
    case(
        &|b| b[atp + 8..atp + 16].copy_from_slice(&(atp as u64).to_le_bytes()),
        "outside the data region",
    );
    // NDArray shape overflow.
    case(
        &|b| {
            let args = 24 + 1041 * 3 + 17;
            b[args..args + 8].copy_from_slice(&u64::MAX.to_le_bytes());
            b[args + 8..args + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        },
        "arr",
    );
}

#[test]
fn bad_schemas_options_and_samples_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.pages");
    let create =
        |schema: Schema, opts: WriterOptions| PageWriter::create(&path, schema, opts).map(|_| ());
    let invalid = |r: Result<(), Error>| assert!(matches!(r, Err(Error::Invalid { .. })), "{r:?}");
    invalid(create(
        Schema::new().int("a").int("a"),
        WriterOptions::default(),
    ));
    invalid(create(Schema::new().int(""), WriterOptions::default()));
    invalid(create(
        Schema::new().int("x".repeat(41)),
        WriterOptions::default(),
    ));
    invalid(create(
        Schema::new().array("a", DType::F32, [1, 1, 1, 1, 1, 1, 1]),
        WriterOptions::default(),
    ));
    invalid(create(
        Schema::new().int("a"),
        WriterOptions::default().page_size(5000),
    ));
    invalid(create(
        Schema::new().int("a"),
        WriterOptions::default().page_size(1024),
    ));
    invalid(create(
        Schema::new().int("a"),
        WriterOptions::default().alignment(3),
    ));
    invalid(create(Schema::new(), WriterOptions::default()));
    invalid(create(
        Schema::new().int("a"),
        WriterOptions::default().alignment(8192),
    ));

    let schema = Schema::new().int("i").array("a", DType::U16, [3]);
    let mut w = PageWriter::create(&path, schema.clone(), WriterOptions::default()).unwrap();
    let err = w
        .append(&[Value::Bytes(b"x"), Value::Bytes(&[0; 6])])
        .unwrap_err();
    assert!(matches!(err, Error::Source { .. }), "{err}");
    drop(w);
    let mut w = PageWriter::create(&path, schema.clone(), WriterOptions::default()).unwrap();
    let err = w
        .append(&[Value::Int(1), Value::Bytes(&[0; 5])])
        .unwrap_err();
    assert!(matches!(err, Error::BadSample { .. }), "{err}");
    assert!(
        err.to_string().contains("w.pages") && err.to_string().contains("needs 6"),
        "{err}"
    );
    // After a failure the writer refuses to go on rather than write a bad file.
    assert!(w.append(&[Value::Int(1), Value::Bytes(&[0; 6])]).is_err());
    assert!(w.finalize().is_err());
    assert!(!path.exists());

    // A .beton without fields claiming 2^64 - 1 samples: answered at once.
    let mut header = Vec::new();
    header.extend_from_slice(&2u16.to_le_bytes());
    header.extend_from_slice(&0u16.to_le_bytes());
    header.extend_from_slice(&(1u32 << 21).to_le_bytes());
    header.extend_from_slice(&u64::MAX.to_le_bytes());
    header.extend_from_slice(&24u64.to_le_bytes());
    let _ = page_alloc::fuzz_entry::beton_read(&header);

    // beton: FFCV's limits.
    let bpath = dir.path().join("x.beton");
    let f = [BetonField::new("b", BetonType::Bytes)];
    let big = vec![0u8; (2 << 20) + 1];
    let err = beton::write_with_page_size(&bpath, &f, &[vec![BetonValue::Bytes(&big)]], 2 << 20)
        .unwrap_err();
    assert!(err.to_string().contains("page size"), "{err}");
    let err = beton::write_with_page_size(&bpath, &f, &[], 1 << 20).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    let long = [BetonField::new("a_name_longer_than_16", BetonType::Int)];
    assert!(beton::write(&bpath, &long, &[]).is_err());
    let j = [BetonField::new("j", BetonType::Json)];
    assert!(beton::write(&bpath, &j, &[vec![BetonValue::Json("{not json")]]).is_err());
    assert!(beton::write(&bpath, &j, &[vec![BetonValue::Int(3)]]).is_err());
    assert!(!bpath.exists());
}

/// `bytes` relabelled as format version `version` (header and footer), resealed.
fn relabel(bytes: &[u8], version: u32) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let n = b.len();
    b[8..12].copy_from_slice(&version.to_le_bytes());
    b[n - 24..n - 20].copy_from_slice(&version.to_le_bytes());
    reseal(&mut b);
    b
}

#[test]
fn version_1_files_are_refused_and_version_2_checks_its_data_start() {
    // Version 1 (data at the next 4 KiB) was never released: a file
    // labelled so is refused, naming the file and the version.
    let good = sample_file();
    assert_eq!(u64_at(&good, 40), 4096);
    let err = open_bytes(&relabel(&good, 1)).unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedVersion { found: 1, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("edited.pages"), "{err}");

    // 64 KiB pages: version 2 starts the data at 64 KiB, and a data start
    // anywhere else (the next 4 KiB) is refused.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.pages");
    let mut w = PageWriter::create(
        &path,
        common::blob_schema(),
        WriterOptions::default().page_size(64 << 10).alignment(64),
    )
    .unwrap();
    w.write_parallel(&common::Blobs(vec![100, 70_000, 5]), 1)
        .unwrap();
    w.finalize().unwrap();
    let v2 = std::fs::read(&path).unwrap();
    assert_eq!(u64_at(&v2, 40), 64 << 10);
    assert_eq!(page_alloc::inspect(&path).unwrap().format_version, 2);
    assert!(open_and_read(&v2).is_ok());
    let mut moved = v2.clone();
    moved[40..48].copy_from_slice(&4096u64.to_le_bytes());
    reseal(&mut moved);
    expect_corrupt(&moved, "data offset 4096");
}
