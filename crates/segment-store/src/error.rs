//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong opening, reading or writing a segment store.
///
/// Every variant that concerns a file names it, so a message reads like
/// `segments/segment_000003.arrow: block 0 ends at 9000, beyond the 8000-byte file`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O call failed on `path`.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// What was being done (`"open"`, `"fsync"`, ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the writer lock of the cache directory.
    #[error("{}: another writer holds the lock of this cache", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A segment file is not a valid Arrow IPC file, or its columns are not
    /// a record layout this crate reads.
    #[error("{}: corrupt segment: {detail}", path.display())]
    CorruptSegment {
        /// The segment file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An index log that must be whole (a staged store's, adopted into a
    /// cache) has a bad header, a short group or a group that fails its
    /// checksum.
    #[error("{}: corrupt index log: {detail}", path.display())]
    CorruptLog {
        /// The log (or whose it is, for one received in memory).
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A record does not match the cache's schema; nothing of its batch was written.
    #[error("record {key:?} does not match the cache schema at field {field:?}: {detail}")]
    SchemaMismatch {
        /// The key of the offending record.
        key: String,
        /// The field (column prefix) that differs.
        field: String,
        /// How it differs.
        detail: String,
    },
    /// A record or argument the caller passed is unusable.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The store was opened read-only (or this rank does not write) and the
    /// operation needs the writer.
    #[error("{}: store is read-only: {op} needs the writer", path.display())]
    ReadOnly {
        /// The cache directory.
        path: PathBuf,
        /// The refused operation.
        op: &'static str,
    },
    /// A background flush failed; the records of that flush were not persisted.
    #[error("background flush of {records} records failed: {source}")]
    Background {
        /// How many records the failed flush held.
        records: usize,
        /// What went wrong.
        #[source]
        source: Box<Error>,
    },
    /// An Arrow call failed while building a segment in memory.
    #[error("{}: arrow: {source}", path.display())]
    Arrow {
        /// The segment being built.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// Fetching a segment's bytes from where they live (object storage)
    /// failed; the source names the object and what went wrong.
    #[error("{}: fetching segment bytes: {source}", path.display())]
    Fetch {
        /// The segment file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: crate::BoxError,
    },
    /// A tensor read back has an inconsistent dtype, shape or length.
    #[error("{}: row {row}: bad tensor in column {column:?}: {source}", path.display())]
    Tensor {
        /// The segment file.
        path: PathBuf,
        /// Row in the segment.
        row: usize,
        /// The column.
        column: String,
        /// The underlying error.
        #[source]
        source: tensor_core::TensorError,
    },
}

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An I/O error of `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl AsRef<std::path::Path>,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.as_ref().to_path_buf();
        move |source| Error::Io { path, op, source }
    }

    pub(crate) fn corrupt(path: impl Into<PathBuf>, detail: impl Into<String>) -> Error {
        Error::CorruptSegment {
            path: path.into(),
            detail: detail.into(),
        }
    }

    /// Maps an error of the durable file-system layer.
    pub(crate) fn durable(e: durable_fs::Error) -> Error {
        match e {
            durable_fs::Error::Io { op, path, source } => Error::Io { path, op, source },
            durable_fs::Error::Locked { lock_path } => Error::Locked { path: lock_path },
            other => Error::Io {
                path: other.path().to_path_buf(),
                op: "read",
                source: std::io::Error::other(other),
            },
        }
    }
}
