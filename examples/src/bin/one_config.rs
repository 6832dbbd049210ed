//! `one_config`: the four stores behind one `open(config)` — each cache
//! described by a JSON config, opened (and built from a source where the
//! store is built once), and read through the same `CacheBackend` /
//! `Dataset` interface, with the same `Value` type back.
//!
//! Run: `cargo run -p examples --bin one_config -- [DIR]`
//!
//! Each cache lives in `<DIR>/<name>/<key>/` beside `<key>.lock`; the key
//! hashes `{backend, name, options}`, and `fingerprint.json` records the
//! source files, so editing `labels.txt` makes every cache stale: refused
//! by default, rebuilt with `"on_stale": "rebuild"`.

use cache_facade::{
    CacheBackend, CacheConfig, Dataset, FacadeError, Operation, Source, Value, open,
    open_with_source,
};
use tensor_core::Tensor;

const N: u32 = 100;

/// Sample `i` of the dataset: an 8x8 "image" and its label.
fn sample(i: u32, version: u8) -> Value {
    Value::dict([
        (
            "image",
            Tensor::from_vec([8, 8], vec![(i % 251) as u8 ^ version; 64]).unwrap(),
        ),
        (
            "label",
            Tensor::from_vec([1], vec![i64::from(i % 10)]).unwrap(),
        ),
    ])
}

/// The JSON config of the toy cache on `backend`. Options of the stores
/// built from a source describe that source (they key the cache);
/// segment-store takes only its own options (a typo is an error).
fn config(backend: &str, root: &std::path::Path, stale: &str) -> Result<CacheConfig, FacadeError> {
    let options = if backend == "segment-store" {
        r#"{"flush_every": 64}"#
    } else {
        r#"{"resolution": 8}"#
    };
    CacheConfig::from_json(&format!(
        r#"{{
            "backend": "{backend}",
            "root": {root:?},
            "name": "toy-{backend}",
            "options": {options},
            "sources": {{"root": {sources:?}, "paths": ["labels.txt"]}},
            "create_root": true,
            "on_stale": "{stale}"
        }}"#,
        sources = root.join("raw"),
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let root = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(root.join("raw"))?;
    std::fs::write(root.join("raw/labels.txt"), "v1\n")?;

    // Built-once and iterator-fed stores take a source; segment-store is
    // filled by puts.
    let items = |version: u8| Source::items(move || (0..N).map(move |i| sample(i, version)));
    let segments = open(&config("segment-store", &root, "error")?)?;
    segments.put_batch((0..N).map(|i| (format!("img-{i}"), sample(i, 1))).collect())?;
    segments.flush()?;
    let indexed: Vec<(&str, Box<dyn CacheBackend>)> = vec![
        (
            "memmap-array",
            open_with_source(&config("memmap-array", &root, "error")?, items(1))?,
        ),
        (
            "shard-store",
            open_with_source(&config("shard-store", &root, "error")?, items(1))?,
        ),
        (
            "page-alloc",
            open_with_source(&config("page-alloc", &root, "error")?, items(1))?,
        ),
    ];

    // One value type, whichever store answers.
    let by_key = segments.get("img-42")?.ok_or("img-42 cached")?;
    for (name, cache) in indexed {
        let loader = Dataset::new(cache)?;
        let batch = loader.get_many(&[42, -1])?;
        assert_eq!(batch[0], by_key, "{name}");
        println!(
            "{name:>13}: {} samples; sample 42 equals the segment-store value; put supported: {}",
            loader.len()?,
            loader.backend().supports(Operation::Put)
        );
    }

    // What a store cannot do is a typed error that says so.
    let pages = open(&config("page-alloc", &root, "error")?)?;
    let err = pages
        .put_batch(vec![("x".into(), sample(0, 1))])
        .unwrap_err();
    println!("page-alloc put: {err}");
    assert!(matches!(err, FacadeError::Unsupported { .. }));

    // A source file changes: refused with the reason, then rebuilt.
    std::fs::write(root.join("raw/labels.txt"), "v2, relabelled\n")?;
    let err = open(&config("page-alloc", &root, "error")?)
        .err()
        .ok_or("stale")?;
    println!("after editing labels.txt: {err}");
    assert!(matches!(err, FacadeError::Stale { .. }));
    let rebuilt = open_with_source(&config("page-alloc", &root, "rebuild")?, items(2))?;
    assert_eq!(rebuilt.get_index(42)?, sample(42, 2));
    println!("rebuilt page-alloc cache: sample 42 comes from the new source");
    Ok(())
}
