//! The one error path of the binding: every store error knows its
//! [`Kind`] ([`StoreError`], implemented here for each store crate's
//! error type), a kind is one class of the `cachex.errors` hierarchy, and
//! [`enter`] releases the GIL, calls the store and maps its error (as
//! polars' `enter_polars` does). No other file maps a store error to a
//! Python class.
//!
//! The classes are defined in Python (`python/cachex/errors.py`, where they
//! can inherit from `ValueError`/`OSError` too); this module looks each up
//! once and raises it with the store's own message (its `Display`, which
//! names the file and the problem).

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// Which class of `cachex.errors` an error is raised as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `CacheError`: nothing more specific applies.
    Other,
    /// `CacheIOError`: an OS call failed.
    Io,
    /// `CorruptError`: a file is damaged.
    Corrupt,
    /// `LockedError`: another writer holds the lock.
    Locked,
    /// `SchemaMismatchError`: a value does not fit the cache's schema.
    SchemaMismatch,
    /// `InvalidInputError`: an unusable argument.
    InvalidInput,
    /// `ReadOnlyError`: the call needs the writer.
    ReadOnly,
    /// `StaleError`: the cache was built from something else.
    Stale,
    /// `ForkedWriterError`: a writer opened before a fork used in the child.
    ForkedWriter,
    /// The builtin `IndexError`: an index past the end, so that `for x in
    /// store` and slicing work as on a list.
    Index,
}

impl Kind {
    /// The variants raised as a `cachex.errors` class, in declaration order.
    const CLASSES: [Kind; 9] = [
        Kind::Other,
        Kind::Io,
        Kind::Corrupt,
        Kind::Locked,
        Kind::SchemaMismatch,
        Kind::InvalidInput,
        Kind::ReadOnly,
        Kind::Stale,
        Kind::ForkedWriter,
    ];

    fn class_name(self) -> &'static str {
        match self {
            Kind::Other => "CacheError",
            Kind::Io => "CacheIOError",
            Kind::Corrupt => "CorruptError",
            Kind::Locked => "LockedError",
            Kind::SchemaMismatch => "SchemaMismatchError",
            Kind::InvalidInput => "InvalidInputError",
            Kind::ReadOnly => "ReadOnlyError",
            Kind::Stale => "StaleError",
            Kind::ForkedWriter => "ForkedWriterError",
            Kind::Index => "IndexError",
        }
    }
}

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    if kind == Kind::Index {
        return Ok(py.get_type::<PyIndexError>());
    }
    let classes = CLASSES.get_or_try_init(py, || {
        let module = py.import("cachex.errors")?;
        Kind::CLASSES
            .iter()
            .map(|k| {
                Ok(module
                    .getattr(k.class_name())?
                    .cast_into::<PyType>()?
                    .unbind())
            })
            .collect::<PyResult<Vec<_>>>()
    })?;
    // CLASSES lists the variants before `Index` in declaration order.
    Ok(classes[kind as usize].bind(py).clone())
}

/// The exception of `kind` carrying `message`.
pub fn raise(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match class(py, kind) {
        Ok(cls) => PyErr::from_type(cls, message),
        Err(e) => e,
    })
}

/// An `InvalidInputError`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    raise(Kind::InvalidInput, message)
}

/// A `CacheError` saying the handle of `path` was closed.
pub fn closed(path: &std::path::Path) -> PyErr {
    raise(
        Kind::Other,
        format!("{}: the handle is closed", path.display()),
    )
}

/// A `ForkedWriterError`: the writer of `path` was opened by the parent of
/// this forked process, which keeps it (its lock, its buffers, its file).
pub fn forked_writer(path: &std::path::Path) -> PyErr {
    raise(
        Kind::ForkedWriter,
        format!(
            "{}: this writer was opened before the process forked; a forked child \
             (e.g. a DataLoader worker) cannot write through it: the parent keeps the \
             writer, open a new one in the child after the parent has closed it",
            path.display()
        ),
    )
}

/// An error of a store crate, raised as the `cachex.errors` class of its
/// kind with its `Display` as the message.
pub trait StoreError: std::fmt::Display + Send + Sized {
    /// The class this error is raised as.
    fn kind(&self) -> Kind;

