//! The crate's one error type.

use std::path::PathBuf;

/// What a durable file-system step can fail with. Each store maps it into
/// its own error enum, keeping the path and the operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call failed on `path` while doing `op`.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// What was being done (`"create temporary file"`, `"fsync directory"`, ...).
        op: &'static str,
        /// The file or directory concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// Another process (or another open of the lock file) holds the lock.
    #[error("{}: held by another process (another writer is running)", lock_path.display())]
    Locked {
        /// The lock file.
        lock_path: PathBuf,
    },
    /// A lock stayed held by someone else for longer than the caller waits
    /// (its holder stopped, or is far slower than any request it guards).
    #[error("{}: still held by another process after {waited:?}", lock_path.display())]
    LockTimeout {
        /// The lock file.
        lock_path: PathBuf,
        /// How long this waited.
        waited: std::time::Duration,
    },
    /// A file the format keeps small is larger than its limit.
    #[error("{}: larger than the {cap}-byte limit for this file", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit, in bytes.
        cap: u64,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The workspace's one boxed error: what a caller's code (a sample
/// source, a user function, a key encoder) fails with, carried inside a
/// store's error enum without the store knowing its type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Error {
    /// An [`Error::Io`] maker for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { op, path, source }
    }

    /// The file or directory the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            Error::Io { path, .. } | Error::TooLarge { path, .. } => path,
            Error::Locked { lock_path } | Error::LockTimeout { lock_path, .. } => lock_path,
        }
    }
}
