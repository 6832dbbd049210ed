//! `facade_overhead`: what a read through `cache_facade` costs over the
//! store's own API, measured in one process on one open cache so the
//! machine's noise cancels (the workload runner's W1 lines compare whole
//! passes, minutes apart).
//!
//! `cargo run --release -p benches --bin facade_overhead -- [tensor|dict]`
//! writes 50,000 W1 samples, then alternates 4,000 batches of 256 random
//! keys between `SegmentStore::get_batch` and the facade's
//! `CacheBackend::get_batch` (each batch touching every feature element)
//! and prints the p10/p50/p90 batch latency of each.

use std::time::Instant;

use cache_facade::{CacheBackend, CacheConfig, SegmentBackend, StoreKind, Value};
use segment_store::{Options, SegmentStore};
use tensor_core::Tensor;

const N: usize = 50_000;
const BATCH: usize = 256;
const ROUNDS: usize = 4_000;

fn sample(k: usize, dict: bool) -> Result<Value, tensor_core::TensorError> {
    let features = Tensor::from_vec([512], vec![k as f32; 512])?;
    Ok(if dict {
        Value::dict([
            ("features", features),
            ("logits", Tensor::from_vec([10], vec![1.0f32; 10])?),
        ])
    } else {
        Value::from(features)
    })
}

fn quantiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)];
    format!("p10 {:.1} p50 {:.1} p90 {:.1}", q(0.1), q(0.5), q(0.9))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dict = std::env::args().nth(1).as_deref() == Some("dict");
    let root = tempfile::tempdir()?;
    let config =
        CacheConfig::new(StoreKind::SegmentStore, root.path(), "w1").option("lru_bytes", 0);
    let facade = SegmentBackend::open(&config)?;
    for start in (0..N).step_by(BATCH) {
        let items = (start..(start + BATCH).min(N))
            .map(|k| Ok((format!("sample_{k}"), sample(k, dict)?)))
            .collect::<Result<Vec<_>, tensor_core::TensorError>>()?;
        facade.put_batch(items)?;
    }
    facade.flush()?;
    // A second handle on the same files, through the store's own API (a
    // reader rank: the facade's handle is the writer).
    let options = Options {
        lru_bytes: 0,
        writer_rank: u32::MAX,
        ..Options::default()
    };
    let store = SegmentStore::open(facade.path(), options)?;

    let (mut store_us, mut facade_us) = (Vec::new(), Vec::new());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sink = 0.0f32;
    for round in 0..ROUNDS {
        let keys: Vec<String> = (0..BATCH)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("sample_{}", x % N as u64)
            })
            .collect();
        let t = Instant::now();
        if round % 2 == 0 {
            let (records, _) = store.get_batch(&keys)?;
            for r in records.iter().flatten() {
                let f = if dict {
                    r.get("features").and_then(tensor_core::Value::as_tensor)
                } else {
                    r.as_tensor()
                };
                sink += f
                    .ok_or("no features")?
                    .view()
                    .as_slice::<f32>()?
                    .iter()
                    .sum::<f32>();
            }
            store_us.push(t.elapsed().as_secs_f64() * 1e6);
        } else {
            let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let (values, _) = facade.get_batch(&refs)?;
            for v in values.iter().flatten() {
                let f = if dict {
                    v.get("features").and_then(Value::as_tensor)
                } else {
                    v.as_tensor()
                };
                sink += f
                    .ok_or("no features")?
                    .as_slice::<f32>()?
                    .iter()
                    .sum::<f32>();
            }
            facade_us.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    std::hint::black_box(sink);
    let shape = if dict { "dict" } else { "tensor" };
    println!("{shape}: store  us/batch {}", quantiles(store_us));
    println!("{shape}: facade us/batch {}", quantiles(facade_us));
    Ok(())
}
