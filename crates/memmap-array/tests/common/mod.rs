//! Shared helpers of the memmap-array test suites.
#![allow(dead_code)]

use std::path::Path;

use memmap_array::{MemmapArray, NewRow, RowWriter, Schema, WriterOptions};
use tensor_core::{DType, Tensor};

/// `data` i16 (2, 3), nullable `mask` u8 (4,), `score` f32 (), sidecar `config`.
pub fn schema() -> Schema {
    Schema::builder()
        .array("data", DType::I16, [2, 3])
        .nullable_array("mask", DType::U8, [4])
        .array("score", DType::F32, Vec::<usize>::new())
        .sidecar("config")
        .build()
        .expect("valid schema")
}

pub fn data(i: usize) -> Tensor {
    Tensor::from_vec([2, 3], (0..6).map(|j| (i * 10 + j) as i16 - 7).collect()).unwrap()
}

pub fn mask(i: usize) -> Tensor {
    Tensor::from_vec([4], (0..4).map(|j| (i + j) as u8).collect()).unwrap()
}

pub fn score(i: usize) -> Tensor {
    Tensor::from_vec(Vec::<usize>::new(), vec![i as f32 * 0.5]).unwrap()
}

pub fn source(i: usize) -> String {
    format!("src/{i}.wav")
}

pub fn config(i: usize) -> String {
    format!("{{\"loci\": {}}}", i % 3)
}

pub fn meta(i: usize) -> String {
    format!("{{\"i\": {i}}}")
}

/// Row `i` of the standard schema: mask is null on odd rows, no sidecar on
/// rows divisible by 5.
pub fn write_row(writer: &mut RowWriter, i: usize) {
    let (d, m, s) = (data(i), mask(i), score(i));
    let (src, cfg, mt) = (source(i), config(i), meta(i));
    let mut row = NewRow::new(&src)
        .array("data", d.view())
        .array("score", s.view())
        .meta(&mt);
    row = if i.is_multiple_of(2) {
        row.array("mask", m.view())
    } else {
        row.null("mask")
    };
    if !i.is_multiple_of(5) {
        row = row.sidecar("config", &cfg);
    }
    writer.write(&row).expect("write row");
}

pub fn writer(dir: &Path, sync_every: usize) -> RowWriter {
    RowWriter::create_or_resume_with(dir, &schema(), "fp-1", WriterOptions { sync_every })
        .expect("open writer")
}

/// Writes rows `0..n` and finalizes.
pub fn build(dir: &Path, n: usize) -> MemmapArray {
    let mut w = writer(dir, 3);
    for i in 0..n {
        write_row(&mut w, i);
    }
    w.finalize().expect("finalize");
    MemmapArray::open(dir).expect("open")
}

/// Checks every row `0..n` of `cache` against the standard generators.
pub fn check_rows(cache: &MemmapArray, n: usize) {
    assert_eq!(cache.len(), n as u64);
    for i in 0..n {
        let row = cache.row(i as u64).unwrap();
        assert_eq!(row.source(), source(i));
        assert_eq!(row.meta_json(), Some(meta(i).as_str()));
        assert_eq!(row.get("data").unwrap().unwrap().bytes(), data(i).bytes());
        assert_eq!(row.get("score").unwrap().unwrap().bytes(), score(i).bytes());
        match row.get("mask").unwrap() {
            Some(m) => {
                assert_eq!(i % 2, 0, "row {i} should lack mask");
                assert_eq!(m.bytes(), mask(i).bytes());
            }
            None => assert_eq!(i % 2, 1, "row {i} should have mask"),
        }
        let expected = (!i.is_multiple_of(5)).then(|| config(i));
        assert_eq!(row.sidecar("config").unwrap(), expected.as_deref());
    }
}

/// Size of `dir/name`.
pub fn file_len(dir: &Path, name: &str) -> u64 {
    std::fs::metadata(dir.join(name)).unwrap().len()
}

/// Opens a writer on the standard schema, returning the error if any.
pub fn writer_result(dir: &Path) -> memmap_array::Result<RowWriter> {
    RowWriter::create_or_resume_with(dir, &schema(), "fp-1", WriterOptions { sync_every: 1 })
}
