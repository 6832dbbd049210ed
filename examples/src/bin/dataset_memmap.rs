//! `dataset_memmap`: a fixed-shape dataset cache with memmap-array —
//! built from source files, interrupted, resumed, reused, and rebuilt when
//! a source changes (and told why).
//!
//! Run: `cargo run -p examples --bin dataset_memmap -- [DIR]`
//!
//! The build goes through memmap-array's `open_or_build` (it writes
//! nullable arrays, sidecars and per-row metadata, which the facade's
//! source-built rows do not); the training loop then opens the very same
//! cache through the facade, `cache_facade::open(config)`, and samples it
//! as a `Dataset`.
//!
//! Layout of the cache (`<DIR>/cache/dataset/<key>/`): one `.bin` per array
//! (numpy.memmap reads them as they are), `index.parquet`, deduplicated
//! sidecar JSON, `shapes.json`, `fingerprint.json`, `_COMPLETE`.

use std::path::Path;

use cache_facade::{CacheConfig, Dataset, SourcesConfig, StoreKind, Value, open};
use fingerprint::{Mode, stamp_sources};
use memmap_array::{NewRow, Outcome, RowWriter, Schema, open_or_build};
use tensor_core::{DType, Tensor};

const SAMPLES: usize = 200;
const L: usize = 64;

/// "Decodes" sample `i`'s source file into its three arrays.
fn decode(
    raw: &Path,
    i: usize,
) -> Result<(Tensor, Tensor, Option<Tensor>), Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(raw.join(format!("sample_{i:04}.txt")))?;
    let seed: i64 = text.trim().parse()?;
    let data: Vec<i16> = (0..3 * L)
        .map(|k| ((seed * 31 + k as i64) % 1000) as i16)
        .collect();
    let ann: Vec<i8> = (0..3 * L).map(|k| ((seed + k as i64) % 3) as i8).collect();
    // Every fifth sample has no scaler: stored zero-filled, flagged absent.
    let scaler = (!i.is_multiple_of(5))
        .then(|| Tensor::from_vec([L], (0..L).map(|k| 1.0 + k as f32 / seed as f32).collect()));
    Ok((
        Tensor::from_vec([3, L], data)?,
        Tensor::from_vec([3, L], ann)?,
        scaler.transpose()?,
    ))
}

