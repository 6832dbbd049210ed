//! Seed inputs of the fuzz targets (`fuzz/`): small *valid* files of every
//! format, written by the stores themselves or taken from the peer tools'
//! fixtures, framed the way each target reads its input. Starting from
//! them, libFuzzer's mutations reach past magic numbers and checksums into
//! the structural checks behind them.
//!
//! [`seeds`] builds them in memory (deterministically: same bytes on every
//! run); the `fuzz-seeds` binary writes them to `fuzz/corpus/<target>/`
//! as `seed-<what>` (`scripts/fuzz --seeds`), and `tests/fuzz_seeds.rs`
//! checks that every seed passes its target's parser.
//!
//! | target | input | seeds |
//! |---|---|---|
//! | `page_alloc_open` | a page file | [`page_alloc::PageWriter`] output, 4 KiB pages, several schemas |
//! | `beton_read` | a `.beton` | the FFCV fixtures and this crate's writer, cut to one 4 KiB page |
//! | `memmap_parsers` | selector byte + file | `shapes.json`, `manifest.jsonl`, sidecars of real builds |
//! | `segment_parsers` | selector byte + file | index logs, segments, `schema.json` of real stores and the torchcachex fixtures |
//! | `shard_parsers` | selector byte + file | `metadata.json` and pickle shards of loadit's fixture and of shard-store |

use std::error::Error;
use std::path::Path;

use page_alloc::beton::{self, BetonField, BetonType, BetonValue};
use page_alloc::{PageWriter, Schema as PageSchema, Value, WriterOptions};
use tensor_core::{DType, Tensor};

/// Result of the seed builders: any store's error, boxed.
pub type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The fuzz targets that take seeds, in `fuzz/Cargo.toml` order.
pub const TARGETS: [&str; 5] = [
    "page_alloc_open",
    "beton_read",
    "memmap_parsers",
    "segment_parsers",
    "shard_parsers",
];

/// Page size of the `.beton` seeds. FFCV's writer uses 2 MiB at least,
/// which no fuzzer input can hold; the reader accepts 4 KiB pages.
pub const BETON_SEED_PAGE: u64 = 4096;

/// One seed: the target it feeds, a stable name, and the input bytes
/// (selector byte included for the targets that take one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// Fuzz target name.
    pub target: &'static str,
    /// File name in `fuzz/corpus/<target>/` (starts with `seed-`).
    pub name: String,
    /// The input.
    pub bytes: Vec<u8>,
}

impl Seed {
    fn new(target: &'static str, what: impl AsRef<str>, bytes: Vec<u8>) -> Seed {
        Seed {
            target,
            name: format!("seed-{}", what.as_ref()),
            bytes,
        }
    }

    /// A seed of a target whose first input byte picks the parser.
    fn framed(target: &'static str, what: impl AsRef<str>, selector: u8, body: &[u8]) -> Seed {
        let mut bytes = Vec::with_capacity(body.len() + 1);
        bytes.push(selector);
        bytes.extend_from_slice(body);
        Seed::new(target, what, bytes)
    }
}

/// Every seed of every target. `fixtures` is the peer fixtures folder
/// (`test_support::fixtures_dir()`); `scratch` an empty directory for the
/// stores to write in.
pub fn seeds(fixtures: &Path, scratch: &Path) -> Result<Vec<Seed>> {
    let mut out = Vec::new();
    out.extend(page_seeds(&scratch.join("page"))?);
    out.extend(beton_seeds(fixtures, &scratch.join("beton"))?);
    out.extend(memmap_seeds(&scratch.join("memmap"))?);
    out.extend(segment_seeds(fixtures, &scratch.join("segment"))?);
    out.extend(shard_seeds(fixtures, &scratch.join("shard"))?);
    Ok(out)
}

// ---------------------------------------------------------------- page-alloc

