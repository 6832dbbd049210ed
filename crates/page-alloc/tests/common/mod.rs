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
/// Leaves the bytes alone when the edit broke the offsets themselves.
pub fn reseal(bytes: &mut [u8]) {
    let header_len = u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
    let meta = u64_at(bytes, 64) as usize;
    let footer = u64_at(bytes, 80) as usize;
    if bytes.len() < 64
        || header_len > bytes.len() - 64
        || meta > footer
        || footer > bytes.len() - 64
    {
        return;
    }
    let tables = *blake3::hash(&bytes[meta..footer]).as_bytes();
    bytes[88..120].copy_from_slice(&tables);
    let header = *blake3::hash(&bytes[..header_len]).as_bytes();
    let n = bytes.len();
    bytes[n - 64..n - 32].copy_from_slice(&header);
    let check = *blake3::hash(&bytes[n - 64..n - 16]).as_bytes();
    bytes[n - 16..n - 8].copy_from_slice(&check[..8]);
}

/// (meta_offset, row_len) of a page file with the blob schema.
pub fn meta_offset(bytes: &[u8]) -> usize {
    u64_at(bytes, 64) as usize
}
