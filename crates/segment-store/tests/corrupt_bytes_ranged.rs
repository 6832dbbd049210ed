//! Every single-byte corruption of a segment read through byte ranges
//! (`get_batch_ranged`) gives a typed error, a missing key or (a flipped
//! value byte) a record — never a panic, not even one caught. Its own
//! test binary, since it counts panics through the process-wide hook.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use segment_store::{BoxError, Options, SegmentRanges, SegmentStore};
use tensor_core::{DType, SharedBytes, SharedTensor, Tensor, Value};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Every segment read through ranges of the file on disk.
struct Ranged;

impl SegmentRanges for Ranged {
    fn is_local(&self, _: &Path) -> bool {
        false
    }

    fn read_ranges(&self, path: &Path, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>, BoxError> {
        let file = File::open(path)?;
        ranges
            .iter()
            .map(|r| {
                let mut buf = vec![0u8; (r.end - r.start) as usize];
                file.read_exact_at(&mut buf, r.start)?;
                Ok(buf)
            })
            .collect()
    }
}

#[test]
fn no_single_byte_flip_of_a_segment_read_through_ranges_panics() {
    std::panic::set_hook(Box::new(|_| {
        PANICS.fetch_add(1, Ordering::SeqCst);
    }));
    let src = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    {
        let store = SegmentStore::open(src.path(), Options::default()).unwrap();
        let items: Vec<(String, Value)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let flags = SharedTensor::new(
                    DType::Bool,
                    vec![i % 4 + 1],
                    SharedBytes::from(vec![1u8; i % 4 + 1]),
                )
                .unwrap();
                let record = Value::dict([
                    (
                        "x",
                        Value::from(Tensor::from_vec([2], vec![i as f32, 1.0]).unwrap()),
                    ),
                    ("flags", Value::Tensor(flags)),
                    ("label", Value::Blob(SharedBytes::from(vec![b'a'; i]))),
                ]);
                (k.clone(), record)
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
    let seg = src.path().join("segments/segment_000000.arrow");
    let bytes = std::fs::read(&seg).unwrap();
    let opts = Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    let mut panicked = Vec::new();
    let mut refused = 0;
    for pos in 0..bytes.len() {
        let mut b = bytes.clone();
        b[pos] ^= 0xFF;
        std::fs::write(&seg, &b).unwrap();
        let before = PANICS.load(Ordering::SeqCst);
        // The index log is intact: the keys are found, their rows read
        // through ranges of the corrupt file.
        let store = SegmentStore::open(src.path(), opts.clone()).unwrap();
        if store.get_batch_ranged(&keys, &Ranged).is_err() {
            refused += 1;
        }
        if PANICS.load(Ordering::SeqCst) > before {
            panicked.push(pos);
        }
    }
    let _ = std::panic::take_hook();
    assert!(panicked.is_empty(), "panics at bytes {panicked:?}");
    assert!(refused > 0, "no flip was refused");
}
