#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

mod cli;
pub mod demo;
mod error;
mod garbage;
pub mod json;
mod keyed;
mod remote;
mod tier;

pub use cache_check::{Problem, ProblemKind, Summary};
pub use cli::{Cli, Command, main, run, spec_for, verify_path};
pub use error::{CliError, EXIT_PROBLEMS, EXIT_SOUND, EXIT_USAGE, Result};
