//! Truncations and bit flips of every store's files: `cachex verify` (the
//! library function behind it) flags every case, and nothing panics.
//!
//! Truncation is checked for every file of every store (at every offset of
//! small files, at spread offsets of larger ones). Bit flips are checked
//! where the format carries checksums over every byte: segment-store
//! (segments hashed in the index log, which is itself checksummed) and
//! page-alloc (header, tables and pages hashed, footer). memmap-array's raw
//! `.bin` arrays and loadit-format pickle shards carry no checksum (their
//! peer formats have no room for one): a flipped data byte there reads back
//! as a different value; RELIABILITY.md lists this.

use std::path::{Path, PathBuf};

use cachex_cli::verify_path;

fn copy_dir(src: &Path, dst: &Path) {
    if src.is_dir() {
        std::fs::create_dir_all(dst).unwrap();
        for e in std::fs::read_dir(src).unwrap() {
            let e = e.unwrap();
            copy_dir(&e.path(), &dst.join(e.file_name()));
        }
    } else {
        std::fs::copy(src, dst).unwrap();
    }
}

/// Files of a cache worth damaging (not locks, not empty sentinels).
fn files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if root.is_file() {
        return vec![root.to_path_buf()];
    }
    for e in std::fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "locks" {
                out.extend(files(&p));
            }
        } else if !name.ends_with(".lock") && std::fs::metadata(&p).unwrap().len() > 0 {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// Every offset of a small file, about 64 spread offsets of a larger one.
fn offsets(len: u64) -> Vec<u64> {
    if len <= 2048 {
        (0..len).collect()
    } else {
        let mut v: Vec<u64> = (0..64).map(|k| k * len / 64).collect();
        v.extend([len - 1, len - 2, len - 8]);
        v
    }
}

/// Applies `damage` to `file` in a fresh copy of `cache` and returns what
/// verify says (Err or problems; Ok(empty) means unflagged).
fn verify_damaged(
    cache: &Path,
    file: &Path,
    damage: impl Fn(&Path),
) -> Result<Vec<cachex_cli::Problem>, cachex_cli::CliError> {
    let tmp = tempfile::tempdir().unwrap();
    let copy = tmp.path().join(cache.file_name().unwrap());
    copy_dir(cache, &copy);
    let target = copy.join(file.strip_prefix(cache).unwrap_or(Path::new("")));
    let target = if cache.is_file() {
        copy.clone()
    } else {
        target
    };
    damage(&target);
    verify_path(&copy).map(|(_, problems)| problems)
}

fn assert_truncations_flagged(cache: &Path) -> usize {
    assert_eq!(
        verify_path(cache).unwrap().1,
        Vec::new(),
        "the pristine cache is sound"
    );
    let mut cases = 0;
    for file in files(cache) {
        let len = std::fs::metadata(&file).unwrap().len();
        let content = std::fs::read(&file).unwrap();
        for at in offsets(len) {
            // Dropping only trailing whitespace (a JSON file's newline)
            // leaves the same content: not damage.
            if content[at as usize..].iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let verdict = verify_damaged(cache, &file, |p| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(p)
                    .unwrap()
                    .set_len(at)
                    .unwrap();
            });
            assert!(
                !matches!(&verdict, Ok(p) if p.is_empty()),
                "{} truncated to {at} of {len} bytes went unflagged",
                file.display()
            );
            cases += 1;
        }
    }
    cases
}

fn assert_flips_flagged(cache: &Path, which: impl Fn(&Path) -> bool) -> usize {
    let mut cases = 0;
    for file in files(cache).into_iter().filter(|f| which(f)) {
        let len = std::fs::metadata(&file).unwrap().len();
        for at in offsets(len) {
            let bit = 1u8 << (at % 8);
            let verdict = verify_damaged(cache, &file, |p| {
                let mut bytes = std::fs::read(p).unwrap();
                bytes[at as usize] ^= bit;
                std::fs::write(p, bytes).unwrap();
            });
            assert!(
                !matches!(&verdict, Ok(p) if p.is_empty()),
                "{} with bit {bit:#04x} of byte {at} flipped went unflagged",
                file.display()
            );
            cases += 1;
        }
    }
    cases
}

fn segment_cache(dir: &Path) {
    use segment_store::{Options, SegmentStore};
    let store = SegmentStore::open(dir, Options::default()).unwrap();
    for b in 0..3 {
        let items: Vec<(String, tensor_core::Value)> = (0..5)
            .map(|j| {
                let t = tensor_core::Tensor::from_vec([4], vec![(b * 5 + j) as f32; 4]).unwrap();
                (format!("k{b}_{j}"), tensor_core::Value::from(t))
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
}

#[test]
fn segment_store_truncations_and_flips() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("seg");
    segment_cache(&dir);
    let t = assert_truncations_flagged(&dir);
    let f = assert_flips_flagged(&dir, |p| {
        p.extension().is_some_and(|e| e == "arrow")
            || p.ends_with(segment_store::format::INDEX_FILE)
    });
    eprintln!("segment-store: {t} truncations, {f} bit flips flagged");
}

#[test]
fn memmap_array_truncations() {
    use memmap_array::{NewRow, RowWriter, Schema};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("mm");
    let schema = Schema::builder()
        .array("x", tensor_core::DType::I32, [3])
        .nullable_array("y", tensor_core::DType::U8, [2])
        .sidecar("tag")
        .build()
        .unwrap();
    let mut w = RowWriter::create_or_resume(&dir, &schema, serde_json::json!({"t": 1})).unwrap();
    for i in 0..6 {
        let x = tensor_core::Tensor::from_vec([3], vec![i; 3]).unwrap();
        let id = format!("s{i}");
        let tag = format!("tag-{}", i % 2);
        w.write(
            &NewRow::new(&id)
                .array("x", x.view())
                .null("y")
                .sidecar("tag", &tag),
        )
        .unwrap();
    }
    w.finalize().unwrap();
    let t = assert_truncations_flagged(&dir);
    eprintln!("memmap-array: {t} truncations flagged");
}

#[test]
fn shard_store_truncations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("sh");
    let store = shard_store::ShardStore::open_with_source(
        &dir,
        shard_store::Options::default().shard_items(10),
        || (0..40u32).map(|i| (i, format!("v{i}"))),
    )
    .unwrap();
    store.wait_until_all_cached().unwrap();
    drop(store);
    let t = assert_truncations_flagged(&dir);
    eprintln!("shard-store: {t} truncations flagged");
}

#[test]
fn page_alloc_truncations_and_flips() {
    use page_alloc::{PageWriter, Schema, Value, WriterOptions};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("data.pages");
    let opts = WriterOptions {
        page_size: 4096,
        alignment: 8,
        ..WriterOptions::default()
    };
    let mut w = PageWriter::create(&path, Schema::new().int("i").bytes("b"), opts).unwrap();
    for i in 0..12i64 {
        let bytes = vec![i as u8 + 1; 100 + i as usize * 40];
        w.append(&[Value::Int(i), Value::Bytes(&bytes)]).unwrap();
    }
    w.finalize().unwrap();
    let t = assert_truncations_flagged(&path);
    let f = assert_flips_flagged(&path, |_| true);
    eprintln!("page-alloc: {t} truncations, {f} bit flips flagged");
}

#[test]
fn beton_truncations() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("small.beton");
    std::fs::copy(
        test_support::fixtures_dir().join("ffcv/small_w1.beton"),
        &path,
    )
    .unwrap();
    let t = assert_truncations_flagged(&path);
    eprintln!("beton: {t} truncations flagged");
}
