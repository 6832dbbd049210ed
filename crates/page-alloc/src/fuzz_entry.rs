//! Entry points of the fuzz targets (`fuzz/`), public so that ordinary
//! tests run the same code over a corpus of damaged files.
//!
//! Each takes arbitrary bytes and must return (an error or a count) —
//! never panic, never read out of bounds, never allocate without bound.

use crate::{BufferPool, PageReader, Result, beton};

/// Opens `bytes` as a page file and, if it validates, reads every field of
/// (up to 4096) samples, fills a batch, prefetches and builds an epoch
/// order. Returns the number of page bytes read.
pub fn open_and_read(bytes: &[u8]) -> Result<usize> {
    let reader = PageReader::from_bytes(bytes.to_vec(), "<fuzz input>")?;
    let n = reader.len().min(4096);
    let mut touched = 0;
    for i in 0..n {
        let sample = reader.sample(i)?;
        for f in 0..reader.schema().len() {
            match sample.get(f)? {
                crate::FieldValue::Bytes(b) => touched += b.len(),
                crate::FieldValue::Array(t) => touched += t.bytes().len(),
                crate::FieldValue::Int(_) | crate::FieldValue::Float(_) => {}
            }
        }
    }
    let batch: Vec<usize> = (0..n.min(8)).collect();
    let mut pool = BufferPool::new(&reader, batch.len())?;
    reader.fill_batch(&batch, &mut pool)?;
    reader.prefetch(&batch)?;
    let order = reader.quasi_random_order(1, 2);
    touched += order.len().min(1);
    Ok(touched)
}

/// Recomputes the checksums of a page file in place (tables hash in the
/// header, header hash and check in the footer) wherever its offsets allow,
/// so that a mutated input reaches the structural checks behind them.
/// Leaves inputs whose offsets do not fit alone.
pub fn reseal(bytes: &mut [u8]) {
    use crate::format::{FOOTER_LEN, rd_u32, rd_u64};
    let n = bytes.len();
    if n < crate::format::HEADER_FIXED_LEN + FOOTER_LEN {
        return;
    }
    let header_len = rd_u32(bytes, 12) as usize;
    let (meta, footer) = (rd_u64(bytes, 64), rd_u64(bytes, 80));
    let Some(body) = n.checked_sub(FOOTER_LEN) else {
        return;
    };
    if header_len > body || meta > footer || footer > body as u64 {
        return;
    }
    let tables = *blake3::hash(&bytes[meta as usize..footer as usize]).as_bytes();
    bytes[88..120].copy_from_slice(&tables);
    let header = *blake3::hash(&bytes[..header_len]).as_bytes();
    bytes[body..body + 32].copy_from_slice(&header);
    let check = *blake3::hash(&bytes[body..body + 48]).as_bytes();
    bytes[body + 48..body + 56].copy_from_slice(&check[..8]);
}

/// [`open_and_read`] after [`reseal`]: what the `page_alloc_open` fuzz
/// target runs in addition to the plain input.
pub fn open_and_read_resealed(bytes: &[u8]) -> Result<usize> {
    let mut owned = bytes.to_vec();
    reseal(&mut owned);
    open_and_read(&owned)
}

/// Parses `bytes` as an FFCV `.beton` and, if it validates, reads every
/// field of (up to 4096) samples. Returns the number of data bytes read.
pub fn beton_read(bytes: &[u8]) -> Result<usize> {
    let file = beton::BetonFile::from_bytes(bytes.to_vec(), "<fuzz input>")?;
    let n = file.len().min(4096);
    let mut touched = 0;
    for i in 0..n {
        for f in 0..file.fields().len() {
            touched += match file.get(i, f)? {
                beton::BetonValue::Bytes(b) => b.len(),
                beton::BetonValue::Json(s) => s.len(),
                beton::BetonValue::NDArray(t) => t.bytes().len(),
                beton::BetonValue::RgbImage { data, .. } => data.len(),
                beton::BetonValue::Int(_) | beton::BetonValue::Float(_) => 0,
            };
        }
    }
    Ok(touched)
}
