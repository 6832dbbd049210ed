//! `cachex demo`: two epochs of a slow feature extractor through
//! [`CachedFn`] over a segment-store cache.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use tensor_core::Tensor;

use cache_facade::{CacheConfig, CachedFn, FacadeError, Result, SegmentBackend, StoreKind};

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Where the cache root goes.
    pub dir: PathBuf,
    /// Samples in the synthetic dataset.
    pub n: usize,
    /// Samples per batch.
    pub batch: usize,
    /// Simulated extractor cost per sample.
    pub cost_per_sample: Duration,
    /// Feature width.
    pub dim: usize,
    /// Show progress bars (off when stderr is not a terminal or in tests).
    pub progress: bool,
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoSummary {
    /// Wall time per epoch.
    pub epoch_times: Vec<Duration>,
    /// Hit rate per epoch.
    pub hit_rates: Vec<f64>,
    /// Extractor calls per epoch.
    pub computed: Vec<u64>,
    /// Bytes on disk under the cache directory.
    pub bytes_on_disk: u64,
    /// The cache directory.
    pub cache_dir: PathBuf,
}

impl DemoSummary {
    /// Epoch 1 time over the last epoch's time.
    pub fn speedup(&self) -> f64 {
        match (self.epoch_times.first(), self.epoch_times.last()) {
            (Some(a), Some(b)) => a.as_secs_f64() / b.as_secs_f64().max(1e-9),
            _ => 0.0,
        }
    }
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{:<8} {:>10} {:>10} {:>10}",
            "epoch", "time", "hit rate", "computed"
        )?;
        for (i, ((t, h), c)) in self
            .epoch_times
            .iter()
            .zip(&self.hit_rates)
            .zip(&self.computed)
            .enumerate()
        {
            writeln!(
                f,
                "{:<8} {:>9.2}s {:>9.1}% {:>10}",
                i + 1,
                t.as_secs_f64(),
                h * 100.0,
                c
            )?;
        }
        writeln!(f, "speed-up of the cached epoch: {:.1}x", self.speedup())?;
        writeln!(
            f,
            "cache on disk: {} ({})",
            human_bytes(self.bytes_on_disk),
            self.cache_dir.display()
        )?;
        write!(
            f,
            "look inside:   cachex inspect {}",
            self.cache_dir.display()
        )
    }
}

/// The synthetic feature of sample `i`: element j is `sin(i * 0.01 + j)`.
pub fn synthetic_feature(i: u64, dim: usize) -> Vec<f32> {
    (0..dim)
        .map(|j| ((i as f64) * 0.01 + j as f64).sin() as f32)
        .collect()
}

/// Runs the demo.
pub fn run(opts: &DemoOptions) -> Result<DemoSummary> {
    std::fs::create_dir_all(&opts.dir).map_err(FacadeError::io("create directory", &opts.dir))?;
    let name = format!("demo-features-d{}", opts.dim);
    let config =
        CacheConfig::new(StoreKind::SegmentStore, &opts.dir, name).option("flush_every", 1024u64);
    let cache_dir = config.cache_dir()?;
    // A demo starts cold, so both epochs show what they stand for.
    if cache_dir.exists() {
        std::fs::remove_dir_all(&cache_dir).map_err(FacadeError::io("remove", &cache_dir))?;
    }
    let backend = SegmentBackend::open(&config)?;
    let dim = opts.dim;
    let cost = opts.cost_per_sample;
    let extractor = CachedFn::new(backend, move |ids: &[&u64]| {
        // The "expensive" part: a fixed cost per sample, as a GPU model or a
        // decoder would have.
        std::thread::sleep(cost * ids.len() as u32);
        ids.iter()
            .map(|&&i| {
                Tensor::from_vec([dim], synthetic_feature(i, dim)).map(tensor_core::Value::from)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
    })?;

    let samples: Vec<u64> = (0..opts.n as u64).collect();
    let ids: Vec<String> = samples.iter().map(|i| format!("img_{i:07}")).collect();
    let mut summary = DemoSummary {
        epoch_times: Vec::new(),
        hit_rates: Vec::new(),
        computed: Vec::new(),
        bytes_on_disk: 0,
        cache_dir: cache_dir.clone(),
    };
    for epoch in 1..=2 {
        let before = extractor.stats();
        let bar = progress_bar(opts, epoch);
        let start = Instant::now();
        for (chunk, chunk_ids) in samples.chunks(opts.batch).zip(ids.chunks(opts.batch)) {
            let features = extractor.call(chunk, chunk_ids)?;
            check_features(chunk, &features, dim)?;
            bar.inc(chunk.len() as u64);
        }
        extractor.flush()?;
        let elapsed = start.elapsed();
        bar.finish_and_clear();
        let after = extractor.stats();
        let hits = after.hits - before.hits;
        let computed = after.computed - before.computed;
        summary.epoch_times.push(elapsed);
        summary
            .hit_rates
            .push(hits as f64 / (hits + computed).max(1) as f64);
        summary.computed.push(computed);
    }
    summary.bytes_on_disk = dir_size(&cache_dir)?;
    Ok(summary)
}

fn progress_bar(opts: &DemoOptions, epoch: usize) -> ProgressBar {
    if !opts.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(opts.n as u64);
    let style = ProgressStyle::with_template(
        "epoch {msg} [{bar:40}] {pos}/{len} samples ({per_sec}, eta {eta})",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(epoch.to_string());
    bar
}

/// Every feature read back must be the one the extractor computes.
fn check_features(chunk: &[u64], features: &[tensor_core::Value], dim: usize) -> Result<()> {
    for (&i, record) in chunk.iter().zip(features) {
        let expected = synthetic_feature(i, dim);
        let got = record
            .as_tensor()
            .and_then(|t| t.view().as_slice::<f32>().ok().map(<[f32]>::to_vec));
        if got.as_deref() != Some(&expected[..]) {
            return Err(FacadeError::Backend(format!(
                "demo: sample {i} read back a wrong feature"
            )));
        }
    }
    Ok(())
}

/// Total size of the files under `dir`.
pub fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(FacadeError::io("list directory", dir))?;
    for entry in entries {
        let entry = entry.map_err(FacadeError::io("list directory", dir))?;
        let meta = entry
            .metadata()
            .map_err(FacadeError::io("stat", entry.path()))?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}
