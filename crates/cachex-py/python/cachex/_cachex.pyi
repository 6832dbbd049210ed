"""Type stubs of the native module ``cachex._cachex`` (Rust, via pyo3)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

__version__: str

ArrayLike: TypeAlias = npt.ArrayLike
Part: TypeAlias = np.ndarray | bytes
Value: TypeAlias = np.ndarray | bytes | dict[str, Part] | tuple[Part, ...] | list[Part]
"""A record: one tensor, named parts, a tuple or list of parts, or one blob."""

def bfloat16_is_native() -> bool:
    """Whether bfloat16 tensors come back as ``ml_dtypes.bfloat16``.

    Returns
    -------
    bool
        True when ``ml_dtypes`` is importable; otherwise bfloat16 tensors
        come back as raw ``uint16`` arrays (same bits) and the store's
        schema (``inspect()["schema_json"]``) names their dtype.
    """

class MappedValue:
    """The ``.base`` of arrays read from a store: it owns the value they view.

    Holding any of those arrays keeps it, and so the mapped file region,
    alive. It has no Python-visible API.
    """

class SegmentStore:
    """A persistent key -> tensor-record cache (torchcachex's on-disk layout).

    Values are a single array, a dict of named arrays/bytes, a tuple or list
    of arrays/bytes, or one ``bytes`` blob. The first value fixes the
    cache's schema (structure, names, dtypes, ranks); later values must
    match it. Every numpy dtype a cache stores round-trips exactly: bool,
    (u)int8/16/32/64, float16/32/64, and bfloat16 (``ml_dtypes``).

    Parameters
    ----------
    path : str or os.PathLike
        The cache directory (created if missing).
    flush_every : int, optional
        Pending records that trigger a flush into a new segment (4096).
    lru_bytes : int, optional
        Byte budget of the in-memory LRU of records; 0 disables it (64 MiB).
    async_write : bool, optional
        Write segments on a background thread (False). Its errors are
        raised by the next call or by :meth:`flush`.
    queue_depth : int, optional
        Flushes that may wait for the background thread (2).
    writer_rank : int, optional
        The distributed rank that persists (0).
    current_rank : int, optional
        This process's rank (default: the ``RANK`` environment variable, else 0).
    read_only : bool, optional
        Open without the writer lock; puts are refused (False).

    Raises
    ------
    LockedError
        Another writer holds the cache's lock.
    CacheIOError
        The directory cannot be created or read.

    Notes
    -----
    A handle pickles as its path and options; the unpickled copy reopens
    the directory **read-only** (the writer lock stays with the process
    that took it), which is what a DataLoader worker needs.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        flush_every: int | None = None,
        lru_bytes: int | None = None,
        async_write: bool | None = None,
        queue_depth: int | None = None,
        writer_rank: int | None = None,
        current_rank: int | None = None,
        read_only: bool | None = None,
    ) -> None: ...
    @property
    def path(self) -> str:
        """The cache directory."""
    @property
    def options(self) -> dict[str, Any]:
        """The options the store was opened with (keyword arguments of the constructor)."""
    @property
    def is_writer(self) -> bool:
        """Whether this handle persists puts (writer rank and not read-only)."""
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
    def put_batch(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Add (or replace) values by key.

        Parameters
        ----------
        items : mapping or iterable of (key, value) pairs
            Keys are ``str``. A value is ``bytes``/``bytearray`` (a blob), a
            ``dict`` of str -> array/bytes, a ``tuple`` or ``list`` of
            arrays/bytes, or any array-like (numpy array, buffer-protocol
            object, object with ``__array__`` such as a CPU torch tensor).
            Arrays are copied; the caller may reuse them after the call.

        Raises
        ------
        SchemaMismatchError
            A value does not match the cache's schema. Nothing of the batch
            is written.
        InvalidInputError
            A key is not ``str`` or a value has a dtype a cache cannot store.
        ReadOnlyError
            The store was opened read-only.
        """
    def get_batch(self, keys: Sequence[str]) -> tuple[list[Value | None], list[int]]:
        """Look up values by key.

        Parameters
        ----------
        keys : sequence of str

        Returns
        -------
        values : list
            One entry per key, in order: the value (arrays are read-only
            zero-copy views of the mapped segment) or ``None`` when missing.
        missing : list of int
            The positions in ``keys`` that were not found.
        """
    def get(self, key: str) -> Value | None:
        """The value of one key, or ``None``."""
    def __contains__(self, key: str) -> bool: ...
    def flush(self) -> None:
        """Write every pending value into a new durable segment."""
    def __len__(self) -> int:
        """Distinct keys, persisted and pending."""
    def stats(self) -> dict[str, int | float]:
        """Counters: entries, segments, pending, LRU use and hits, index size."""
    def compact(self) -> dict[str, int]:
        """Rewrite the segments without dead rows.

        Returns
        -------
        dict
            ``segments_before``, ``segments_after``, ``live_rows``, ``dropped_rows``.
        """
    def verify(self) -> list[dict[str, str]]:
        """Check every segment and index entry on disk now.

        Returns
        -------
        list of dict
            One ``{"path", "kind", "detail"}`` per problem; empty when sound.
        """
    def problems(self) -> list[dict[str, str]]:
        """What recovery found (and repaired or excluded) when the store was opened."""
    def inspect(self) -> dict[str, Any]:
        """Structure, schema JSON, entries, segments and sizes on disk."""
    def close(self) -> None:
        """Flush (writer) and release the files and the writer lock.

        Arrays already returned stay valid.
        """
    def __enter__(self) -> SegmentStore: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...
