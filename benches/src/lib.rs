//! The workload runner of `BENCHMARKS.md` and its shared machinery.
//!
//! `cargo run --release -p benches --bin workload -- <w1|w2|w3|w4|w5|w6|w9|limits|all>
//! [--n N] [--seed S] [--dir D]` prints one JSON object per line on stdout
//! (progress goes to stderr). Every workload lives in its own module
//! (`w1` … `w6`, `w9`) and reports through [`Ctx::emit`]; [`limits`] measures the
//! machine's own ceilings in the same run so that each throughput is also
//! printed as a fraction of the relevant limit.
#![deny(missing_docs)]

pub mod limits;
pub mod report;
pub mod w1;
pub mod w2;
pub mod w3;
pub mod w4;
pub mod w5;
pub mod w6;
pub mod w9;
pub mod write_runs;

use std::path::PathBuf;

pub use limits::Limits;
pub use report::{Limit, Line, peak_rss_bytes, reset_peak_rss};

/// A failed workload: a wrong value read back, or an error from a store.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A value read back differs from the value written.
    #[error("{workload}: wrong value read back: {detail}")]
    WrongValue {
        /// Which workload.
        workload: &'static str,
        /// What differed.
        detail: String,
    },
    /// A store or the file system returned an error.
    #[error("{workload}: {source}")]
    Store {
        /// Which workload.
        workload: &'static str,
        /// The underlying error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl RunError {
    /// Wraps any error of workload `workload`.
    pub fn store(
        workload: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> RunError {
        RunError::Store {
            workload,
            source: source.into(),
        }
    }
}

/// What every workload gets: its parameters, the limits, and the output.
pub struct Ctx {
    /// `--n`: overrides the workload's default item count.
    pub n: Option<usize>,
    /// `--seed`: seeds every generated value.
    pub seed: u64,
    /// Scratch directory for the caches the workload writes.
    pub dir: PathBuf,
    /// The machine's limits, measured in this run.
    pub limits: Limits,
    /// `--writers`: writer processes of W2's multi-writer phase (1: none).
    pub writers: usize,
    /// `--server`: the S3 servers W6 and W9 read from (`moto`, `s3s`, `both`).
    pub w6_server: Option<String>,
    /// `--cache`: W6's caches (`w1`, `w5` or `both`).
    pub w6_cache: Option<String>,
    /// `--reps`: W6 runs each read this many times (each cold one on a
    /// fresh tier) and reports the run of median seconds.
    pub w6_reps: usize,
}

impl Ctx {
    /// Prints one JSON line on stdout.
    pub fn emit(&self, line: Line) {
        println!("{}", line.finish(&self.limits));
    }

    /// The item count: `--n` if given, else `default`.
    pub fn n_or(&self, default: usize) -> usize {
        self.n.unwrap_or(default)
    }

    /// A fresh, empty sub-directory of the scratch dir for one workload.
    pub fn fresh_dir(&self, name: &str) -> std::io::Result<PathBuf> {
        let dir = self.dir.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

/// Progress on stderr (stdout carries only JSON lines).
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("[workload] {}", format!($($arg)*)) };
}

/// Median of a non-empty list of samples (sorted in place).
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}
