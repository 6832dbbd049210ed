//! `feature_cache`: cache a model's per-sample outputs with `CachedFn`
//! over a segment-store opened with `open(config)`, the way a training
//! loop would.
//!
//! Run: `cargo run -p examples --bin feature_cache -- [DIR]`
//!
//! The first pass computes every feature (the "model" here is a cheap
//! stand-in that records how often it ran); the second pass, and any later
//! process opening the same config, reads them back. Changing an option in
//! the config (e.g. `flush_every`) names another cache directory, so a
//! stale cache is never read.

use std::sync::atomic::{AtomicUsize, Ordering};

use cache_facade::{CacheBackend, CacheConfig, CachedFn, StoreKind, Value, open};
use tensor_core::Tensor;

/// A stand-in for a feature extractor: a 64-wide embedding and a 10-class
/// logit vector per image id, as a dict value (torchcachex's "dict" shape).
fn extract(ids: &[&u32], calls: &AtomicUsize) -> Result<Vec<Value>, tensor_core::TensorError> {
    calls.fetch_add(ids.len(), Ordering::Relaxed);
    ids.iter()
        .map(|&&id| {
            let emb: Vec<f32> = (0..64)
                .map(|k| (id as f32 * 0.1 + k as f32).cos())
                .collect();
            let logits: Vec<f32> = (0..10)
                .map(|c| if c == id as usize % 10 { 5.0 } else { -1.0 })
                .collect();
            Ok(Value::dict([
                ("embedding", Tensor::from_vec([64], emb)?),
                ("logits", Tensor::from_vec([10], logits)?),
            ]))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let root = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    // The same config could come from a JSON file (CacheConfig::from_file).
    let config = CacheConfig::new(StoreKind::SegmentStore, &root, "resnet-features")
        .option("flush_every", 256u64)
        .create_root(true);
    println!("cache directory: {}", config.cache_dir()?.display());

    let calls = AtomicUsize::new(0);
    let images: Vec<u32> = (0..1000).collect();
    let ids: Vec<String> = images.iter().map(|i| format!("img-{i}")).collect();
    {
        let cached = CachedFn::new(open(&config)?, |batch: &[&u32]| extract(batch, &calls))?;
        for epoch in 1..=2 {
            let before = calls.load(Ordering::Relaxed);
            for (batch, batch_ids) in images.chunks(128).zip(ids.chunks(128)) {
                let out = cached.call(batch, batch_ids)?;
                assert_eq!(out.len(), batch.len());
            }
            println!(
                "epoch {epoch}: model ran on {} samples, cache hit rate so far {:.0}%",
                calls.load(Ordering::Relaxed) - before,
                cached.backend().stats().hit_rate() * 100.0
            );
        }
        cached.flush()?;
    }

    // A new process (here: a new handle) finds everything on disk.
    let reopened = open(&config)?;
    let (values, missing) = reopened.get_batch(&["img-7", "img-999", "img-1000"])?;
    println!(
        "reopened: {} keys, missing among 3 asked: {missing:?}",
        reopened.len()?
    );
    let logits = values[0]
        .as_ref()
        .and_then(|r| r.get("logits"))
        .and_then(Value::as_tensor)
        .ok_or("img-7 has logits")?;
    let best = logits
        .as_slice::<f32>()?
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(c, _)| c);
    println!("img-7 predicted class: {best:?} (zero-copy view of the mapped segment)");
    assert_eq!(best, Some(7));
    assert_eq!(missing, vec![2]);
    Ok(())
}
