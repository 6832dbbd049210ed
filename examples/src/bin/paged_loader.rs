//! `paged_loader`: a data loader over a page-alloc file — write samples
//! from two threads, then read shuffled batches into a pre-allocated
//! buffer pool while the OS prefetches the next batch.
//!
//! Run: `cargo run -p examples --bin paged_loader -- [DIR]`
//!
//! The file is one `.pages` file: header, data pages, tables, and a footer
//! that commits it; a crash while writing leaves the previous file. Reads
//! are zero-copy (`Sample::bytes` borrows the mapping); the pool copies
//! into buffers allocated once, so an epoch allocates nothing per batch.

use page_alloc::{BufferPool, PageReader, PageWriter, Schema, Value, WriterOptions};

/// A stand-in for an encoded image of sample `i`: 1-8 KiB of bytes.
fn image(i: usize) -> Vec<u8> {
    let len = 1024 + (i * 7919) % 7168;
    (0..len).map(|k| (i * 31 + k) as u8).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("train.pages");
    let n = 3000;

    // Write: label inline, image bytes in pages, two writer threads. The
    // bytes are identical whatever the thread count.
    let schema = Schema::new().int("label").bytes("image");
    let images: Vec<Vec<u8>> = (0..n).map(image).collect();
    let rows: Vec<Vec<Value<'_>>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| vec![Value::Int((i % 10) as i64), Value::Bytes(img)])
        .collect();
    let mut writer = PageWriter::create(&path, schema, WriterOptions::default())?;
    writer.write_parallel(&rows[..], 2)?;
    let summary = writer.finalize()?;
    println!("wrote {n} samples to {} ({summary:?})", path.display());

    // Read: a page-friendly shuffled order, batches of 64 into one pool.
    let reader = PageReader::open(&path)?;
    let order = reader.quasi_random_order(42, 4);
    let mut pool = BufferPool::new(&reader, 64)?;
    let mut seen = vec![false; n];
    let mut bytes = 0usize;
    let batches: Vec<&[usize]> = order.chunks(64).collect();
    for (b, batch) in batches.iter().enumerate() {
        if let Some(next) = batches.get(b + 1) {
            reader.prefetch(next)?;
        }
        reader.fill_batch(batch, &mut pool)?;
        let labels = pool.ints(0).ok_or("label column")?;
        for (k, &i) in batch.iter().enumerate() {
            let img = pool.bytes(1, k).ok_or("image bytes")?;
            assert_eq!(labels[k], (i % 10) as i64);
            assert_eq!(img, &image(i)[..], "sample {i}");
            bytes += img.len();
            seen[i] = true;
        }
    }
    assert!(seen.iter().all(|&s| s), "every sample once per epoch");
    println!(
        "read one shuffled epoch: {} batches, {bytes} image bytes, every sample checked",
        batches.len()
    );

    // Zero-copy access to a single sample.
    let s = reader.sample(123)?;
    println!(
        "sample 123: label {}, {} image bytes borrowed from the map",
        s.int(0)?,
        s.bytes(1)?.len()
    );
    Ok(())
}
