//! A cache of more segments than a process may map (issue 24, item 10): a
//! writer that flushed one record at a time once failed at segment 33,116
//! with `mmap segment: Cannot allocate memory`, because every segment
//! stayed mapped and Linux allows 65,530 maps per process.
//!
//! `CACHEX_MANY_SEGMENTS` sets the cache's size (default 100,000 segments;
//! CI may run a smaller one). This file holds one test: it counts the
//! maps of its whole process, which other tests would disturb.

use segment_store::{Options, SegmentStore, format};
use tensor_core::Tensor;
use tensor_core::Value;

/// What the template segment holds in place of the record's number.
const MARK: u32 = 0xC0FF_EE42;

fn key(i: usize) -> String {
    format!("k{i:07}")
}

fn rec(i: usize) -> Value {
    Value::from(Tensor::from_vec([2], vec![i as u32, 7]).unwrap())
}

fn segments() -> usize {
    std::env::var("CACHEX_MANY_SEGMENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000)
}

/// The maps of this process now.
fn maps_now() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// The offset of the one occurrence of `needle` in `hay`.
fn only(hay: &[u8], needle: &[u8]) -> usize {
    let at: Vec<usize> = hay
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{needle:?} at {at:?}");
    at[0]
}

/// A cache of `n` one-record segments, as one flush per record leaves it.
/// The store writes the first; the rest are that file with its key and
/// number patched (same lengths, so every offset holds), and the index
/// log lists them all: building 100,000 segments through the store would
/// cost 100,000 fsyncs and nothing this test looks at.
fn build(dir: &std::path::Path, n: usize) {
    {
        let store = SegmentStore::open(dir, Options::default()).unwrap();
        let template = Value::from(Tensor::from_vec([2], vec![MARK, 7]).unwrap());
        store.put_batch(&[(key(0), template)]).unwrap();
        store.flush().unwrap();
    }
    let first = format::segment_path(dir, 0);
    let mut bytes = std::fs::read(&first).unwrap();
    let key_at = only(&bytes, key(0).as_bytes());
    let mark_at = only(&bytes, &MARK.to_le_bytes());
    let mut log = format::encode_index_header().to_vec();
    for i in 0..n {
        let k = key(i);
        bytes[key_at..key_at + k.len()].copy_from_slice(k.as_bytes());
        bytes[mark_at..mark_at + 4].copy_from_slice(&(i as u32).to_le_bytes());
        let id = u32::try_from(i).unwrap();
        std::fs::write(format::segment_path(dir, id), &bytes).unwrap();
        log.extend(format::encode_group(
            id,
            bytes.len() as u64,
            format::content_hash(&bytes),
            &[format::key_hash(&k)],
        ));
    }
    std::fs::write(dir.join(format::INDEX_FILE), log).unwrap();
}

/// A small xorshift: the reads are random, and the same in every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn a_store_of_many_segments_keeps_its_maps_bounded() {
    let n = segments();
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), n);
    let max_maps = 512;
    // Threads (the flush thread's stack and guard page) and allocator
    // arenas come and go beside the segments' maps.
    let slack = 64;
    let baseline = maps_now();
    let peak = std::cell::Cell::new(0);
    let watch = |when: &str| {
        let now = maps_now();
        peak.set(peak.get().max(now));
        assert!(
            now <= baseline + max_maps + slack,
            "{when}: {now} maps, {baseline} before the store opened (bound {max_maps})"
        );
    };
    let store = SegmentStore::open(
        dir.path(),
        Options {
            max_maps,
            lru_bytes: 0,
            flush_every: 1 << 20,
            ..Options::default()
        },
    )
    .unwrap();
    assert!(store.problems().is_empty(), "{:?}", store.problems());
    assert_eq!(store.len(), n);
    watch("opened");

    // A record read first: its bytes are a view into its segment's map,
    // which the reads below unmap from the store's set long before the end.
    let (held, missing) = store.get_batch(&[key(0)]).unwrap();
    assert!(missing.is_empty());

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut appended = n;
    for round in 0..60 {
        let keys: Vec<String> = (0..256).map(|_| key(rng.below(appended))).collect();
        let (got, missing) = store.get_batch(&keys).unwrap();
        assert!(missing.is_empty(), "round {round}: {missing:?}");
        for (k, g) in keys.iter().zip(&got) {
            let i: usize = k[1..].parse().unwrap();
            assert_eq!(g.as_ref().unwrap(), &rec(i), "{k}");
        }
        drop(got);
        watch(&format!("read round {round}"));
        // One more segment every round, one record each.
        for _ in 0..5 {
            store.put_batch(&[(key(appended), rec(appended))]).unwrap();
            store.flush().unwrap();
            appended += 1;
        }
        watch(&format!("append round {round}"));
    }
    assert_eq!(held[0].as_ref().unwrap(), &rec(0));
    assert_eq!(store.len(), appended);
    drop(held);
    drop(store);
    eprintln!(
        "{n} segments (+{} appended): {baseline} maps before the store, at most {} with it \
         (bound {max_maps})",
        appended - n,
        peak.get()
    );

    // Reopened read-only, every segment a writer appended reads back.
    let reader = SegmentStore::open(
        dir.path(),
        Options {
            read_only: true,
            max_maps,
            lru_bytes: 0,
            ..Options::default()
        },
    )
    .unwrap();
    let keys: Vec<String> = (n..appended).map(key).collect();
    let (got, missing) = reader.get_batch(&keys).unwrap();
    assert!(missing.is_empty(), "{missing:?}");
    for (i, g) in (n..appended).zip(&got) {
        assert_eq!(g.as_ref().unwrap(), &rec(i));
    }
    drop(got);
    watch("reopened");
}
