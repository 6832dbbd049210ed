//! The workload runner: `workload <w1|w2|w3|w4|w5|w6|w9|limits|all> [--n N]
//! [--seed S] [--dir D] [--writers K] [--server moto|s3s|both]`. One JSON object per line on stdout.

use std::path::PathBuf;
use std::process::ExitCode;

use benches::{Ctx, Limits, Line, RunError, progress};
use clap::{Parser, ValueEnum};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Which {
    W1,
    W2,
    W3,
    W4,
    W5,
    /// Remote reads (needs an S3 server: not part of `all`).
    W6,
    /// Plan-aware and node-affine tiers over epochs (S3 servers and the
    /// Python package: not part of `all`).
    W9,
    Limits,
    All,
}

/// Runs the BENCHMARKS.md workloads and prints JSON lines.
#[derive(Debug, Parser)]
struct Args {
    /// Which workload to run.
    which: Which,
    /// Item count (overrides each workload's default; small for smoke runs).
    #[arg(long)]
    n: Option<usize>,
    /// Seed of every generated value.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Scratch directory (default: a temporary directory, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Size of the file the I/O limits are measured on, in MiB.
    #[arg(long, default_value_t = 1024)]
    limits_mb: usize,
    /// Size of the buffer the memcpy limit is measured on, in MiB.
    #[arg(long, default_value_t = 256)]
    memcpy_mb: usize,
    /// Writer processes of W2's `multi_writer` phase (1: no such phase).
    #[arg(long, default_value_t = 1)]
    writers: usize,
    /// W6's and W9's S3 servers: `moto`, `s3s` (s3s-fs) or `both`.
    #[arg(long, default_value = "both")]
    server: String,
    /// W6's caches: `w1`, `w5` or `both`.
    #[arg(long, default_value = "both")]
    cache: String,
    /// W6: runs of each read (each cold one on a fresh tier); the line is
    /// the run of median seconds.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

fn main() -> ExitCode {
    // A writer child of W2's multi-writer phase.
    if let Some(done) = benches::w2::child_from_env() {
        return match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("w2 writer child failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("workload failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), RunError> {
    let tmp;
    let dir = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| RunError::store("runner", e))?;
            d.clone()
        }
        None => {
            tmp = tempfile::Builder::new()
                .prefix("cachex-workload")
                .tempdir_in(std::env::current_dir().unwrap_or_else(|_| std::env::temp_dir()))
                .map_err(|e| RunError::store("runner", e))?;
            tmp.path().to_path_buf()
        }
    };
    progress!("measuring limits in {}", dir.display());
    let limits = Limits::measure(&dir, args.memcpy_mb, args.limits_mb)
        .map_err(|e| RunError::store("limits", e))?;
    let ctx = Ctx {
        n: args.n,
        seed: args.seed,
        dir,
        limits,
        writers: args.writers.max(1),
        w6_server: Some(args.server.clone()),
        w6_cache: Some(args.cache.clone()),
        w6_reps: args.reps.max(1),
    };
    for (phase, bytes_per_s) in [
        ("memcpy", limits.memcpy),
        ("page_cache_read", limits.page_cache_read),
        ("durable_write", limits.durable_write),
    ] {
        ctx.emit(
            Line::new("limits", phase, 1, bytes_per_s as u64, 1.0)
                .with("gb_per_s", bytes_per_s / 1e9),
        );
    }
    let all = args.which == Which::All;
    type Step = fn(&Ctx) -> Result<(), RunError>;
    let steps: [(Which, Step); 7] = [
        (Which::W1, benches::w1::run),
        (Which::W2, benches::w2::run),
        (Which::W3, benches::w3::run),
        (Which::W4, benches::w4::run),
        (Which::W5, benches::w5::run),
        (Which::W6, benches::w6::run),
        (Which::W9, benches::w9::run),
    ];
    for (which, step) in steps {
        if (all && !matches!(which, Which::W6 | Which::W9)) || args.which == which {
            progress!("running {which:?}");
            benches::reset_peak_rss();
            step(&ctx)?;
        }
    }
    Ok(())
}
