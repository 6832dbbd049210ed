//! Store errors as exceptions of the `cachex.errors` hierarchy.
//!
//! The classes are defined in Python (`python/cachex/errors.py`, where they
//! can inherit from `ValueError`/`OSError` too); this module looks each up
//! once and raises it with the store's own message.

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
}

impl Kind {
    const ALL: [Kind; 9] = [
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
        }
    }
}

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn class(py: Python<'_>, kind: Kind) -> PyResult<Bound<'_, PyType>> {
    let classes = CLASSES.get_or_try_init(py, || {
        let module = py.import("cachex.errors")?;
        Kind::ALL
            .iter()
            .map(|k| {
                Ok(module
                    .getattr(k.class_name())?
                    .cast_into::<PyType>()?
                    .unbind())
            })
            .collect::<PyResult<Vec<_>>>()
    })?;
    // ALL lists every variant in declaration order.
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

/// A store error as its `cachex.errors` exception: the message is the
/// error's `Display` (which names the file and the problem).
pub fn segment(e: segment_store::Error) -> PyErr {
    use segment_store::Error as E;
    let kind = match &e {
        E::Io { .. } => Kind::Io,
        E::Locked { .. } => Kind::Locked,
        E::CorruptSegment { .. } | E::Tensor { .. } => Kind::Corrupt,
        E::SchemaMismatch { .. } => Kind::SchemaMismatch,
        E::InvalidInput(_) => Kind::InvalidInput,
        E::ReadOnly { .. } => Kind::ReadOnly,
        E::Background { source, .. } => return segment_background(&e, source),
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}

/// A failed background flush is raised as the class of its cause.
fn segment_background(e: &segment_store::Error, source: &segment_store::Error) -> PyErr {
    let kind = match source {
        segment_store::Error::Io { .. } => Kind::Io,
        segment_store::Error::Locked { .. } => Kind::Locked,
        segment_store::Error::CorruptSegment { .. } => Kind::Corrupt,
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}
