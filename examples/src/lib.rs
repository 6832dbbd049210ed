//! Reference layouts for the cachex crates: each binary in `src/bin/` is a
//! small, complete program a user copies. Run one with
//! `cargo run -p examples --bin <name> -- [DIR]`; `tests/run_all.rs` runs
//! every one in CI.
//!
//! | example | shows |
//! |---|---|
//! | `one_config` | the four stores behind one `open(config)` from JSON: one `Value` type, `Dataset` over the indexed ones, typed "cannot" errors, stale refused then rebuilt |
//! | `feature_cache` | `CachedFn` over a segment-store opened with `open(config)`: a model's outputs cached per sample |
//! | `dataset_memmap` | memmap-array `open_or_build`: build, interrupt, resume, hit, rebuild on a changed source; then the same cache through `open(config)` as a `Dataset` |
//! | `iterable_random_access` | shard-store: random access over an iterator, loadit layout, sequence utilities, disk budget |
//! | `paged_loader` | page-alloc: parallel writes, shuffled batches into a buffer pool with prefetch |
//! | `python_roundtrip` | every format written here and read in Python (pyarrow, numpy.memmap, pickle, numpy structured dtypes) |
//!
//! `iterable_random_access` and `paged_loader` use their stores directly:
//! typed serde items and the sequence utilities (shard-store), parallel
//! page writes, inline int fields and the allocation-free buffer pool
//! (page-alloc) are store features the facade does not wrap; `one_config`
//! shows both stores through the facade.
#![deny(missing_docs)]
