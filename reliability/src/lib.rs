//! The reliability harness: "nothing committed is ever lost, nothing
//! corrupt is ever read", checked with real processes.
//!
//! - **Crash loops**: a writer child (the test binary itself, see
//!   [`test_support::crash`]) writes a deterministic stream and reports
//!   each commit after the store's commit call returned; the parent kills
//!   it with SIGKILL at a seeded moment, reopens the cache and checks that
//!   every reported commit is present byte-exact, that nothing never
//!   written appears, and that the store takes new writes.
//! - **Fault injection**: the same child under the `faultfs` LD_PRELOAD
//!   shim (`faultfs/faultfs.c`, built by `build.rs`), which fails the N-th
//!   file-system mutation (open for writing, write, ftruncate, fsync,
//!   rename, ...) with EIO or ENOSPC. [`fault_sweep`] runs it once per
//!   mutation point of a whole write sequence: each operation must return
//!   an error (never panic), and the directory must hold the previous or
//!   the new committed state, never a mix.
//!
//! - **Fuzz seeds**: [`fuzz_seeds`] builds small valid files of every
//!   format for the cargo-fuzz targets in `fuzz/` (the `fuzz-seeds`
//!   binary writes them to `fuzz/corpus/`); [`remote_seeds`] those of the
//!   remote path's targets.
//!
//! - **The remote path** ([`remote`], [`fault_proxy`]): the same loops for
//!   a segment cache published to and read from the S3 test server, and a
//!   fault proxy on 127.0.0.1 that breaks one chosen request of a publish
//!   or a cold read (see `tests/remote_crash.rs`, `tests/remote_faults.rs`).
//!
//! The store-specific writers and checks live in `tests/`.
#![deny(missing_docs)]

pub mod fault_proxy;
pub mod fuzz_seeds;
pub mod remote;
pub mod remote_seeds;

use std::path::{Path, PathBuf};

use test_support::crash::{Outcome, child};

/// Path of the built faultfs shim.
pub const FAULTFS_SO: &str = env!("FAULTFS_SO");

/// How the injected failure behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// One EIO at the chosen call; later calls succeed.
    Eio,
    /// ENOSPC from the chosen call on (a disk that stays full).
    DiskFull,
}

impl Fault {
    fn env(self) -> (&'static str, &'static str) {
        match self {
            Fault::Eio => ("EIO", "0"),
            Fault::DiskFull => ("ENOSPC", "1"),
        }
    }
}

/// How many file-system mutations the child's whole run makes.
pub fn count_mutations(test_name: &str, role: &str, seed: u64) -> u64 {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let count_file = dir.path().join("count");
    child(test_name, role, &cache, seed)
        .env("LD_PRELOAD", FAULTFS_SO)
        .env("FAULTFS_COUNT_FILE", count_file.to_string_lossy())
        .run();
    let text = std::fs::read_to_string(&count_file).expect("faultfs count file");
    text.trim().parse().expect("faultfs count")
}

/// What a sweep did.
#[derive(Debug, Clone, Default)]
pub struct SweepReport {
    /// Mutations of a fault-free run.
    pub mutation_points: u64,
    /// Child runs with a fault injected.
    pub runs: u64,
    /// Runs in which the child saw an operation fail.
    pub runs_with_errors: u64,
}

/// Runs the child once per mutation point (every one up to `max_runs`,
/// evenly spaced beyond), each in a fresh directory, with `fault` injected
/// there; `check(dir, outcome)` then inspects the directory without the shim.
pub fn fault_sweep(
    test_name: &str,
    role: &str,
    seed: u64,
    fault: Fault,
    max_runs: u64,
    mut check: impl FnMut(&Path, &Outcome),
) -> SweepReport {
    let total = count_mutations(test_name, role, seed);
    assert!(total > 0, "the child made no file-system mutation");
    let step = total.div_ceil(max_runs.max(1)).max(1);
    let (errno, sticky) = fault.env();
    let mut report = SweepReport {
        mutation_points: total,
        ..SweepReport::default()
    };
    let mut at = 1;
    while at <= total {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache: PathBuf = dir.path().join("cache");
        let outcome = child(test_name, role, &cache, seed)
            .env("LD_PRELOAD", FAULTFS_SO)
            .env("FAULTFS_AT", at.to_string())
            .env("FAULTFS_ERRNO", errno)
            .env("FAULTFS_STICKY", sticky)
            .run();
        report.runs += 1;
        if !outcome.errors.is_empty() {
            report.runs_with_errors += 1;
        }
        check(&cache, &outcome);
        at += step;
    }
    report
}

/// The crash loop: `cycles` (or `CACHEX_CRASH_CYCLES`) runs of the child
/// `role` of test `test_name`, each in a fresh directory `<tmp>/cache`,
/// killed with SIGKILL at a seeded moment between 5 and 155 ms (before,
/// during and after commits); `check(dir, seed, outcome)` then inspects the
/// directory. The cycle number is the child's seed.
pub fn crash_loop(
    test_name: &str,
    role: &str,
    cycles: usize,
    mut check: impl FnMut(&Path, u64, &Outcome),
) {
    for cycle in 0..test_support::crash::cycles(cycles) as u64 {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("cache");
        let kill_ms = 5 + (cycle.wrapping_mul(2_654_435_761) % 150);
        let out = test_support::crash::run_and_kill(
            test_name,
            role,
            &dir,
            cycle,
            std::time::Duration::from_millis(kill_ms),
        );
        check(&dir, cycle, &out);
    }
}

/// [`fault_sweep`] over the child `role` of `test_name` (at most 300 runs),
/// asserting that the injected faults reached the store's operations, and
/// printing the report under `store`'s name.
pub fn sweep(
    store: &str,
    test_name: &str,
    role: &str,
    seed: u64,
    fault: Fault,
    check: impl FnMut(&Path, &Outcome),
) -> SweepReport {
    let report = fault_sweep(test_name, role, seed, fault, 300, check);
    assert!(
        report.runs_with_errors > 0,
        "{store}: no injected {fault:?} surfaced as an error: {report:?}"
    );
    eprintln!("{store} {fault:?} sweep: {report:?}");
    report
}
