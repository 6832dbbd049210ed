//! Every single-byte corruption of a segment opens without a panic, not
//! even one caught inside the store: each is a typed problem, a missing
//! key or (a flipped value byte) a read. Its own test binary, since it
//! counts panics through the process-wide hook.

use std::sync::atomic::{AtomicUsize, Ordering};
use tensor_core::Value;

use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

static PANICS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn no_single_byte_flip_of_a_segment_panics() {
    std::panic::set_hook(Box::new(|_| {
        PANICS.fetch_add(1, Ordering::SeqCst);
    }));
    let src = tempfile::tempdir().unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    {
        let store = SegmentStore::open(src.path(), Options::default()).unwrap();
        let items: Vec<(String, Value)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let t = Tensor::from_vec([3], vec![i as f32, 1.0, 2.0]).unwrap();
                (k.clone(), Value::from(t))
            })
            .collect();
        store.put_batch(&items).unwrap();
        store.flush().unwrap();
    }
    let seg = std::fs::read_dir(src.path().join("segments"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let bytes = std::fs::read(seg).unwrap();
    let opts = Options {
        read_only: true,
        lru_bytes: 0,
        ..Options::default()
    };
    let mut panicked = Vec::new();
    for pos in 0..bytes.len() {
        let mut b = bytes.clone();
        b[pos] ^= 0xFF;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("segments")).unwrap();
        std::fs::write(dir.path().join("segments/segment_000000.arrow"), &b).unwrap();
        let before = PANICS.load(Ordering::SeqCst);
        // Any outcome but a panic: the index is rebuilt from this file.
        if let Ok(store) = SegmentStore::open(dir.path(), opts.clone()) {
            let _ = store.get_batch(&keys);
            let _ = store.verify();
        }
        if PANICS.load(Ordering::SeqCst) > before {
            panicked.push(pos);
        }
    }
    let _ = std::panic::take_hook();
    assert!(panicked.is_empty(), "panics at byte offsets {panicked:?}");
}
