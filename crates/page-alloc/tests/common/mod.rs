//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::Path;

use page_alloc::{BoxError, PageWriter, SampleOut, SampleSource, Schema, Slot, WriterOptions};

/// Deterministic bytes of sample `i`, `len` long.
pub fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i.wrapping_mul(31) ^ j.wrapping_mul(13)) as u8)
        .collect()
}

/// Samples `(id: int, data: bytes)` with the given sizes.
pub struct Blobs(pub Vec<usize>);

impl SampleSource for Blobs {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn describe(&self, i: usize, slots: &mut [Slot]) -> Result<(), BoxError> {
        slots[0] = Slot::Int(i as i64);
        slots[1] = Slot::Size(self.0[i] as u64);
        Ok(())
    }

    fn fill(&self, i: usize, out: &mut SampleOut<'_>) -> Result<(), BoxError> {
        let dst = out.field(1).ok_or("no region")?;
        let len = dst.len();
        dst.copy_from_slice(&payload(i, len));
        Ok(())
    }
}

pub fn blob_schema() -> Schema {
    Schema::new().int("id").bytes("data")
}

/// Writes `sizes` as a small-page file at `path`.
pub fn write_blobs(path: &Path, sizes: &[usize]) {
    let mut w = PageWriter::create(
        path,
        blob_schema(),
        WriterOptions::default().page_size(4096).alignment(64),
    )
    .unwrap();
    w.write_parallel(&Blobs(sizes.to_vec()), 2).unwrap();
    w.finalize().unwrap();
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Recomputes every checksum of a page file after a test edited it, so
/// that the deeper (structural) checks are what rejects the edit.
pub fn reseal(bytes: &mut [u8]) {
    page_alloc::fuzz_entry::reseal(bytes);
}

/// Where the metadata table of a page file starts.
pub fn meta_offset(bytes: &[u8]) -> usize {
    u64_at(bytes, 64) as usize
}
