//! The crate's one error type.

use std::path::PathBuf;

/// What can go wrong computing keys, stamping sources or writing files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
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
}

impl FingerprintError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> FingerprintError {
        FingerprintError::Io {
            path: path.into(),
            source,
        }
    }

    /// Maps an error of the durable file-system layer (only I/O errors
    /// arise from the steps this crate takes).
    pub(crate) fn durable(e: durable_fs::Error) -> FingerprintError {
        let path = e.path().to_path_buf();
        match e {
            durable_fs::Error::Io { source, .. } => FingerprintError::Io { path, source },
            other => FingerprintError::Io {
                path,
                source: std::io::Error::other(other),
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = FingerprintError> = std::result::Result<T, E>;