fn page_seeds(dir: &Path) -> Result<Vec<Seed>> {
    std::fs::create_dir_all(dir)?;
    let small = WriterOptions::default().page_size(4096);
    let f32x6: Vec<u8> = (0..6u8).flat_map(|i| f32::from(i).to_le_bytes()).collect();
    let i16x4: Vec<u8> = [-2i16, -1, 0, 1]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let cases: Vec<(&str, PageSchema, WriterOptions, Vec<Vec<Value<'_>>>)> = vec![
        (
            "int-bytes",
            PageSchema::new().int("label").bytes("jpeg"),
            small.clone().alignment(8),
            (0..5)
                .map(|i| {
                    vec![
                        Value::Int(i),
                        Value::Bytes(&b"\xff\xd8 pixels"[..i as usize + 3]),
                    ]
                })
                .collect(),
        ),
        (
            "float-array-align512",
            PageSchema::new()
                .float("score")
                .array("x", DType::F32, [2, 3]),
            small.clone().alignment(512),
            (0..3)
                .map(|i| vec![Value::Float(f64::from(i) / 4.0), Value::Bytes(&f32x6)])
                .collect(),
        ),
        (
            "every-kind",
            PageSchema::new()
                .int("id")
                .float("w")
                .bytes("raw")
                .array("mask", DType::I16, [4])
                .array("flag", DType::Bool, [1]),
            small.clone().alignment(16),
            (0..4)
                .map(|i| {
                    vec![
                        Value::Int(-i),
                        Value::Float(0.5),
                        Value::Bytes(&b"abcdefgh"[..2 * i as usize]),
                        Value::Bytes(&i16x4),
                        Value::Bytes(&[1]),
                    ]
                })
                .collect(),
        ),
        (
            "inline-only",
            PageSchema::new().int("a").float("b"),
            small.clone().alignment(8),
            (0..6)
                .map(|i| vec![Value::Int(i * 1000), Value::Float(-1.5)])
                .collect(),
        ),
        (
            "empty-file",
            PageSchema::new().bytes("b"),
            small.clone().alignment(8),
            Vec::new(),
        ),
        (
            "empty-values",
            PageSchema::new().bytes("b").bytes("c"),
            small.clone().alignment(64),
            (0..3)
                .map(|_| vec![Value::Bytes(b""), Value::Bytes(b"z")])
                .collect(),
        ),
    ];
    let big = vec![7u8; 4200];
    let mut out = Vec::new();
    for (what, schema, opts, samples) in cases {
        out.push(Seed::new(
            "page_alloc_open",
            what,
            write_pages(dir, what, schema, opts, &samples)?,
        ));
    }
    // A sample larger than a page takes a run of two pages (last, so that
    // the file ends where its bytes end).
    let run = vec![vec![Value::Bytes(b"first")], vec![Value::Bytes(&big)]];
    out.push(Seed::new(
        "page_alloc_open",
        "two-page-run",
        write_pages(
            dir,
            "run",
            PageSchema::new().bytes("b"),
            small.alignment(8),
            &run,
        )?,
    ));
    Ok(out)
}

