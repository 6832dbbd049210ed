//! Reference layouts for the cachex crates: each binary in `src/bin/` is a
//! small, complete program a user copies. Run one with
//! `cargo run -p examples --bin <name> -- [DIR]`; `tests/run_all.rs` runs
//! every one in CI.
//!
//! | example | shows |
//! |---|---|
//! | `feature_cache` | `CachedFn` over a segment-store: a model's outputs cached per sample |
//! | `dataset_memmap` | memmap-array `open_or_build`: build, interrupt, resume, hit, rebuild on a changed source |
//! | `iterable_random_access` | shard-store: random access over an iterator, loadit layout, sequence utilities, disk budget |
//! | `paged_loader` | page-alloc: parallel writes, shuffled batches into a buffer pool with prefetch |
//! | `python_roundtrip` | every format written here and read in Python (pyarrow, numpy.memmap, pickle, numpy structured dtypes) |
#![deny(missing_docs)]
