//! The crate's one error type, and the exit code each error means.

use std::path::PathBuf;

/// Exit code: the command did what was asked; `verify` found the cache sound.
pub const EXIT_SOUND: u8 = 0;
/// Exit code: problems found — `verify` listed some, or the cache (or the
/// record asked for) could not be read.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit code: a usage error, or a path that is no cache `cachex` knows.
pub const EXIT_USAGE: u8 = 2;

/// Why a `cachex` command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The path does not exist.
    #[error("{}: no such file or directory", .0.display())]
    NoSuchPath(PathBuf),
    /// The path exists but holds no cache of a kind `cachex` knows.
    #[error("{}: not a cache cachex knows ({known})", path.display())]
    NotACache {
        /// The path.
        path: PathBuf,
        /// The kinds `cachex` knows, for the message.
        known: String,
    },
    /// The path is no local tier directory (it has no `tier.state`).
    #[error("{}: not a tier directory (it has no tier.state)", .0.display())]
    NotATier(PathBuf),
    /// The command does not apply to this kind of cache.
    #[error("{}: {command} works on {works_on} caches, this is {found}", path.display())]
    WrongKind {
        /// The cache.
        path: PathBuf,
        /// The command (`compact`).
        command: &'static str,
        /// The kinds it works on.
        works_on: &'static str,
        /// The kind found.
        found: &'static str,
    },
    /// An argument out of its range.
    #[error("{0}")]
    Usage(String),
    /// The record asked for is not in the cache.
    #[error("{}: {what}", path.display())]
    NotFound {
        /// The cache.
        path: PathBuf,
        /// What is absent (`no record with key "x"`).
        what: String,
    },
    /// A store refused to open or read the cache (its message names the file).
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
    /// The demo's cache layer failed.
    #[error(transparent)]
    Facade(#[from] cache_facade::FacadeError),
    /// Writing the output failed.
    #[error("stdout: {0}")]
    Output(#[source] std::io::Error),
}

impl CliError {
    /// A file-system error doing `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> CliError {
        let io = cache_facade::FacadeError::io(op, path);
        move |source| CliError::from(io(source))
    }

    /// A store's error.
    pub fn store(e: impl std::error::Error + Send + Sync + 'static) -> CliError {
        CliError::Store(Box::new(e))
    }

    /// The process exit code this error means: [`EXIT_USAGE`] for usage
    /// errors and paths that are no cache (or tier) we know, else
    /// [`EXIT_PROBLEMS`].
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NoSuchPath(_)
            | CliError::NotACache { .. }
            | CliError::NotATier(_)
            | CliError::WrongKind { .. }
            | CliError::Facade(cache_facade::FacadeError::BadKey { .. })
            | CliError::Usage(_) => EXIT_USAGE,
            CliError::NotFound { .. }
            | CliError::Store(_)
            | CliError::Facade(_)
            | CliError::Output(_) => EXIT_PROBLEMS,
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = CliError> = std::result::Result<T, E>;
