//! The crate's one error type.

use std::path::{Path, PathBuf};

use durable_fs::BoxError;

/// Everything that can go wrong writing, opening, reading or verifying a
/// page file or an FFCV `.beton`. Every variant that concerns a file names it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call on the file failed.
    #[error("{}: {op} failed: {source}", path.display())]
    Io {
        /// The file (or directory) the call was about.
        path: PathBuf,
        /// What was being done (`"open"`, `"write page"`, `"fsync"`, ...).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another writer holds the advisory lock of this file.
    #[error("{}: another writer holds the lock {}", path.display(), lock.display())]
    Locked {
        /// The file being written.
        path: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The file was never committed: no footer, or (for `.beton`) an
    /// allocation table pointer of 0. A crash during writing leaves this.
    #[error("{}: incomplete file, never committed: {reason}", path.display())]
    Incomplete {
        /// The file.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The file is damaged: a checksum, bound, overlap or count is wrong.
    #[error("{}: corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the offending offsets or values.
        reason: String,
    },
    /// Bytes differ from the checksum recorded for them.
    #[error("{}: corrupt: {what} checksum mismatch", path.display())]
    Checksum {
        /// The file.
        path: PathBuf,
        /// What the checksum covers (`header`, `run 3 (page 3, 8192 bytes): page`).
        what: String,
    },
    /// The file carries a format version this build does not read.
    #[error("{}: format version {found} is not supported (this build reads {supported})", path.display())]
    UnsupportedVersion {
        /// The file.
        path: PathBuf,
        /// The version found in the file.
        found: u64,
        /// The version(s) this build reads.
        supported: &'static str,
    },
    /// The file holds a field kind this crate cannot interpret.
    #[error("{}: field {field:?} has unsupported type id {type_id}", path.display())]
    UnsupportedField {
        /// The file.
        path: PathBuf,
        /// The field's name.
        field: String,
        /// The type id found.
        type_id: u8,
    },
    /// The caller's schema, options or field list is invalid.
    #[error("{}: invalid {what}: {reason}", path.display())]
    Invalid {
        /// The file being written or opened.
        path: PathBuf,
        /// What is invalid (`"schema"`, `"options"`, ...).
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A sample handed to a writer does not match the schema.
    #[error("{}: sample {index}: {reason}", path.display())]
    BadSample {
        /// The file being written.
        path: PathBuf,
        /// The sample's index.
        index: u64,
        /// What does not match.
        reason: String,
    },
    /// A caller's callback failed while writing a sample.
    #[error("{}: sample {index}: the sample source failed: {source}", path.display())]
    Source {
        /// The file being written.
        path: PathBuf,
        /// The sample's index.
        index: u64,
        /// The callback's error.
        source: BoxError,
    },
    /// A sample index beyond the number of samples.
    #[error("{}: sample {index} out of range ({len} samples)", path.display())]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// The index asked for.
        index: u64,
        /// The number of samples.
        len: u64,
    },
    /// A field accessed with the wrong type, or a field index/name that does not exist.
    #[error("{}: field {field}: {reason}", path.display())]
    Field {
        /// The file.
        path: PathBuf,
        /// The field's index or name.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A stored tensor could not be viewed (dtype, shape or alignment).
    #[error("{}: {source}", path.display())]
    Tensor {
        /// The file.
        path: PathBuf,
        /// The tensor error.
        source: tensor_core::TensorError,
    },
    /// A buffer pool was too small for the batch asked of it.
    #[error("{}: buffer pool too small: {reason}", path.display())]
    PoolTooSmall {
        /// The file being read.
        path: PathBuf,
        /// Which capacity was exceeded.
        reason: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Maps an error of the durable file-system layer (the writer lock is
    /// mapped where it is taken, which knows the file it guards).
    pub(crate) fn durable(e: durable_fs::Error) -> Error {
        match e {
            durable_fs::Error::Io { op, path, source } => Error::Io { path, op, source },
            other => Error::Io {
                path: other.path().to_path_buf(),
                op: "lock",
                source: std::io::Error::other(other),
            },
        }
    }

    /// An I/O error of `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { path, op, source }
    }

    pub(crate) fn corrupt(path: &Path, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub(crate) fn checksum(path: &Path, what: impl Into<String>) -> Error {
        Error::Checksum {
            path: path.to_path_buf(),
            what: what.into(),
        }
    }

    pub(crate) fn incomplete(path: &Path, reason: impl Into<String>) -> Error {
        Error::Incomplete {
            path: path.to_path_buf(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(path: &Path, what: &'static str, reason: impl Into<String>) -> Error {
        Error::Invalid {
            path: path.to_path_buf(),
            what,
            reason: reason.into(),
        }
    }

    pub(crate) fn field(path: &Path, field: impl ToString, reason: impl Into<String>) -> Error {
        Error::Field {
            path: path.to_path_buf(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    /// Whether the error says the file is damaged or unfinished (as opposed
    /// to an I/O failure or a caller mistake).
    pub fn is_bad_file(&self) -> bool {
        matches!(
            self,
            Error::Corrupt { .. }
                | Error::Checksum { .. }
                | Error::Incomplete { .. }
                | Error::UnsupportedVersion { .. }
                | Error::UnsupportedField { .. }
        )
    }
}