fn write_pages(
    dir: &Path,
    name: &str,
    schema: PageSchema,
    opts: WriterOptions,
    samples: &[Vec<Value<'_>>],
) -> Result<Vec<u8>> {
    let path = dir.join(format!("{name}.pages"));
    let mut writer = PageWriter::create(&path, schema, opts)?;
    for s in samples {
        writer.append(s)?;
    }
    writer.finalize()?;
    Ok(std::fs::read(&path)?)
}

// ---------------------------------------------------------------- .beton

/// The samples of one `.beton`: one value per field.
type Samples<'a> = Vec<Vec<BetonValue<'a>>>;

fn beton_seeds(fixtures: &Path, dir: &Path) -> Result<Vec<Seed>> {
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    // The real FFCV files (2 MiB pages, 40 samples): their first samples,
    // as many as fit one 4 KiB page, with the descriptors, metadata rows
    // and allocation rows FFCV wrote.
    for name in ["small_w1", "small_w2"] {
        let real = std::fs::read(fixtures.join("ffcv").join(format!("{name}.beton")))?;
        for keep in [1, 3] {
            let cut = shrink_beton(&real, keep)
                .ok_or_else(|| format!("{name}.beton: first {keep} samples do not fit a page"))?;
            out.push(Seed::new("beton_read", format!("ffcv-{name}-{keep}"), cut));
        }
    }
    // This crate's writer (byte-identical to FFCV's), every field type.
    let rgb: Vec<u8> = (0..2 * 3 * 3).collect();
    let arr: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let nd = |dtype, shape: &[usize], bytes| -> Result<BetonValue<'_>> {
        Ok(BetonValue::NDArray(tensor_core::TensorView::new(
            dtype,
            shape.to_vec(),
            bytes,
        )?))
    };
    let cases: Vec<(&str, Vec<BetonField>, Samples<'_>)> = vec![
        (
            "int-float",
            vec![
                BetonField::new("label", BetonType::Int),
                BetonField::new("w", BetonType::Float),
            ],
            (0..4)
                .map(|i| vec![BetonValue::Int(i), BetonValue::Float(0.25)])
                .collect(),
        ),
        (
            "bytes-json",
            vec![
                BetonField::new("blob", BetonType::Bytes),
                BetonField::new("meta", BetonType::Json),
            ],
            (0..3)
                .map(|i| {
                    vec![
                        BetonValue::Bytes(&b"0123456789"[..3 * i]),
                        BetonValue::Json(r#"{"a": [1, 2]}"#),
                    ]
                })
                .collect(),
        ),
        (
            "ndarray-f32",
            vec![BetonField::new(
                "arr",
                BetonType::NDArray {
                    dtype: DType::F32,
                    shape: vec![2].into(),
                },
            )],
            vec![
                vec![nd(DType::F32, &[2], &arr)?],
                vec![nd(DType::F32, &[2], &arr)?],
            ],
        ),
        (
            "rgb-raw-jpeg",
            vec![
                BetonField::new("image", BetonType::RgbImage),
                BetonField::new("label", BetonType::Int),
            ],
            vec![
                vec![
                    BetonValue::RgbImage {
                        mode: 1,
                        width: 3,
                        height: 2,
                        data: &rgb,
                    },
                    BetonValue::Int(1),
                ],
                vec![
                    BetonValue::RgbImage {
                        mode: 0,
                        width: 8,
                        height: 8,
                        data: b"\xff\xd8\xff\xe0 not decoded",
                    },
                    BetonValue::Int(2),
                ],
            ],
        ),
    ];
    for (what, fields, samples) in cases {
        let path = dir.join(format!("{what}.beton"));
        beton::write_with_page_size(&path, &fields, &samples, beton::MIN_PAGE_SIZE)?;
        let full = std::fs::read(&path)?;
        let cut = shrink_beton(&full, samples.len())
            .ok_or_else(|| format!("{what}.beton does not fit a page"))?;
        out.push(Seed::new("beton_read", what, cut));
    }
    Ok(out)
}

/// The first `keep` samples of a valid `.beton`, moved to
/// [`BETON_SEED_PAGE`]-byte pages: header, descriptors and metadata rows as
/// written, pointers shifted to the new data region, one page holding the
/// kept allocations at their offsets within their page, and their
/// allocation rows in their order. `None` when the kept allocations are not
/// all in one page within its first [`BETON_SEED_PAGE`] bytes, or the input
/// does not parse.
pub fn shrink_beton(bytes: &[u8], keep: usize) -> Option<Vec<u8>> {
    // Validated first: every allocation lies in the data region and every
    // metadata pointer names one, so the offsets below cannot underflow.
    let file = beton::BetonFile::from_bytes(bytes.to_vec(), "<seed>").ok()?;
    let keep = keep.min(file.len());
    let rd = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
    };
    let page = file.page_size();
    let num_samples = rd(8)?;
    let desc_end = beton::HEADER_LEN + beton::FIELD_DESC_LEN * file.fields().len();
    // The row layout of FFCV's numpy struct (see `page_alloc::beton`).
    let mut offsets = Vec::new();
    let (mut at, mut max_align) = (0usize, 1usize);
    for f in file.fields() {
        let (size, align) = match f.ty {
            BetonType::Float | BetonType::Int | BetonType::NDArray { .. } => (8, 8),
            BetonType::Bytes | BetonType::Json => (16, 1),
            BetonType::RgbImage => (13, 1),
        };
        at = at.div_ceil(align) * align;
        offsets.push(at);
        at += size;
        max_align = max_align.max(align);
    }
    let row_size = at.div_ceil(max_align) * max_align;
    let old_start = (desc_end as u64 + row_size as u64 * num_samples).next_multiple_of(page);
    let meta_end = desc_end + row_size * keep;
    let new_start = (meta_end as u64).next_multiple_of(BETON_SEED_PAGE);
    let table_at = file.alloc_table_ptr() as usize;
    let rows: Vec<[u64; 3]> = bytes
        .get(table_at..)?
        .chunks_exact(beton::ALLOC_ROW_LEN)
        .map(|r| {
            let v = |k: usize| u64::from_le_bytes(r[k..k + 8].try_into().unwrap_or_default());
            [v(0), v(8), v(16)]
        })
        .filter(|r| r[0] < keep as u64)
        .collect();
    let pages: Vec<u64> = rows.iter().map(|r| (r[1] - old_start) / page).collect();
    let old_page = pages.first().copied().unwrap_or(0);
    let page_at = old_start + old_page * page;
    if pages.iter().any(|p| *p != old_page)
        || rows.iter().any(|r| r[1] - page_at + r[2] > BETON_SEED_PAGE)
    {
        return None;
    }
    let moved = |ptr: u64| ptr - page_at + new_start;
    let data_len = if rows.is_empty() { 0 } else { BETON_SEED_PAGE };
    let new_table = new_start + data_len;
    let mut out = vec![0u8; new_table as usize];
    out[..meta_end].copy_from_slice(&bytes[..meta_end]);
    out[4..8].copy_from_slice(&(BETON_SEED_PAGE as u32).to_le_bytes());
    out[8..16].copy_from_slice(&(keep as u64).to_le_bytes());
    out[16..24].copy_from_slice(&new_table.to_le_bytes());
    for s in 0..keep {
        let row = desc_end + s * row_size;
        for (f, field) in file.fields().iter().enumerate() {
            let ptr_at = row
                + offsets[f]
                + match field.ty {
                    BetonType::Float | BetonType::Int => continue,
                    BetonType::RgbImage => 5,
                    _ => 0,
                };
            let ptr = rd(ptr_at)?;
            if ptr >= page_at {
                out[ptr_at..ptr_at + 8].copy_from_slice(&moved(ptr).to_le_bytes());
            }
        }
    }
    for r in &rows {
        let (from, to, n) = (r[1] as usize, moved(r[1]) as usize, r[2] as usize);
        out[to..to + n].copy_from_slice(bytes.get(from..from + n)?);
    }
    for r in &rows {
        out.extend_from_slice(&r[0].to_le_bytes());
        out.extend_from_slice(&moved(r[1]).to_le_bytes());
        out.extend_from_slice(&r[2].to_le_bytes());
    }
    Some(out)
}

