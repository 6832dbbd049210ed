//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong computing keys, stamping sources or writing files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// A file could not be read or written.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What was being done ("open", "read", ...).
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A source path lies outside the root it must be stamped relative to.
    #[error("{}: source file is outside the root {}", path.display(), root.display())]
    OutsideRoot {
        /// The source path as given.
        path: PathBuf,
        /// The root it should be under.
        root: PathBuf,
    },
    /// The config's `Serialize` implementation failed or produced a value
    /// the canonical encoding cannot hold.
    #[error("config cannot be encoded canonically: {0}")]
    Encode(String),
    /// A string is not a cache key (16 lowercase hex characters).
    #[error("{0:?} is not a cache key (16 lowercase hex characters)")]
    InvalidKey(String),
    /// A cache name is not one plain path component.
    #[error(
        "cache name {0:?} must be one plain path component (not empty, '.', '..'; no '/', '\\', NUL)"
    )]
    InvalidName(String),
}

impl FingerprintError {
    /// An I/O error of `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> FingerprintError {
        let path = path.as_ref().to_path_buf();
        move |source| FingerprintError::Io { path, op, source }
    }

    pub(crate) fn durable(e: durable_fs::Error) -> FingerprintError {
        let path = e.path().to_path_buf();
        match e {
            durable_fs::Error::Io { op, source, .. } => FingerprintError::Io { path, op, source },
            other => FingerprintError::Io {
                path,
                op: "lock",
                source: std::io::Error::other(other),
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = FingerprintError> = std::result::Result<T, E>;
