//! Many readers at once, readers during a rewrite, writers racing for the lock.

mod common;

use std::sync::Arc;

use common::{Blobs, blob_schema, payload, write_blobs};
use page_alloc::{BufferPool, Error, PageReader, PageWriter, WriterOptions};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn readers_share_one_mapping_across_threads() {
    assert_send_sync::<PageReader>();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.pages");
    let sizes: Vec<usize> = (0..400).map(|i| (i * 53) % 5000).collect();
    write_blobs(&path, &sizes);
    let reader = Arc::new(PageReader::open(&path).unwrap());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let reader = Arc::clone(&reader);
            let sizes = &sizes;
            s.spawn(move || {
                let order = reader.quasi_random_order(t, 2);
                let mut pool = BufferPool::new(&reader, 16).unwrap();
                for batch in order.chunks(16) {
                    reader.prefetch(batch).unwrap();
                    reader.fill_batch(batch, &mut pool).unwrap();
                    for (k, &i) in batch.iter().enumerate() {
                        assert_eq!(pool.ints(0).unwrap()[k], i as i64);
                        assert_eq!(pool.bytes(1, k).unwrap(), &payload(i, sizes[i])[..]);
                        let s = reader.sample(i).unwrap();
                        assert_eq!(s.bytes(1).unwrap(), &payload(i, sizes[i])[..]);
                    }
                }
            });
        }
    });
}

#[test]
fn an_open_reader_keeps_its_version_while_the_file_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.pages");
    write_blobs(&path, &[10, 20]);
    let old = PageReader::open(&path).unwrap();
    let writer = std::thread::spawn({
        let path = path.clone();
        move || write_blobs(&path, &[30, 40, 50])
    });
    for _ in 0..200 {
        assert_eq!(old.len(), 2);
        assert_eq!(
            old.sample(1).unwrap().bytes(1).unwrap(),
            &payload(1, 20)[..]
        );
        // A reader opened at any moment sees one complete version.
        let now = PageReader::open(&path).unwrap();
        assert!(now.len() == 2 || now.len() == 3);
        let n = now.len();
        let want = if n == 2 { 20 } else { 40 };
        assert_eq!(
            now.sample(1).unwrap().bytes(1).unwrap(),
            &payload(1, want)[..]
        );
    }
    writer.join().unwrap();
    assert_eq!(PageReader::open(&path).unwrap().len(), 3);
}

#[test]
fn writers_racing_for_one_file_get_the_lock_or_a_lock_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.pages");
    let results: Vec<Result<u64, Error>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let path = &path;
                s.spawn(move || {
                    let mut w = PageWriter::create(path, blob_schema(), WriterOptions::default())?;
                    w.write_parallel(&Blobs(vec![100 + t; 50]), 2)?;
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    Ok(w.finalize()?.num_samples)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(ok >= 1);
    for r in &results {
        if let Err(e) = r {
            assert!(matches!(e, Error::Locked { .. }), "{e}");
        }
    }
    assert_eq!(PageReader::open(&path).unwrap().len(), 50);
}

/// A source whose `fill` panics on one sample.
struct PanicsOn(usize);

impl page_alloc::SampleSource for PanicsOn {
    fn len(&self) -> usize {
        64
    }

    fn describe(
        &self,
        i: usize,
        slots: &mut [page_alloc::Slot],
    ) -> Result<(), page_alloc::BoxError> {
        slots[0] = page_alloc::Slot::Int(i as i64);
        slots[1] = page_alloc::Slot::Size(100);
        Ok(())
    }

    fn fill(
        &self,
        i: usize,
        _: &mut page_alloc::SampleOut<'_>,
    ) -> Result<(), page_alloc::BoxError> {
        assert_ne!(i, self.0, "the source's own bug");
        Ok(())
    }
}

#[test]
fn a_panicking_source_reaches_the_caller_and_leaves_the_writer_refusing_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.pages");
    let opts = WriterOptions::default().page_size(4096);
    let mut writer = PageWriter::create(&path, blob_schema(), opts).unwrap();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        writer.write_parallel(&PanicsOn(40), 4)
    }));
    let payload = outcome.expect_err("the panic is resumed on the caller");
    let message = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(message.contains("the source's own bug"), "{message}");
    let again = writer.write_parallel(&PanicsOn(usize::MAX), 2);
    assert!(
        matches!(&again, Err(Error::Invalid { .. })),
        "a writer a panic went through refuses further writes: {again:?}"
    );
    drop(writer);
    assert!(!path.exists(), "nothing at the final path");
}
