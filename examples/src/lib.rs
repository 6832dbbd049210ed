//! Reference layouts for the cachex crates: each binary in `src/bin/` is a
//! small, complete program a user copies. Run one with
//! `cargo run -p examples --bin <name> -- [DIR]`; `tests/run_all.rs` runs
//! every one in CI.
//!
//! | example | shows |
//! |---|---|
//! | `feature_cache` | `CachedFn` over a segment-store: a model's outputs cached per sample |
//! | `dataset_memmap` | memmap-array `open_or_build`: build, interrupt, resume, hit, rebuild on a changed source |
//! | `paged_loader` | page-alloc: parallel writes, shuffled batches into a buffer pool with prefetch |
#![deny(missing_docs)]