// ---------------------------------------------------------------- memmap-array

/// Selector bytes of `memmap_parsers`.
const SHAPES: u8 = 0;
const MANIFEST: u8 = 1;
const SIDECAR: u8 = 2;

fn memmap_seeds(dir: &Path) -> Result<Vec<Seed>> {
    use memmap_array::{NewRow, RowWriter, Schema};
    let mut out = Vec::new();
    let builds = [
        (
            "dna",
            Schema::builder()
                .array("data", DType::I16, [2, 3])
                .nullable_array("mask", DType::U8, [3])
                .sidecar("config")
                .build()?,
        ),
        (
            "mixed",
            Schema::builder()
                .array("x", DType::F32, [4])
                .array("y", DType::BF16, [1, 2])
                .nullable_array("z", DType::F64, [2])
                .sidecar("loci")
                .sidecar("panel")
                .build()?,
        ),
    ];
    for (what, schema) in builds {
        let cache = dir.join(what);
        let mut writer = RowWriter::create_or_resume(&cache, &schema, "v1")?;
        for i in 0..4u8 {
            let source = format!("sample_{i}");
            let meta = format!(r#"{{"label": {i}, "name": "s{i}"}}"#);
            let tensors: Vec<(String, Tensor)> = schema
                .arrays()
                .iter()
                .map(|a| {
                    let bytes: Vec<u8> = (0..a.row_bytes()).map(|k| (k as u8 ^ i) & 1).collect();
                    let t = Tensor::new(a.dtype(), a.shape().clone(), &bytes)?;
                    Ok((a.name().to_owned(), t))
                })
                .collect::<Result<_>>()?;
            let mut row = NewRow::new(&source).meta(&meta);
            for (a, (name, t)) in schema.arrays().iter().zip(&tensors) {
                row = if a.nullable() && i % 2 == 1 {
                    row.null(name)
                } else {
                    row.array(name, t.view())
                };
            }
            let values = [r#"{"loci": ["A", "B"]}"#, r#"{"loci": ["C"]}"#];
            for s in schema.sidecars() {
                row = row.sidecar(s, values[usize::from(i) % 2]);
            }
            writer.write(&row)?;
            if i == 2 {
                writer.flush()?;
            }
        }
        writer.flush()?;
        let manifest = std::fs::read(cache.join(memmap_array::MANIFEST_FILE))?;
        out.push(Seed::framed(
            "memmap_parsers",
            format!("manifest-{what}"),
            MANIFEST,
            &manifest,
        ));
        writer.finalize()?;
        let shapes = std::fs::read(cache.join(memmap_array::SHAPES_FILE))?;
        out.push(Seed::framed(
            "memmap_parsers",
            format!("shapes-{what}"),
            SHAPES,
            &shapes,
        ));
        for s in schema.sidecars() {
            let side = std::fs::read(cache.join(memmap_array::sidecar_file(s)))?;
            out.push(Seed::framed(
                "memmap_parsers",
                format!("sidecar-{what}-{s}"),
                SIDECAR,
                &side,
            ));
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------- segment-store

/// Selector bytes of `segment_parsers`: the index-log parser alone, or a
/// read-only open of a directory holding one segment, index log or schema.
const PARSE_INDEX: u8 = 0;
const SEGMENT: u8 = 1;
const INDEX_LOG: u8 = 2;
const SCHEMA: u8 = 3;

fn segment_seeds(fixtures: &Path, dir: &Path) -> Result<Vec<Seed>> {
    use segment_store::format::{INDEX_FILE, SCHEMA_FILE, segment_path};
    use segment_store::{Options, SegmentStore};
    let mut out = Vec::new();
    let target = "segment_parsers";
    for module in [
        "tensor_f32",
        "tensor_f16",
        "tensor_i64",
        "dict_mixed",
        "tuple_pair",
    ] {
        let root = fixtures.join("torchcachex").join(module);
        let seg = std::fs::read(segment_path(&root, 2))?;
        out.push(Seed::framed(
            target,
            format!("torchcachex-{module}-segment"),
            SEGMENT,
            &seg,
        ));
        let schema = std::fs::read(root.join(SCHEMA_FILE))?;
        out.push(Seed::framed(
            target,
            format!("torchcachex-{module}-schema"),
            SCHEMA,
            &schema,
        ));
    }
    let f32s = |n: usize| Tensor::from_vec([n], (0..n).map(|i| i as f32 / 2.0).collect());
    let bf16 = Tensor::new(
        DType::BF16,
        [2, 2],
        &[0x80, 0x3f, 0, 0x40, 0x40, 0x40, 0x80, 0x40],
    )?;
    let stores: Vec<(&str, Vec<tensor_core::Value>)> = vec![
        (
            "tensor",
            (1..4)
                .map(|n| Ok(tensor_core::Value::from(f32s(n)?)))
                .collect::<Result<_>>()?,
        ),
        (
            "bf16",
            vec![
                tensor_core::Value::from(bf16.clone()),
                tensor_core::Value::from(bf16),
            ],
        ),
        (
            "dict",
            (0..3)
                .map(|i| {
                    Ok(tensor_core::Value::dict([
                        ("feat", tensor_core::Value::from(f32s(2)?)),
                        ("label", tensor_core::Value::Blob(vec![b'c'; i].into())),
                    ]))
                })
                .collect::<Result<_>>()?,
        ),
        (
            "tuple",
            (0..2)
                .map(|i| {
                    Ok(tensor_core::Value::Tuple(vec![
                        tensor_core::Value::from(Tensor::from_vec([2], vec![i as i64, -1])?),
                        tensor_core::Value::from(Tensor::from_vec([3], vec![true, false, i == 0])?),
                    ]))
                })
                .collect::<Result<_>>()?,
        ),
        (
            "blob",
            (0..3)
                .map(|i| tensor_core::Value::blob(vec![i as u8; i]))
                .collect(),
        ),
    ];
    for (what, records) in stores {
        let root = dir.join(what);
        let store = SegmentStore::open(&root, Options::default())?;
        let items: Vec<(String, tensor_core::Value)> = records
            .into_iter()
            .enumerate()
            .map(|(i, r)| (format!("sample_{i}"), r))
            .collect();
        store.put_batch(&items[..1])?;
        store.flush()?;
        store.put_batch(&items[1..])?;
        store.flush()?;
        drop(store);
        let seg = std::fs::read(segment_path(&root, 1))?;
        out.push(Seed::framed(
            target,
            format!("{what}-segment"),
            SEGMENT,
            &seg,
        ));
        let log = std::fs::read(root.join(INDEX_FILE))?;
        out.push(Seed::framed(
            target,
            format!("{what}-index-log"),
            INDEX_LOG,
            &log,
        ));
        out.push(Seed::framed(
            target,
            format!("{what}-index-parse"),
            PARSE_INDEX,
            &log,
        ));
        let schema = std::fs::read(root.join(SCHEMA_FILE))?;
        out.push(Seed::framed(
            target,
            format!("{what}-schema"),
            SCHEMA,
            &schema,
        ));
    }
    Ok(out)
}

// ---------------------------------------------------------------- shard-store

/// Selector of `shard_parsers` for `metadata.json` (even bytes); a pickle
/// shard of `n` items (n < 128) takes `2 n + 1`.
const METADATA: u8 = 0;

fn shard_selector(items: u64) -> Option<u8> {
    u8::try_from(items)
        .ok()
        .filter(|n| *n < 128)
        .map(|n| 2 * n + 1)
}

fn shard_seeds(fixtures: &Path, dir: &Path) -> Result<Vec<Seed>> {
    use shard_store::{Compression, Options, ShardName, ShardStore};
    let mut out = Vec::new();
    let target = "shard_parsers";
    let mut add_root = |what: &str, root: &Path| -> Result<()> {
        let meta = std::fs::read(root.join("metadata.json"))?;
        out.push(Seed::framed(
            target,
            format!("{what}-metadata"),
            METADATA,
            &meta,
        ));
        let mut names: Vec<String> = std::fs::read_dir(root.join("shards"))?
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_>>()?;
        names.sort();
        for name in names {
            let shard = ShardName::parse(&name, Compression::None)
                .ok_or_else(|| format!("{what}: shard name {name:?}"))?;
            let selector = shard_selector(shard.end - shard.start)
                .ok_or_else(|| format!("{what}: shard {name} has too many items"))?;
            let body = std::fs::read(root.join("shards").join(&name))?;
            let stem = name.trim_end_matches(".shard.pickle");
            out.push(Seed::framed(
                target,
                format!("{what}-shard-{stem}"),
                selector,
                &body,
            ));
        }
        Ok(())
    };
    add_root("loadit-records", &fixtures.join("loadit").join("records"))?;

    type Item = (u64, String, Vec<f64>, Option<bool>, shard_store::Bytes);
    let root = dir.join("tuples");
    let store: ShardStore<Item> =
        ShardStore::open_with_source(&root, Options::default().shard_items(6), || {
            (0..9u64).map(|i| {
                let raw = shard_store::Bytes::from(vec![i as u8; i as usize % 4]);
                (
                    i,
                    format!("item {i}"),
                    vec![i as f64 / 3.0; 2],
                    (i % 3 != 0).then_some(i % 2 == 0),
                    raw,
                )
            })
        })?;
    store.len()?;
    drop(store);
    add_root("shard-store-tuples", &root)?;

    let root = dir.join("maps");
    let store: ShardStore<std::collections::BTreeMap<String, i64>> =
        ShardStore::open_with_source(&root, Options::default().shard_items(4), || {
            (0..5i64).map(|i| [("id".to_owned(), i), ("neg".to_owned(), -i << 40)].into())
        })?;
    store.len()?;
    drop(store);
    add_root("shard-store-maps", &root)?;
    Ok(out)
}
