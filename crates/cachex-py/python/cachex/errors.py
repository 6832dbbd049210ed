"""The exceptions every cachex call raises.

All of them derive from :class:`CacheError`, so ``except cachex.CacheError``
catches anything a store reports. Each message is the store's own: it names
the file concerned and what is wrong with it.
"""

from __future__ import annotations

__all__ = [
    "CacheError",
    "CacheIOError",
    "CorruptError",
    "ForkedWriterError",
    "InvalidInputError",
    "LockedError",
    "ReadOnlyError",
    "SchemaMismatchError",
    "StaleError",
    "WorkerError",
]


class CacheError(Exception):
    """Base class of every error a cachex store raises."""


class CacheIOError(CacheError, OSError):
    """An operating-system call (open, read, write, fsync, rename) failed on a file."""


class CorruptError(CacheError):
    """A file of the cache is damaged: bad magic, checksum, offset or length."""


class LockedError(CacheError):
    """Another writer (in this or another process) holds the cache's writer lock."""


class SchemaMismatchError(CacheError, ValueError):
    """A value does not match the cache's schema (dtype, shape, field names).

    Nothing of the batch that held it was written.
    """


class InvalidInputError(CacheError, ValueError):
    """An argument is unusable: an unsupported dtype, a bad option, a key out of range."""


class ReadOnlyError(CacheError):
    """The cache was opened read-only (or by a non-writer rank) and the call needs the writer."""


class ForkedWriterError(ReadOnlyError):
    """A writer opened before a fork was used in the forked child (e.g. a DataLoader worker).

    The parent keeps the writer (its lock, buffered rows and file); nothing was written.
    """


class StaleError(CacheError):
    """A cache was built from another configuration or other source files.

    The message says why: which config field, which file, which version.
    """


class WorkerError(CacheError, RuntimeError):
    """A DataLoader worker died, or could not hand a batch over: it waited
    past its timeout for the loop to release a batch slot, or its main
    process was gone. The message names the worker and what it waited for."""
