//! Reference layouts for the cachex crates: each binary in `src/bin/` is a
//! small, complete program a user copies. Run one with
//! `cargo run -p examples --bin <name> -- [DIR]`; `tests/run_all.rs` runs
//! every one in CI.
//!
//! | example | shows |
//! |---|---|
//! | `feature_cache` | `CachedFn` over a segment-store: a model's outputs cached per sample |
#![deny(missing_docs)]