    /// The error as its exception.
    fn into_py_err(self) -> PyErr {
        raise(self.kind(), self.to_string())
    }
}

/// `e` as its `cachex.errors` exception (for a store call made with the
/// GIL held; a call that does I/O goes through [`enter`]).
pub fn to_py<E: StoreError>(e: E) -> PyErr {
    e.into_py_err()
}

/// Runs a store call with the GIL released and raises its error as the
/// exception of its kind: what every binding method that does I/O uses.
pub fn enter<R, E, F>(py: Python<'_>, f: F) -> PyResult<R>
where
    F: Send + FnOnce() -> Result<R, E>,
    R: Send,
    E: StoreError + Send,
{
    py.detach(f).map_err(StoreError::into_py_err)
}

impl StoreError for segment_store::Error {
    fn kind(&self) -> Kind {
        use segment_store::Error as E;
        match self {
            E::Io { .. } => Kind::Io,
            E::Locked { .. } => Kind::Locked,
            E::CorruptSegment { .. } | E::CorruptLog { .. } | E::Tensor { .. } => Kind::Corrupt,
            E::SchemaMismatch { .. } => Kind::SchemaMismatch,
            E::InvalidInput(_) => Kind::InvalidInput,
            E::ReadOnly { .. } => Kind::ReadOnly,
            // A failed background flush is raised as the class of its cause.
            E::Background { source, .. } => match source.kind() {
                k @ (Kind::Io | Kind::Locked | Kind::Corrupt) => k,
                _ => Kind::Other,
            },
            _ => Kind::Other,
        }
    }
}

impl StoreError for memmap_array::Error {
    fn kind(&self) -> Kind {
        use memmap_array::Error as E;
        match self {
            E::Io { .. } => Kind::Io,
            E::Locked { .. } => Kind::Locked,
            E::Corrupt { .. }
            | E::Json { .. }
            | E::Parquet { .. }
            | E::Arrow { .. }
            | E::BinSize { .. }
            | E::UnsupportedVersion { .. } => Kind::Corrupt,
            E::SchemaMismatch { .. } => Kind::SchemaMismatch,
            E::FingerprintMismatch { .. } => Kind::Stale,
            E::InvalidSchema { .. }
            | E::InvalidRow { .. }
            | E::RowOutOfRange { .. }
            | E::UnknownName { .. }
            | E::TooLargeForRam { .. } => Kind::InvalidInput,
            _ => Kind::Other,
        }
    }
}

impl StoreError for shard_store::Error {
    fn kind(&self) -> Kind {
        use shard_store::Error as E;
        match self {
            E::Io { .. } => Kind::Io,
            E::BadMetadata { .. }
            | E::CorruptShard { .. }
            | E::UnsupportedPickle { .. }
            | E::ItemType { .. } => Kind::Corrupt,
            E::OptionMismatch { .. } => Kind::SchemaMismatch,
            E::InvalidOption { .. } | E::Encode { .. } => Kind::InvalidInput,
            E::IndexOutOfRange { .. } => Kind::Index,
            _ => Kind::Other,
        }
    }

    fn into_py_err(self) -> PyErr {
        match self {
            // The message a list gives, without the store's path.
            shard_store::Error::IndexOutOfRange { index, len } => raise(
                Kind::Index,
                format!("index {index} out of range for length {len}"),
            ),
            e => raise(e.kind(), e.to_string()),
        }
    }
}

impl StoreError for page_alloc::Error {
    fn kind(&self) -> Kind {
        use page_alloc::Error as E;
        match self {
            E::Io { .. } => Kind::Io,
            E::Locked { .. } => Kind::Locked,
            _ if self.is_bad_file() => Kind::Corrupt,
            E::Invalid { .. }
            | E::BadSample { .. }
            | E::OutOfRange { .. }
            | E::Field { .. }
            | E::PoolTooSmall { .. } => Kind::InvalidInput,
            _ => Kind::Other,
        }
    }
}

impl StoreError for fingerprint::FingerprintError {
    fn kind(&self) -> Kind {
        match self {
            fingerprint::FingerprintError::Io { .. } => Kind::Io,
            _ => Kind::InvalidInput,
        }
    }
}

impl StoreError for fingerprint::Stale {
    fn kind(&self) -> Kind {
        Kind::Stale
    }
}

impl StoreError for cache_facade::FacadeError {
    fn kind(&self) -> Kind {
        use cache_facade::FacadeError as E;
        match self {
            E::Segment(e) => e.kind(),
            E::Memmap(e) => e.kind(),
            E::Shard(e) => e.kind(),
            E::Page(e) => e.kind(),
            E::Remote(e) => e.kind(),
            E::Fingerprint(e) => e.kind(),
            E::Stale { .. } => Kind::Stale,
            E::Io { .. } | E::MissingRoot(_) => Kind::Io,
            E::Unsupported { .. } => Kind::ReadOnly,
            E::InUse { .. } => Kind::Locked,
            E::Config(_)
            | E::MissingIds { .. }
            | E::EmptyId { .. }
            | E::ComputeCount { .. }
            | E::KindMismatch { .. }
            | E::IndexOutOfRange { .. }
            | E::BadValue { .. } => Kind::InvalidInput,
            _ => Kind::Other,
        }
    }

    fn into_py_err(self) -> PyErr {
        use cache_facade::FacadeError as E;
        match self {
            E::Segment(e) => e.into_py_err(),
            E::Memmap(e) => e.into_py_err(),
            E::Shard(e) => e.into_py_err(),
            E::Page(e) => e.into_py_err(),
            E::Remote(e) => e.into_py_err(),
            // A failure of the wrapped Python function comes back as the
            // function's own exception.
            E::Compute(source) => match source.downcast::<PyErr>() {
                Ok(py_err) => *py_err,
                Err(other) => raise(Kind::Other, format!("compute failed: {other}")),
            },
            e => raise(e.kind(), e.to_string()),
        }
    }
}

impl StoreError for durable_fs::Error {
    fn kind(&self) -> Kind {
        use durable_fs::Error as E;
        match self {
            E::Locked { .. } | E::LockTimeout { .. } => Kind::Locked,
            E::TooLarge { .. } => Kind::Corrupt,
            _ => Kind::Io,
        }
    }
}

impl StoreError for remote_cache::Error {
    fn kind(&self) -> Kind {
        use remote_cache::Error as E;
        match self {
            E::Tier(e) => tier_kind(e),
            E::Local(e) => e.kind(),
            E::Io { .. } => Kind::Io,
            E::Corrupt { .. } => Kind::Corrupt,
            E::Busy { .. } | E::Conflict { .. } => Kind::Locked,
            E::BadLocation { .. } => Kind::InvalidInput,
            E::Segment(e) => e.kind(),
            E::Shard(e) => e.kind(),
            E::Array(e) => e.kind(),
            E::Page(e) => e.kind(),
            _ => Kind::Other,
        }
    }

    fn into_py_err(self) -> PyErr {
        use remote_cache::Error as E;
        match self {
            // The store's own class and message (a shard index past the
            // end is an IndexError, as on a list).
            E::Segment(e) => e.into_py_err(),
            E::Shard(e) => e.into_py_err(),
            E::Array(e) => e.into_py_err(),
            E::Page(e) => e.into_py_err(),
            e => raise(e.kind(), e.to_string()),
        }
    }
}

/// The class of an object-store or local-tier failure: a request the
/// server refused or never answered is I/O, as a failed local read is.
fn tier_kind(e: &remote_tier::Error) -> Kind {
    use remote_tier::Error as E;
    match e {
        E::BadUrl { .. } | E::BadOption { .. } | E::BadName { .. } => Kind::InvalidInput,
        E::Corrupt { .. } | E::BlockMismatch(_) | E::OutOfRange { .. } | E::TooLarge { .. } => {
            Kind::Corrupt
        }
        E::CommitTaken { .. } => Kind::Locked,
        E::Local(e) => e.kind(),
        // An argument the tier refused (a plan's positions).
        E::Io { source, .. } if source.kind() == std::io::ErrorKind::InvalidInput => {
            Kind::InvalidInput
        }
        E::Unsupported { .. } | E::ConditionalPutIgnored { .. } => Kind::Other,
        _ => Kind::Io,
    }
}
