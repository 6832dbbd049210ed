#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod adapter;
mod adapters;
mod cli;
pub mod demo;
mod error;
mod garbage;
pub mod json;
mod keyed;
mod remote;

pub use adapter::CacheAdapter;
pub use adapters::{ADAPTERS, adapter_for, detect};
pub use cache_check::{Problem, ProblemKind, Summary};
pub use cli::{Cli, Command, main, run, verify_path};
pub use error::{CliError, EXIT_PROBLEMS, EXIT_SOUND, EXIT_USAGE, Result};
