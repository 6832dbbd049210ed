//! `cachex-cli`: the `cachex` command-line tool over every cachex store
//! and the Python tools' caches they read — `inspect`, `verify`, `get`,
//! `stats`, `compact` and `demo` — and moves caches to and from object
//! storage through the commit log the stores publish to (see
//! `remote-cache`): `push LOCAL URL` (a directory as one commit), `pull
//! URL LOCAL`, `gc URL [--keep 7d] [--grace 1h]` and `du URL`.
//! It is a crate of its own so that an application using `cache-facade`
//! compiles no command-line parser or progress bar.
//!
//! Each kind of cache has one entry ([`cache_facade::KindSpec`]: detect /
//! inspect / verify / get / stats) in the facade's registry,
//! [`cache_facade::KINDS`]; a command finds the entry for its path
//! ([`spec_for`]) and calls it, so no command matches on the kind, and
//! `cache_facade::open` and `cachex.verify` detect by the same rules. Stores
//! answer in the shared [`cache_check`] shape: `verify` a list of
//! [`Problem`]s (path, kind, detail), `inspect` a [`Summary`] printed as a
//! table or, with `--json`, as JSON.
//!
//! | kind | recognised by |
//! |---|---|
//! | segment-store | a directory with `segment-index.log` |
//! | torchcachex | a directory with `segments/` and no index log |
//! | memmap-array | a directory with `shapes.json` or `manifest.jsonl` |
//! | shard-store / loadit | a directory with `metadata.json` and `shards/` |
//! | page-alloc | a file starting with the page-alloc magic |
//! | beton (FFCV) | `*.beton` of version 2, or any file with a plausible header |
//!
//! Exit codes: [`EXIT_SOUND`] 0 (done; `verify` found nothing),
//! [`EXIT_PROBLEMS`] 1 (problems found, or the cache or record could not
//! be read), [`EXIT_USAGE`] 2 (usage error, or no cache `cachex` knows).
//! The tool writes nothing of its own to disk (`compact` and `demo` write
//! through the stores, `pull` writes the files of the commit log and its
//! record of them in `.cachex-remote/`, and its local tier is temporary
//! unless `--tier-dir` is given).
//!
//! # Example
//! ```
//! use cachex_cli::{spec_for, verify_path};
//! use cache_facade::{Detected, StoreKind};
//! use segment_store::{Options, SegmentStore};
//! use tensor_core::{Tensor, Value};
//!
//! let dir = tempfile::tempdir()?;
//! let store = SegmentStore::open(dir.path(), Options::default())?;
//! store.put_batch(&[("a", Value::from(Tensor::from_vec([2], vec![1.0f32, 2.0])?))])?;
//! store.flush()?;
//! drop(store);
//!
//! let (kind, problems) = verify_path(dir.path())?;
//! assert_eq!(kind, Detected::own(StoreKind::SegmentStore));
//! assert!(problems.is_empty());
//! let stats = spec_for(dir.path())?.stats(dir.path())?;
//! assert_eq!(stats.get("entries"), Some(&serde_json::json!(1)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod cli;
pub mod demo;
mod error;
mod garbage;
pub mod json;
mod keyed;
mod remote;

pub use cache_check::{Problem, ProblemKind, Summary};
pub use cli::{Cli, Command, main, run, spec_for, verify_path};
pub use error::{CliError, EXIT_PROBLEMS, EXIT_SOUND, EXIT_USAGE, Result};
