//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong writing, reading or checking a memmap-array cache.
///
/// Every variant that concerns a file names it, so a message such as
/// `cache/data.bin: 1048576 bytes on disk, shapes.json says 2097152` is
/// enough to find the problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system call on `path` failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done ("open", "fsync", ...).
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another writer holds the advisory lock on the cache directory.
    #[error("{}: another writer holds the lock on this cache directory; only one writer may build a cache at a time", path.display())]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The cache has no `_COMPLETE` sentinel: it was never finalized.
    #[error("{}: cache is not complete (no _COMPLETE); resume or rebuild it", dir.display())]
    Incomplete {
        /// The cache directory.
        dir: PathBuf,
    },
    /// A writer was asked to open a cache that is already finalized.
    #[error("{}: cache is already complete; open it with MemmapArray::open", dir.display())]
    AlreadyComplete {
        /// The cache directory.
        dir: PathBuf,
    },
    /// A file's content breaks the format.
    #[error("{}: {reason}", file.display())]
    Corrupt {
        /// The offending file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A JSON file does not parse or does not have the expected structure.
    #[error("{}: invalid JSON: {source}", file.display())]
    Json {
        /// The offending file.
        file: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The Parquet index could not be written or read.
    #[error("{}: {source}", file.display())]
    Parquet {
        /// The index file.
        file: PathBuf,
        /// The Parquet error.
        source: parquet::errors::ParquetError,
    },
    /// Building or decoding an Arrow batch of the index failed.
    #[error("{}: {source}", file.display())]
    Arrow {
        /// The index file.
        file: PathBuf,
        /// The Arrow error.
        source: arrow_schema::ArrowError,
    },
    /// A `.bin` file's size disagrees with the row count and row size.
    #[error("{}: {actual} bytes on disk, expected {expected} ({rows} rows of {row_bytes} bytes)", file.display())]
    BinSize {
        /// The `.bin` file.
        file: PathBuf,
        /// Bytes the shapes and row count call for.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
        /// Committed row count.
        rows: u64,
        /// Bytes per row of this array.
        row_bytes: u64,
    },
    /// A file carries a format version this crate does not read.
    #[error("{}: format version {found}, this crate reads version {supported}", file.display())]
    UnsupportedVersion {
        /// The file.
        file: PathBuf,
        /// Version found in the file.
        found: u64,
        /// Version this crate reads and writes.
        supported: u64,
    },
    /// A writer resumed with another schema than the one the cache was started with.
    #[error("{}: cache was started with another schema: {reason}", file.display())]
    SchemaMismatch {
        /// The manifest holding the stored schema.
        file: PathBuf,
        /// The first difference found.
        reason: String,
    },
    /// A writer resumed with another fingerprint than the one the cache was started with.
    #[error("{}: cache was started with another fingerprint; delete the directory to rebuild", file.display())]
    FingerprintMismatch {
        /// The manifest holding the stored fingerprint.
        file: PathBuf,
    },
    /// The schema given to a writer is invalid.
    #[error("invalid schema: {reason}")]
    InvalidSchema {
        /// What is wrong.
        reason: String,
    },
    /// A row given to the writer does not fit the schema; nothing was written.
    #[error("row {source_id:?}: {reason}; nothing was written")]
    InvalidRow {
        /// The row's source id.
        source_id: String,
        /// What is wrong.
        reason: String,
    },
    /// A row index beyond the cache's row count.
    #[error("row {index} out of range: the cache has {rows} rows")]
    RowOutOfRange {
        /// The index asked for.
        index: u64,
        /// Rows in the cache.
        rows: u64,
    },
    /// An array or sidecar name the schema does not declare.
    #[error("no {kind} named {name:?} in this cache")]
    UnknownName {
        /// `"array"` or `"sidecar"`.
        kind: &'static str,
        /// The name asked for.
        name: String,
    },
    /// Computing a cache key or fingerprint failed.
    #[error("fingerprint: {source}")]
    Fingerprint {
        /// The fingerprint crate's error.
        #[from]
        source: fingerprint::FingerprintError,
    },
    /// Loading the arrays into RAM would exceed the allowed share of physical memory.
    #[error(
        "load_in_memory refused: the arrays need {needed} bytes, above {limit} bytes ({fraction:.0}% of {physical} bytes of physical RAM); read through the memory maps instead"
    )]
    TooLargeForRam {
        /// Bytes the arrays occupy.
        needed: u64,
        /// The allowed maximum.
        limit: u64,
        /// The allowed fraction, in percent.
        fraction: f64,
        /// Physical RAM of the machine.
        physical: u64,
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

    pub(crate) fn corrupt(file: impl Into<PathBuf>, reason: impl Into<String>) -> Error {
        Error::Corrupt {
            file: file.into(),
            reason: reason.into(),
        }
    }

    /// Maps an error of the durable file-system layer.
    pub(crate) fn durable(e: durable_fs::Error) -> Error {
        match e {
            durable_fs::Error::Locked { lock_path } => Error::Locked { path: lock_path },
            durable_fs::Error::TooLarge { path, cap } => Error::corrupt(
                path,
                format!("larger than the {cap}-byte limit for this file"),
            ),
            durable_fs::Error::Io { path, op, source } => Error::Io { path, op, source },
            other => Error::Io {
                path: other.path().to_path_buf(),
                op: "lock",
                source: std::io::Error::other(other),
            },
        }
    }
}

impl Error {
    /// The file or directory the error is about, when it concerns one.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Error::Io { path, .. } | Error::Locked { path } => Some(path),
            Error::Incomplete { dir } | Error::AlreadyComplete { dir } => Some(dir),
            Error::Corrupt { file, .. }
            | Error::Json { file, .. }
            | Error::Parquet { file, .. }
            | Error::Arrow { file, .. }
            | Error::BinSize { file, .. }
            | Error::UnsupportedVersion { file, .. }
            | Error::SchemaMismatch { file, .. }
            | Error::FingerprintMismatch { file } => Some(file),
            Error::InvalidSchema { .. }
            | Error::InvalidRow { .. }
            | Error::RowOutOfRange { .. }
            | Error::UnknownName { .. }
            | Error::TooLargeForRam { .. }
            | Error::Fingerprint { .. } => None,
        }
    }
}
