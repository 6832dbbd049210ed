//! Writes the seed corpus of the fuzz targets: every seed of
//! [`reliability::fuzz_seeds::seeds`] and [`reliability::remote_seeds::seeds`] to `<corpus>/<target>/seed-<what>`,
//! after removing the `seed-*` files there (inputs libFuzzer added stay).
//!
//! Usage: `cargo run -p reliability --bin fuzz-seeds [CORPUS_DIR]`
//! (default `fuzz/corpus` of the workspace); `scripts/fuzz --seeds` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use reliability::fuzz_seeds::{TARGETS, seeds};

fn main() -> ExitCode {
    let corpus = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| test_support::workspace_root().join("fuzz/corpus"));
    match run(&corpus) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuzz-seeds: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(corpus: &std::path::Path) -> reliability::fuzz_seeds::Result<()> {
    let scratch = tempfile::tempdir()?;
    let mut all = seeds(&test_support::fixtures_dir(), scratch.path())?;
    all.extend(reliability::remote_seeds::seeds(
        &scratch.path().join("remote"),
    )?);
    for target in TARGETS
        .into_iter()
        .chain(reliability::remote_seeds::TARGETS)
    {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("seed-") {
                std::fs::remove_file(entry.path())?;
            }
        }
        let mine: Vec<_> = all.iter().filter(|s| s.target == target).collect();
        let mut largest = 0;
        for seed in &mine {
            std::fs::write(dir.join(&seed.name), &seed.bytes)?;
            largest = largest.max(seed.bytes.len());
        }
        println!("{target}: {} seeds, largest {largest} bytes", mine.len());
    }
    Ok(())
}