fn build(
    w: &mut RowWriter,
    raw: &Path,
    stop_after: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let done: std::collections::HashSet<String> = w.resume_keys().iter().cloned().collect();
    let mut written = 0;
    for i in 0..SAMPLES {
        let id = format!("sample_{i:04}");
        if done.contains(id.as_str()) {
            continue;
        }
        if stop_after == Some(written) {
            // Commit what we have, then "crash".
            w.flush()?;
            return Err(format!("interrupted after {written} rows").into());
        }
        let (data, ann, scaler) = decode(raw, i)?;
        let panel = if i % 2 == 0 {
            r#"{"panel": "A", "markers": 24}"#
        } else {
            r#"{"panel": "B", "markers": 27}"#
        };
        let meta = format!(r#"{{"index": {i}}}"#);
        let mut row = NewRow::new(&id)
            .array("data", data.view())
            .array("annotation", ann.view())
            .sidecar("panel", panel)
            .meta(&meta);
        row = match &scaler {
            Some(s) => row.array("scaler", s.view()),
            None => row.null("scaler"),
        };
        w.write(&row)?;
        written += 1;
    }
    Ok(())
}

#[derive(Debug)]
struct BoxError(Box<dyn std::error::Error>);
impl From<memmap_array::Error> for BoxError {
    fn from(e: memmap_array::Error) -> Self {
        BoxError(Box::new(e))
    }
}
impl From<Box<dyn std::error::Error>> for BoxError {
    fn from(e: Box<dyn std::error::Error>) -> Self {
        BoxError(e)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    let raw = dir.join("raw");
    std::fs::create_dir_all(&raw)?;
    let names: Vec<String> = (0..SAMPLES).map(|i| format!("sample_{i:04}.txt")).collect();
    for (i, name) in names.iter().enumerate() {
        std::fs::write(raw.join(name), format!("{}\n", i + 7))?;
    }
    let schema = Schema::builder()
        .array("data", DType::I16, [3, L])
        .array("annotation", DType::I8, [3, L])
        .nullable_array("scaler", DType::F32, [L])
        .sidecar("panel")
        .build()?;
    let config = serde_json::json!({"dataset": "dna-profiles", "length": L});
    let root = dir.join("cache");
    let stamps = || stamp_sources(&raw, &names, Mode::Content);

    // 1. A build that dies part-way: committed rows stay on disk.
    let first = open_or_build(
        &root,
        "dataset",
        &config,
        stamps()?,
        &schema,
        |w: &mut RowWriter| build(w, &raw, Some(120)).map_err(BoxError),
    );
    println!(
        "first build: {}",
        first.err().map(|e| e.0.to_string()).unwrap_or_default()
    );

    // 2. The next run resumes from the committed rows.
    let opened = open_or_build(
        &root,
        "dataset",
        &config,
        stamps()?,
        &schema,
        |w: &mut RowWriter| build(w, &raw, None).map_err(BoxError),
    )
    .map_err(|e| e.0)?;
    println!("second run: {}", opened.outcome);
    assert!(
        matches!(
            opened.outcome,
            Outcome::Resumed {
                committed_rows: 120
            }
        ),
        "{}",
        opened.outcome
    );

    // 3. Reads are zero-copy views into the mapped .bin files.
    let cache = &opened.cache;
    let row = cache.row(cache.find("sample_0042").ok_or("sample_0042 present")?)?;
    let data = row.get("data")?.ok_or("data present")?;
    let expected = decode(&raw, 42)?.0;
    assert_eq!(data.bytes(), expected.bytes());
    assert!(
        cache
            .array(cache.find("sample_0040").ok_or("present")?, "scaler")?
            .is_none()
    );
    println!(
        "sample_0042: data {} {}, panel {:?}",
        data.dtype(),
        data.shape(),
        row.sidecar("panel")?
    );

    // 4. Same config, same sources: a hit.
    let again = open_or_build(
        &root,
        "dataset",
        &config,
        stamps()?,
        &schema,
        |_: &mut RowWriter| -> Result<(), BoxError> {
            Err(BoxError("a hit must not build".into()))
        },
    )
    .map_err(|e| e.0)?;
    println!("third run: {}", again.outcome);
    assert_eq!(again.outcome, Outcome::Hit);

    // 5. A source changes: rebuilt, with the reason.
    std::fs::write(raw.join("sample_0007.txt"), "12345\n")?;
    let rebuilt = open_or_build(
        &root,
        "dataset",
        &config,
        stamps()?,
        &schema,
        |w: &mut RowWriter| build(w, &raw, None).map_err(BoxError),
    )
    .map_err(|e| e.0)?;
    println!("after editing a source: {}", rebuilt.outcome);
    assert!(matches!(rebuilt.outcome, Outcome::Rebuilt { .. }));

    // 6. The loader opens the same cache through the facade: same root,
    //    name, options and sources name the same directory and fingerprint.
    let facade_config = CacheConfig::new(StoreKind::MemmapArray, &root, "dataset")
        .option("dataset", "dna-profiles")
        .option("length", L)
        .sources(SourcesConfig {
            root: raw.clone(),
            paths: names.iter().map(Into::into).collect(),
            content: true,
        });
    assert_eq!(facade_config.cache_dir()?, rebuilt.dir);
    let loader = Dataset::new(open(&facade_config)?)?;
    let batch = loader.get_many(&[42, -160])?;
    let data = batch[0]
        .get("data")
        .and_then(Value::as_tensor)
        .ok_or("row 42 has data")?;
    assert_eq!(data.bytes(), decode(&raw, 42)?.0.bytes());
    assert!(
        batch[1].get("scaler").is_none(),
        "sample_0040 has no scaler"
    );
    println!(
        "facade: open(config) found the cache, {} rows; row 42 read as a view",
        loader.len()?
    );

    println!("\nread it from Python:");
    println!(
        "  numpy.memmap('{}', dtype='<i2', mode='r', shape=({SAMPLES}, 3, {L}))",
        rebuilt.dir.join("data.bin").display()
    );
    println!("  cachex inspect {}", rebuilt.dir.display());
    Ok(())
}
