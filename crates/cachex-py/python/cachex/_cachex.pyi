"""Type stubs of the native module ``cachex._cachex`` (Rust, via pyo3)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias, TypedDict, final

import numpy as np
import numpy.typing as npt
from typing_extensions import Self

__version__: str

ArrayLike: TypeAlias = npt.ArrayLike
Part: TypeAlias = np.ndarray | bytes
Value: TypeAlias = np.ndarray | bytes | dict[str, Part] | tuple[Part, ...] | list[Part]
"""A record: one tensor, named parts, a tuple or list of parts, or one blob."""

class Problem(TypedDict):
    """One thing wrong with one file, as ``cachex verify --json`` prints it."""

    path: str
    kind: str
    """``missing``, ``truncated``, ``checksum-mismatch``, ``structure``,
    ``stale``, ``foreign-version``, ``unindexed``, ``interrupted`` or ``io``."""
    detail: str

class VerifyReport(TypedDict):
    """What ``verify()`` returns: ``cachex verify --json``'s object."""

    kind: str
    """The kind of cache: ``segment-store``, ``shard-store``,
    ``memmap-array``, ``page-alloc`` or ``beton``."""
    path: str
    problems: list[Problem]
    """Empty when the cache is sound."""

Summary: TypeAlias = dict[str, Any]
"""What ``inspect()`` returns: ``cachex inspect --json``'s object (``kind``,
``path``, the store's facts, and each table as a list of row dicts)."""

def bfloat16_is_native() -> bool:
    """Whether bfloat16 tensors come back as ``ml_dtypes.bfloat16``.

    Returns
    -------
    bool
        True when ``ml_dtypes`` is importable; otherwise bfloat16 tensors
        come back as raw ``uint16`` arrays (same bits) and the store's
        schema (``inspect()["schema"]``) names their dtype.
    """

@final
class MappedValue:
    """The ``.base`` of arrays read from a store: it owns the value they view.

    Holding any of those arrays keeps it, and so the mapped file region,
    alive. It has no Python-visible API.
    """

@final
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
        The cache directory (created if missing), or a URL (``s3://bucket/
        prefix``, ``gs://``, ``az://``, ``file://``): the store then opens a
        working directory of its own over the machine's local tier; the
        writer publishes on :meth:`flush` / :meth:`close`, a reader sees
        what was published since it opened after :meth:`refresh`.
    flush_every : int, optional
        Pending records that trigger a flush into a new segment (4096).
    lru_bytes : int, optional
        Byte budget of the in-memory LRU of records read from segments (on
        a rank that does not persist, also of those it puts); 0 disables
        it (64 MiB).
    async_write : bool, optional
        Build and write segments on a background thread (False). Without
        it, the call that fills a segment writes it and the thread only
        makes it durable while the caller goes on. Errors there are raised
        by the next call or by :meth:`flush`.
    queue_depth : int, optional
        Flushes that may wait for the background thread (2).
    writer_rank : int, optional
        The distributed rank that persists (0).
    current_rank : int, optional
        This process's rank (default: the ``RANK`` environment variable, else 0).
    read_only : bool, optional
        Open without the writer lock; puts are refused (False).
    writer_id : int, optional
        Write beside other writers as writer ``writer_id``.
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Raises
    ------
    LockedError
        Another writer holds the cache's lock.
    CacheIOError
        The directory cannot be created or read (or the object store failed).

    Notes
    -----
    A handle pickles as its path (or URL) and options; the unpickled copy
    reopens the cache **read-only** (the writer lock stays with the process
    that took it), which is what a DataLoader worker needs.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        flush_every: int | None = None,
        lru_bytes: int | None = None,
        async_write: bool | None = None,
        queue_depth: int | None = None,
        writer_rank: int | None = None,
        current_rank: int | None = None,
        read_only: bool | None = None,
        writer_id: int | None = None,
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path:
        """The directory read and written: the cache directory, or for a URL
        the working directory over the local tier."""
    @property
    def url(self) -> str | None:
        """The URL the store was opened on, without credentials (None for a directory)."""
    def refresh(self) -> dict[str, int]:
        """Make what other writers published (or flushed) since visible.

        Returns
        -------
        dict
            ``commits`` applied (0 for a directory) and ``segments`` gained.
        """
    def prefetch(self, keys: Sequence[str]) -> Prefetch:
        """Fetch the segments holding ``keys`` into the local tier in the
        background, whole, in the order the keys first need them; returns at
        once (a done :class:`Prefetch` for a directory)."""
    def segment_ids(self, keys: Sequence[str]) -> np.ndarray:
        """The id of the segment holding each of ``keys`` (int64, -1 for a key
        in no segment), from the index alone: nothing is read or fetched."""
    def set_plan(
        self, keys: Sequence[str], positions: npt.NDArray[np.int64], epoch_len: int
    ) -> PlanHandle | None:
        """Register this reader's plan of reads with the local tier.

        The record of ``keys[j]`` is read at batch ``positions[j]`` of this
        reader's clock: ``0..epoch_len`` is this epoch, ``epoch_len..2 *
        epoch_len`` the next (an int64 array as long as ``keys``). One plan
        covers every segment the keys lie in; the tier then evicts, in
        every process of the machine, the blocks needed furthest ahead
        first. ``None`` for a directory, or when the whole store fits the
        tier's budget (its segments are then mapped whole: nothing a plan
        could keep). Keys in no segment are left out; raises
        :class:`InvalidInputError` for a position out of range.
        """
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
    def get_batch(self, keys: Sequence[str], copy: bool = False) -> tuple[list[Any], list[int]]:
        """Look up values by key.

        Parameters
        ----------
        keys : sequence of str
        copy : bool
            False: arrays are read-only zero-copy views of the mapped
            segment. True: writable arrays that own a copy of their bytes.

        Returns
        -------
        values : list
            One entry per key, in order: the value or ``None`` when missing.
        missing : list of int
            The positions in ``keys`` that were not found.
        """
    def get_stacked(self, keys: Sequence[str]) -> tuple[Any, list[int]]:
        """Look up a batch as stacked arrays: one copy, no object per value.

        Parameters
        ----------
        keys : sequence of str

        Returns
        -------
        value
            ``None`` when no key is found. Otherwise shaped like one value
            with a leading batch axis: an array ``(len(keys), *shape)`` for
            a single-array cache; a dict / tuple / list of such arrays for
            the other structures; a ``bytes`` part becomes a list of
            ``bytes`` (``None`` where missing). Arrays are fresh and
            writable; rows of missing keys are zero.
        missing : list of int
            The positions in ``keys`` that were not found.

        Raises
        ------
        InvalidInputError
            The found values differ in shape (read them with :meth:`get_batch`).
        """
    def get(self, key: str) -> Any:
        """The value of one key, or ``None``."""
    def __contains__(self, key: str, /) -> bool: ...
    def flush(self) -> None:
        """Write every pending value into a new durable segment; on a URL,
        then publish what was written since the last publish (one commit)."""
    def __len__(self) -> int:
        """Distinct keys, persisted and pending."""
    def key_locations(self) -> list[tuple[str, int, int]]:
        """Every key the index holds with where its row is, ``(key, segment
        id, row)`` by segment and row (pending rows once flushed)."""
    def stats(self) -> dict[str, int | float]:
        """Counters: entries, segments, pending, LRU use and hits, index size."""
    def compact(self) -> dict[str, int]:
        """Rewrite the segments without dead rows.

        Returns
        -------
        dict
            ``segments_before``, ``segments_after``, ``live_rows``, ``dropped_rows``.
        """
    def verify(self) -> VerifyReport:
        """Check every segment and index entry on disk now.

        Returns
        -------
        VerifyReport
            ``cachex verify --json``'s object: ``{"kind": "segment-store",
            "path", "problems": [{"path", "kind", "detail"}, ...]}``,
            ``problems`` empty when sound.
        """
    def problems(self) -> list[Problem]:
        """What recovery found (and repaired or excluded) when the store was opened."""
    def inspect(self) -> Summary:
        """``cachex inspect --json``'s object: structure, entries, sizes, schema, segments."""
    def close(self) -> None:
        """Flush (and on a URL publish: writer) and release the files and the writer lock.

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

DTypeLike: TypeAlias = str | type | np.dtype[Any]
ArraySpecs: TypeAlias = Mapping[str, tuple[DTypeLike, Sequence[int]]]
"""``{name: (dtype, shape)}``: each array's element type and per-row shape."""

@final
class MemmapWriter:
    """The streaming, resumable writer of a memmap-array cache.

    One ``<name>.bin`` per array (row-major, little-endian: readable with
    ``numpy.memmap``), committed in groups to ``manifest.jsonl``; on reopen
    an unfinished cache resumes after its last committed row.

    Parameters
    ----------
    path : str or os.PathLike
        The cache directory (created if missing), or a URL: the cache is
        then written in a working directory over the local tier and
        published by :meth:`finalize`.
    arrays : dict
        ``{name: (dtype, shape)}``.
    nullable : sequence of str, optional
        Arrays a row may lack (written as ``None``).
    sidecars : sequence of str, optional
        Names of per-row strings stored deduplicated.
    fingerprint : JSON-able, optional
        What the cache is built from; a resume with another one is refused.
    sync_every : int, optional
        Rows per group commit (1024); 0 commits only on flush/finalize.
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Raises
    ------
    LockedError
        Another writer is building this cache.
    SchemaMismatchError
        A half-built cache there was started with another schema.
    StaleError
        A half-built cache there was started with another fingerprint.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        arrays: ArraySpecs,
        *,
        nullable: Sequence[str] = ...,
        sidecars: Sequence[str] = ...,
        fingerprint: Any = None,
        sync_every: int = ...,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path: ...
    @property
    def url(self) -> str | None:
        """The URL written, without credentials (None for a directory)."""
    @property
    def resume_keys(self) -> list[str]:
        """Sources committed by an earlier writer: skip them when resuming."""
    @property
    def rows(self) -> int:
        """Rows written (committed or not)."""
    @property
    def committed_rows(self) -> int:
        """Rows durably committed."""
    @property
    def schema(self) -> dict[str, Any]:
        """``{"arrays": {name: {"dtype", "shape", "nullable"}}, "sidecars": [...]}``."""
    def write(
        self,
        source: str,
        arrays: Mapping[str, ArrayLike | None],
        sidecars: Mapping[str, str] | None = None,
        meta: Any = None,
    ) -> None:
        """Append one row.

        Parameters
        ----------
        source : str
            The row's source id (what ``resume_keys`` returns).
        arrays : dict
            One array-like per schema array (``None`` for a nullable one).
        sidecars : dict, optional
            Sidecar strings of the row.
        meta : str or JSON-able, optional
            Row metadata, stored as JSON.

        Raises
        ------
        InvalidInputError
            A wrong shape or dtype, or a missing array; nothing is written.
        """
    def flush(self) -> None:
        """Commit every row written so far."""
    def finalize(self) -> int:
        """Write the index, sidecars and ``shapes.json``; mark complete (on a URL,
        publish); return the rows."""

@final
class MemmapArray:
    """A finished memmap-array cache, open for reading.

    Parameters
    ----------
    path : str or os.PathLike
        The cache directory, or a URL: the ``.bin`` arrays are then read
        through the machine's local tier by the blocks the rows read lie in.
    load_in_memory : bool, optional
        Copy every array into RAM at open (a local cache only).
    ram_fraction : float, optional
        The share of physical RAM a load may take (refused above it with
        :class:`InvalidInputError`).
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Raises
    ------
    CorruptError
        A file is damaged (a ``.bin`` of the wrong size, a bad index).
    CacheError
        The cache is incomplete (no ``_COMPLETE``).

    Notes
    -----
    Pickles as its path (or URL) and load options; the copy reopens the
    cache. In a forked child the handle reopens the cache on first use.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        load_in_memory: bool = False,
        ram_fraction: float = ...,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path: ...
    @property
    def url(self) -> str | None:
        """The URL the cache was opened on, without credentials (None for a directory)."""
    def refresh(self) -> None:
        """Open the cache again as published now (arrays returned before keep the old one)."""
    def __len__(self) -> int: ...
    @property
    def schema(self) -> dict[str, Any]: ...
    @property
    def fingerprint(self) -> Any:
        """``fingerprint.json``, parsed."""
    @property
    def in_memory(self) -> bool:
        """Whether the arrays are read from RAM (``load_in_memory``)."""
    def load_in_memory(self, ram_fraction: float = ...) -> None:
        """Copy every array into RAM and read from there from now on.

        Raises
        ------
        InvalidInputError
            The arrays exceed ``ram_fraction`` of physical RAM (nothing changed).
        """
    def get_row(self, i: int) -> dict[str, np.ndarray | None]:
        """Row ``i`` (negative from the end): read-only views of every array."""
    def fill_batch(
        self, indices: Sequence[int], out: Mapping[str, np.ndarray]
    ) -> dict[str, list[bool]]:
        """Copy rows into preallocated buffers with the GIL released.

        Parameters
        ----------
        indices : sequence of int
            Rows (negative from the end).
        out : dict
            Array name -> writable C-contiguous array of the array's dtype
            and shape ``(n, *shape)``, ``n >= len(indices)``.

        Returns
        -------
        dict
            For each nullable array in ``out``: which rows were present
            (absent ones are zero-filled).
        """
    def get(self, i: int, name: str) -> np.ndarray | None:
        """Array ``name`` of row ``i``."""
    def source(self, i: int) -> str: ...
    def meta(self, i: int) -> Any: ...
    def sidecar(self, name: str, i: int) -> str | None: ...
    def sidecar_values(self, name: str) -> list[str]: ...
    def find(self, source: str) -> int | None:
        """The row of a source id, or ``None``."""
    def prefetch(self, rows: int | Sequence[int]) -> Prefetch:
        """Warm rows ``rows`` in that order (the next epoch's); returns at once.

        On a URL their blocks are fetched into the local tier in the
        background, within its budget; on a local cache the kernel reads
        them ahead and the :class:`Prefetch` is already done (counts zero).
        """
    def index(self) -> list[dict[str, Any]]:
        """Every row's ``{"row", "source", "meta", "sidecars"}``.

        See :meth:`index_table` for the same as a ``pyarrow.Table``.
        """
    def index_table(self) -> Any:
        """``index.parquet`` as a ``pyarrow.Table`` (requires pyarrow)."""
    def verify(self) -> VerifyReport:
        """``cachex verify --json``'s object for this cache (reads every file)."""
    def inspect(self) -> Summary:
        """``cachex inspect --json``'s object for this cache."""

def memmap_open_or_build(
    root: str | os.PathLike[str],
    name: str,
    config: Any,
    build: Callable[[MemmapWriter], None],
    arrays: ArraySpecs,
    *,
    nullable: Sequence[str] = ...,
    sidecars: Sequence[str] = ...,
    sources: Sequence[str | os.PathLike[str]] = ...,
    content_hash: bool = False,
    sync_every: int = ...,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, str | bool | int | float] | None = None,
) -> tuple[MemmapArray, str]:
    """Open the cache ``name`` of ``config`` under ``root``, building it when needed.

    ``root`` may be a URL (with the tier keywords of :class:`MemmapArray`):
    a cache published at ``<root>/<name>/<key>`` is a hit, read through the
    local tier; one built here is published (``sources`` are then stamped
    relative to the current directory).

    The cache lives in ``root/<name>/<key of backend, name, config>``, the
    directory :func:`open` uses for a memmap-array config with the same
    name and options, so a cache built either way is found the other. It is opened when
    complete and its fingerprint (config, ``sources`` stamps, format
    version) matches; resumed when half-built; deleted and rebuilt when
    stale. ``build(writer)`` writes every row whose source is not in
    ``writer.resume_keys``; the cache is finalized when it returns.

    Returns
    -------
    cache : MemmapArray
    outcome : str
        ``"cache hit"``, ``"cache built"``, ``"cache resumed after N
        committed rows"`` or ``"cache rebuilt (<why>)"``.
    """

FieldSpec: TypeAlias = str | tuple[DTypeLike, Sequence[int]]
"""``"int"``, ``"float"``, ``"bytes"`` (``"json"`` for .beton) or ``(dtype, shape)``."""

@final
class PageWriter:
    """The writer of a page file: samples of fixed fields packed into pages.

    Parameters
    ----------
    path : str or os.PathLike
        The file (written as ``<path>.tmp``, renamed on finalize), or a URL
        naming the file under a prefix (``s3://bucket/prefix/data.pages``),
        published by :meth:`finalize`.
    fields : dict
        ``{name: "int" | "float" | "bytes" | (dtype, shape)}``.
    page_size : int, optional
        A power of two from 4 KiB (64 KiB). On a URL a reader fetches a
        sample's whole page (or the pages of a sample larger than one)
        before reading it, so a page of a few samples keeps a random read
        near the sample's own bytes; larger pages waste less of their tail
        and suit reads in file order.
    alignment : int, optional
        Allocation alignment (512).
    direct_io : bool, optional
        Write pages with ``O_DIRECT`` where possible.
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.
    tier_block_size : int, optional
        For a URL: the block its readers' tiers fetch and check the file
        in, a power of two from 4 KiB to 16 KiB (16 KiB, a quarter of a
        default page). A block larger than a page makes a read fetch the
        page's neighbours too: give smaller pages' size. Each block costs
        a request to warm (prefetch) and a hash in the commit record (a
        file of more blocks than a commit lists gets blocks twice as
        large, as often as it takes).
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        fields: Mapping[str, FieldSpec],
        *,
        page_size: int | None = None,
        alignment: int | None = None,
        direct_io: bool = False,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
        tier_block_size: int | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path:
        """The file written (for a URL, in the writer's working directory)."""
    @property
    def url(self) -> str | None:
        """The URL written, without credentials (None for a local file)."""
    def __len__(self) -> int: ...
    def append(self, sample: Mapping[str, Any] | Sequence[Any]) -> int:
        """Append one sample (by field name, or in field order); return its index."""
    def write_many(
        self, samples: Iterable[Mapping[str, Any] | Sequence[Any]], threads: int = 2
    ) -> None:
        """Append many samples, filling pages from ``threads`` threads."""
    def finalize(self) -> dict[str, Any]:
        """Write the tables and footer, fsync, rename (on a URL, publish); return a summary."""

@final
class PageReader:
    """A validated, memory-mapped page file.

    Parameters
    ----------
    path : str or os.PathLike
        The file, or a URL naming it under a prefix
        (``s3://bucket/prefix/data.pages``): its pages are then fetched into
        the machine's local tier as their samples are read, one copy shared
        by every process (DataLoader workers too).
    populate : bool, optional
        Read the file into the page cache at open (a local file).
    verify_pages : bool, optional
        Check every page checksum at open (a local file).
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Notes
    -----
    Pickles as its path (or URL) and options; the copy reopens the file. In
    a forked child the handle reopens the file on first use.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        populate: bool = False,
        verify_pages: bool = False,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path:
        """The file read (for a URL, its link in the working directory)."""
    @property
    def url(self) -> str | None:
        """The URL the file was opened on, without credentials (None for a local file)."""
    def refresh(self) -> None:
        """Open the file again as published now (arrays returned before keep the old one)."""
    def __len__(self) -> int: ...
    @property
    def fields(self) -> dict[str, FieldSpec]: ...
    @property
    def max_sizes(self) -> dict[str, int]:
        """The largest value of each field in bytes (the width ``fill_batch`` needs)."""
    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i``: ints/floats by value, bytes and arrays as read-only views."""
    def fill_batch(
        self,
        indices: Sequence[int],
        out: Mapping[str, np.ndarray | tuple[np.ndarray, np.ndarray]],
    ) -> dict[str, list[int] | int]:
        """Copy samples into preallocated buffers with the GIL released.

        Parameters
        ----------
        indices : sequence of int
        out : dict
            Field name -> writable C-contiguous array with at least
            ``len(indices)`` rows: int64 (ints), float64 (floats), the
            field's dtype and ``(n, *shape)`` (arrays), uint8 ``(n, width)``
            (bytes, zero padded); or for a bytes field a ragged pair
            ``(values, offsets)`` (a :class:`cachex.Ragged`): uint8 1-D
            values, int64 offsets of at least ``len(indices) + 1``.

        Returns
        -------
        dict
            The byte length of each padded bytes field's values (a list),
            each ragged pair's total bytes (an int). A total larger than
            the pair's values buffer: only the offsets were written (and
            nothing else of the batch); grow the buffer and call again.
        """
    def prefetch(self, indices: Sequence[int]) -> Prefetch:
        """Warm the pages of samples ``indices`` in that order (the next epoch's); returns at once.

        On a URL the pages are fetched into the local tier in the
        background, within its budget; on a local file the kernel reads
        them ahead (``madvise(WILLNEED)``) and the :class:`Prefetch` is
        already done (counts zero).
        """
    def set_plan(
        self, samples: npt.NDArray[np.int64], positions: npt.NDArray[np.int64], epoch_len: int
    ) -> PlanHandle | None:
        """Register this reader's plan of reads with the local tier.

        Sample ``samples[j]`` is read at batch ``positions[j]`` of this
        reader's clock: ``0..epoch_len`` is this epoch, ``epoch_len..2 *
        epoch_len`` the next (int64 arrays of one length). The tier then
        evicts, in every process of the machine, the pages needed furthest
        ahead first and keeps the nearest. ``None`` for a local file.
        Raises :class:`InvalidInputError` for a sample or position out of
        range.
        """
    def quasi_random_order(
        self, seed: int, window_pages: int = 8, *, share: int = 0, shares: int = 1
    ) -> list[int]:
        """FFCV's QUASI_RANDOM epoch order, or share ``share`` of ``shares`` of it.

        The shares of one seed hold whole pages, are disjoint and together
        hold every sample once (one share per DataLoader worker).
        """
    def page_blocks(self) -> npt.NDArray[np.int64]:
        """The samples of each run of pages, in file order: a plan's blocks."""
    def verify(self) -> VerifyReport:
        """``cachex verify --json``'s object for this file (every page checksum)."""
    def inspect(self) -> Summary:
        """``cachex inspect --json``'s object for this file."""

def verify(path: str | os.PathLike[str]) -> VerifyReport:
    """Everything wrong with the cache or file at ``path``, whatever its kind,
    as ``cachex verify --json`` prints it. Takes a path, not an open store, so
    it also checks what cannot open (a damaged file, a half-built memmap-array
    cache); :class:`InvalidInputError` when ``path`` is no cache cachex knows."""

def tier_stats(tier_dir: str | os.PathLike[str]) -> dict[str, int]:
    """The counters of the local tier at ``tier_dir``, shared by every process
    of the machine: ``allocated``, ``generation``, ``fetched_bytes``,
    ``get_requests``, ``head_requests``, ``evicted_bytes``,
    ``punched_blocks``, ``rebuilds``, ``over_budget``, ``hits``, ``misses``
    (read calls served locally, or that fetched; a tier never opened has
    none: :class:`CacheIOError`)."""

@final
class PlanHandle:
    """A reader's plan registered in the machine's local tier
    (:meth:`PageReader.set_plan`): while open, the tier evicts the pages
    it needs furthest ahead first. A context manager; closed when dropped.
    """

    def advance(self, position: int) -> None:
        """Move the plan's progress to ``position`` (batches read so far)."""
    def close(self) -> None:
        """Remove the plan (closing twice does nothing)."""
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
    @property
    def path(self) -> Path:
        """The plan record (``<tier_dir>/plans/<token>.plan``)."""
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

@final
class Prefetch:
    """Blocks being fetched into the local tier in the background, in the
    order asked for (the next epoch's), within the tier's budget.

    ``PageReader.prefetch`` and ``MemmapArray.prefetch`` return one; on a
    local file it is done at once, every count zero. The fill goes on when
    this object is dropped, until done or cancelled; a read meanwhile
    fetches what it needs first. It runs in the process that started it: in
    a forked child, ``wait`` returns at once whether it had ended.
    """

    def wait(self, timeout: float | None = None) -> bool:
        """Wait at most ``timeout`` seconds (None: until done), GIL released; whether it ended."""
    @property
    def done(self) -> bool:
        """Whether the fill ended (all fetched or local, budget reached, or cancelled)."""
    def cancel(self) -> None:
        """Stop after the blocks in flight."""
    @property
    def fetched_blocks(self) -> int:
        """Blocks this fill fetched so far."""
    @property
    def failed_blocks(self) -> int:
        """Blocks whose fetch failed (the reads fetch them again)."""
    @property
    def bytes(self) -> int:
        """Bytes this fill fetched so far."""
    @property
    def total_blocks(self) -> int:
        """Blocks asked for (already local ones included)."""

@final
class ThreadedFill:
    """Native threads filling a ring of preallocated batch buffers with a
    page file's samples, batch by batch in the order given, ahead of the
    loop and without the GIL (what :class:`cachex.torch.ThreadedLoader`
    runs on).

    Batch ``k`` (samples ``indices[offsets[k]:offsets[k + 1]]``) goes into
    slot ``k % len(slots)``. Taking batch ``j`` releases batch ``j - hold``
    (``1 <= hold < len(slots)``): its slot may be refilled from then on;
    the slots of the ``hold`` batches taken last are never written.
    ``slots[s]`` maps field names to
    writable C-contiguous buffers as :meth:`PageReader.fill_batch` takes
    them (every slot the same keys, in order); ``lengths[s]`` maps bytes
    fields to int64 buffers that get each value's length. In a process
    forked after it started, every call raises :class:`CacheError`.
    """

    def __new__(
        cls,
        reader: PageReader,
        indices: npt.NDArray[np.int64],
        offsets: npt.NDArray[np.int64],
        slots: Sequence[Mapping[str, npt.NDArray[Any] | tuple[npt.NDArray[Any], npt.NDArray[Any]]]],
        lengths: Sequence[Mapping[str, npt.NDArray[np.int64]]],
        *,
        threads: int = 2,
        hold: int = 1,
    ) -> Self: ...
    def __len__(self) -> int: ...
    @property
    def depth(self) -> int:
        """The number of slots."""
    def next_batch(self, timeout: float | None = None) -> tuple[int, int] | None:
        """The next batch as ``(slot, rows)`` once filled (``None`` after the last).

        Waits with the GIL released, at most ``timeout`` seconds (``None``:
        until filled), then raises :class:`CacheError`. A failed batch
        raises its error (a :class:`CorruptError` naming the file, ...),
        every call after it (or after :meth:`close`) a :class:`CacheError`.
        """
    def close(self, timeout: float = 10.0) -> bool:
        """Stop the threads after the batches in flight and join them within ``timeout`` s.

        Whether they ended; if not, the buffers are never freed (a thread
        may still write them).
        """
    @property
    def finished(self) -> bool:
        """Whether the threads ended (every batch filled, closed, or a failed batch)."""

@final
class BetonReader:
    """A validated FFCV ``.beton`` file, memory-mapped.

    ``path`` may be a URL naming the file under a prefix
    (``s3://bucket/prefix/data.beton``), with the tier keywords of
    :class:`PageReader`: the file is copied whole into a working directory
    over the local tier first.
    """

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def path(self) -> Path: ...
    @property
    def url(self) -> str | None:
        """The URL the file was opened on, without credentials (None for a local file)."""
    def __len__(self) -> int: ...
    @property
    def fields(self) -> dict[str, FieldSpec]: ...
    def sample(self, i: int) -> dict[str, Any]:
        """Sample ``i``; JSON fields as text, RGB images as ``{mode, width, height, data}``."""
    @property
    def max_sizes(self) -> dict[str, int]:
        """The largest value of each bytes and array field, in bytes (``fill_batch``'s widths)."""
    def fill_batch(
        self,
        indices: Sequence[int],
        out: Mapping[str, np.ndarray | tuple[np.ndarray, np.ndarray]],
    ) -> dict[str, list[int] | int]:
        """Copy samples into preallocated buffers with the GIL released.

        As :meth:`PageReader.fill_batch` (int, float, bytes and array
        fields, bytes padded or as a ragged pair; JSON and images are read
        with :meth:`sample`).
        """
    def sample_pages(self) -> npt.NDArray[np.int64]:
        """The page each sample's stored values lie in (-1: ints and floats only)."""
    def page_blocks(self) -> npt.NDArray[np.int64]:
        """Lengths of the runs of consecutive samples in one page: a plan's blocks."""
    def verify(self) -> VerifyReport:
        """``cachex verify --json``'s object for this file."""
    def inspect(self) -> Summary:
        """``cachex inspect --json``'s object for this file."""
    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]: ...

def write_beton(
    path: str | os.PathLike[str],
    fields: Mapping[str, FieldSpec],
    samples: Iterable[Mapping[str, Any] | Sequence[Any]],
    *,
    page_size: int = ...,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, str | bool | int | float] | None = None,
) -> None:
    """Write an FFCV ``.beton`` (byte-identical to FFCV's one-worker writer).

    ``path`` may be a URL naming the file under a prefix (with the tier
    keywords of :class:`PageReader`): it is written over the local tier,
    then published.
    """

def compute_key(config: Any) -> str:
    """The 16-hex-character key of a JSON-able config (dict order ignored)."""

def compute_fingerprint(
    config: Any,
    sources: Sequence[str | os.PathLike[str]] = ...,
    *,
    root: str | os.PathLike[str] | None = None,
    content_hash: bool = False,
    cache_version: int = 0,
) -> dict[str, Any]:
    """The fingerprint (``fingerprint.json`` content) of a config and its source files."""

def stale_reason(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """Why ``stored`` is stale for ``current`` (config field, file, version), or ``None``."""

def validate(stored: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Raise :class:`StaleError` with the reason when the fingerprints differ."""

def check_dir(path: str | os.PathLike[str], current: Mapping[str, Any]) -> None:
    """Raise :class:`StaleError` when ``path/fingerprint.json`` is missing or differs."""

@final
class Cache:
    """A cache opened from a config by :func:`open`."""

    @property
    def path(self) -> Path: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def backend(self) -> str:
        """The backend's name (``"segment-store"``, ``"memmap-array"``, ...)."""
    def get_batch(self, keys: Sequence[str]) -> tuple[list[Any], list[int]]: ...
    def get_indices(self, indices: Sequence[int]) -> list[Any]:
        """Values by index (negative from the end): memmap-array, shard-store, page-alloc."""
    def put_batch(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None: ...
    def flush(self) -> None:
        """Persist what was put (on a URL root, then publish it)."""
    def refresh(self) -> None:
        """Reopen the cache from its config: it then sees what others published or
        flushed since (a writer flushes first)."""
    def __len__(self) -> int: ...
    def stats(self) -> dict[str, float]: ...

def open(
    config: Mapping[str, Any] | str | os.PathLike[str],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, str | bool | int | float] | None = None,
) -> Cache:
    """Open (or create) the cache a config names.

    Parameters
    ----------
    config : dict or path
        ``{"backend": "segment-store" | "memmap-array" | "shard-store" |
        "page-alloc", "root", "name",
        "options", "sources": {"root", "paths", "content"}, "create_root",
        "on_stale": "error" | "rebuild"}``, or a JSON file holding one.
        The directory is ``root/name/<key of backend, name, options>``.
        A ``root`` may be a URL: the cache is then read through the local
        tier and :meth:`Cache.flush` publishes.
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Raises
    ------
    StaleError
        The sources changed since the cache was built (``on_stale="error"``).
    InvalidInputError
        A bad config (unknown backend or option).
    """

@final
class _CachedFn:
    def __new__(cls, cache: Cache, func: Callable[[list[Any]], Iterable[Any]]) -> Self: ...
    def __call__(self, inputs: list[Any], ids: list[str]) -> list[Any]: ...
    def stats(self) -> dict[str, int]: ...
    def flush(self) -> None: ...

def _reopen_memmap_array(path: str | os.PathLike[str], kwargs: dict[str, Any]) -> MemmapArray: ...
def _reopen_page_reader(path: str | os.PathLike[str], kwargs: dict[str, Any]) -> PageReader: ...
def _reopen_beton_reader(path: str | os.PathLike[str], kwargs: dict[str, Any]) -> BetonReader: ...
def _reopen_segment_store(path: str | os.PathLike[str], kwargs: dict[str, Any]) -> SegmentStore: ...
def _after_fork_in_child() -> None:
    """The ``os.register_at_fork(after_in_child=...)`` hook: marks every live handle."""

def _publish_at_exit() -> None:
    """The ``atexit`` hook and ``multiprocessing`` exit finalizer: the last
    publish of every writer on a URL still open (a second call publishes nothing).

    With the GIL released, all at once, bounded; what failed is a ``RuntimeWarning``.
    """

@final
class ShardStore:
    """Random access to the items of a deterministic iterable (loadit's layout).

    Items are pulled from ``source()`` once, pickled with Python's
    ``pickle`` into ``shards/<start>.<end>.shard.pickle[.zstd]`` files,
    kept decoded in a bounded in-memory cache, and regenerated from the
    source when the disk budget evicted them. Threads and processes may
    share one root: file locks make each shard generated once.

    **Opening a cache unpickles its shards**: only open roots you trust,
    as with ``pickle.load``.

    Parameters
    ----------
    root : str or os.PathLike
        The cache directory, or a URL: shards published there are read
        through the machine's local tier, shards generated here are
        published by :meth:`flush` / :meth:`close`.
    source : callable, optional
        A factory returning a fresh iterable of the same items in the same
        order on every call. Without it only cached items can be read.
    max_shard_length : int or str, optional
        Items per shard, or a size target like ``"64mb"`` (the default).
    max_cache_size : int, optional
        Decoded shards kept in memory (128).
    max_workers : int, optional
        Iterator replays and background workers (1: no background work).
    memory_limit : int, optional
        Disk budget in bytes for the shard files (unlimited).
    compression : {None, "zstd"}, optional
    preload : int, optional
        Shards to load ahead of an access.
    preload_all_async : bool, optional
        Fill the whole cache in the background (needs ``max_workers > 1``).
    length : int, optional
        A known length, used before the true one is discovered.
    info : JSON-able, optional
        Stored in ``metadata.json`` when the root is new.
    tier_dir : str or os.PathLike, optional
        For a URL: the machine's local tier (default ``CACHEX_TIER_DIR``,
        else ``~/.cache/cachex/tier``), shared by every process.
    tier_budget : int or str, optional
        For a URL: the local tier's budget in bytes, or a size such as
        ``"20G"`` (default ``CACHEX_TIER_BUDGET``, else 20 GiB).
    storage_options : dict, optional
        For a URL: ``object_store`` options (``aws_endpoint``,
        ``aws_allow_http``, ``aws_region``, ...). Credentials belong in the
        environment (``AWS_ACCESS_KEY_ID``, ...); none is ever shown.

    Notes
    -----
    An exception raised by the source propagates from the call that drove
    it. A handle pickles as its root, source and options (the source must
    be picklable); the copy reopens the root.
    """

    def __new__(
        cls,
        root: str | os.PathLike[str],
        source: Callable[[], Iterable[Any]] | None = None,
        *,
        max_shard_length: int | str | None = None,
        max_cache_size: int = 128,
        max_workers: int = 1,
        memory_limit: int | None = None,
        compression: str | None = None,
        preload: int | None = None,
        preload_all_async: bool = False,
        length: int | None = None,
        info: Any = None,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: int | str | None = None,
        storage_options: Mapping[str, str | bool | int | float] | None = None,
    ) -> Self: ...
    @property
    def root(self) -> Path:
        """The root directory (for a URL, the working directory over the local tier)."""
    @property
    def url(self) -> str | None:
        """The URL the store was opened on, without credentials (None for a directory)."""
    def flush(self) -> None:
        """On a URL, publish the shards generated since the last publish."""
    def refresh(self) -> int:
        """On a URL, apply what was published since; return the commits applied."""
    def close(self) -> None:
        """Publish (on a URL) and close the store."""
    def __enter__(self) -> ShardStore: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
    @property
    def max_shard_length(self) -> int: ...
    def __len__(self) -> int:
        """The number of items (drives the source to its end when unknown)."""
    def __getitem__(self, index: int | slice, /) -> Any:
        """Item ``index`` (negative from the end), or a list for a slice."""
    def get_many(self, indices: Sequence[int]) -> list[Any]:
        """Items at ``indices``, visiting each shard once in ascending order."""
    @property
    def info(self) -> Any: ...
    def set_info(self, info: Any) -> None: ...
    def all_cached_to_disk(self) -> bool: ...
    def wait_until_all_cached(self) -> None: ...
    @property
    def known_len(self) -> int | None:
        """The length if already known (no work), else ``None``."""
    def load_async(self, indices: Sequence[int]) -> None:
        """Background workers load the shards holding ``indices`` (none without workers)."""
    def shard_files(self) -> list[tuple[Path, int, int, int]]:
        """The shard files on disk by start: ``(path, start, end, bytes)`` each."""
    def disk_bytes(self) -> int:
        """Bytes of the shard files on disk (what ``memory_limit`` bounds)."""
    @property
    def cached_shards(self) -> int:
        """Decoded shards held in memory (at most ``max_cache_size``)."""
    def is_cached(self, start: int) -> bool:
        """Whether the shard starting at ``start`` is decoded in memory."""
    def counters(self) -> dict[str, int]:
        """Cache misses since opening: ``{"memory_misses", "disk_misses"}``."""
    @property
    def preload(self) -> int:
        """Shards the workers load after a foreground access (0: none)."""
    def set_preload(self, shards: int) -> None:
        """Sets :attr:`preload`, from the next access on."""
    def cursors(self) -> list[tuple[int, bool] | None]:
        """The source cursors: ``(items pulled, ended)``, ``None`` if unused."""
    def finalize(self) -> int:
        """Makes the end of the furthest shard on disk the final length (a
        final length is kept); returns the final length."""
    def verify(self) -> VerifyReport:
        """``cachex verify --json``'s object for this root."""
    def inspect(self) -> Summary:
        """``cachex inspect --json``'s object for this root."""

def _reopen_shard_store(
    root: str | os.PathLike[str], source: Callable[[], Iterable[Any]] | None, kwargs: dict[str, Any]
) -> ShardStore: ...

# The index arithmetic of shard-store's sequence utilities (used by
# cachex.loadit.util; one copy of the math, in Rust).
@final
class InterleaveIndex:
    """Round-robin placement over parts of the given lengths."""

    def __new__(cls, lens: Sequence[int]) -> Self: ...
    def __len__(self) -> int: ...
    def locate(self, index: int) -> tuple[int, int]:
        """``(part, offset)`` of item ``index``; IndexError past the end."""

def chunk_shuffle_indices(chunk_size: int, length: int, seed: int) -> np.ndarray:
    """The permutation of ``chunk_shuffle`` (int64), identical to Rust's for a seed."""

def block_shuffle_indices(blocks: np.ndarray, seed: int) -> np.ndarray:
    """A block-shuffled permutation (int64) of ``0..sum(blocks)``: the blocks in
    a random order, the indices within each shuffled; the same for a seed on
    every platform. A negative size raises ``InvalidInputError``."""

def concat_locate(known: Sequence[int | None], index: int) -> tuple[int, int, bool] | None:
    """``(part, offset, probe)`` of item ``index`` of a concatenation, or ``None`` past the end."""

def repeat_index(index: int, len: int, times: int | None = None) -> int | None:
    """The item of the repeated sequence that item ``index`` is, or ``None`` past the end."""

# Two-step publishing to a cache URL (cachex.ray's sinks): pieces are
# JSON text; see crates/cachex-py/src/staged.rs.
def _staged_upload(
    url: str,
    kind: str,
    files: Sequence[tuple[str, str | os.PathLike[str]]],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Upload ``(path in the cache, local file)`` pairs as objects; no commit."""

def _staged_state(
    url: str,
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[int, dict[str, list[str]]]:
    """The log's last commit number and each file's pieces."""

def _staged_read(
    url: str,
    path: str,
    pieces: Sequence[str],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> bytes:
    """The bytes of ``path`` made of ``pieces``, fetched and checked."""

def _staged_fetch(
    url: str,
    path: str,
    pieces: Sequence[str],
    dest: str | os.PathLike[str],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> int:
    """Write ``path``, made of ``pieces``, into the local file ``dest``, checked."""

def _staged_commit(
    url: str,
    after: int,
    pieces: Sequence[str],
    removed: Sequence[str],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> int | None:
    """Publish ``pieces`` as commit ``after + 1``; ``None`` if another writer took it."""

def _staged_segments_decide(
    url: str,
    tasks: Sequence[tuple[int, bytes, bytes, Sequence[str]]],
    *,
    tier_dir: str | os.PathLike[str] | None = None,
    tier_budget: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[int, list[str]]:
    """Decide a segment job's commit (``(task, schema, index log, pieces)``
    per write task) against the log's last one: ``(its number, pieces)``."""

@final
class _StagingJob:
    """A write job's staging directory, its lock held until :meth:`remove`."""

    def __new__(cls, staging: str | os.PathLike[str], id: str) -> Self: ...
    @property
    def dir(self) -> Path:
        """The job's directory."""

    def remove(self) -> None:
        """Delete the job's directory and let go of its lock."""

@final
class _SegmentCommit:
    """A segment job's commit, decided; its renames wait for :meth:`apply`."""

    def apply(self) -> None:
        """Apply the renames (the commit point last) and let go of the locks."""

    def close(self) -> None:
        """Let go of the locks without applying (recovery rolls it forward)."""

def _staging_task_attempt(job_dir: str | os.PathLike[str], task: int) -> Path:
    """A fresh directory for one attempt of write task ``task``."""

def _staging_finish_task(
    job_dir: str | os.PathLike[str], task: int, attempt: str | os.PathLike[str]
) -> Path:
    """Make an attempt's durable output the task's; its directory."""

def _staging_recover(staging: str | os.PathLike[str]) -> list[str]:
    """Finish or remove every dead job under ``staging``; one line per job."""

def _staging_commit_rename(staged: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Put a merged file or directory in place with one durable rename."""

def _segments_decide(
    cache: str | os.PathLike[str],
    job_dir: str | os.PathLike[str],
    staged: Sequence[str | os.PathLike[str]],
) -> _SegmentCommit:
    """Decide the commit of staged stores into the segment store at ``cache``."""

def _segments_recover(cache: str | os.PathLike[str]) -> list[str]:
    """Finish or remove the dead write jobs of the segment store at ``cache``."""

def _durable_write(path: str | os.PathLike[str], data: bytes, *, replace: bool = True) -> bool:
    """Write ``path`` durably and atomically (only if missing with
    ``replace=False``); whether it was written."""

def _durable_remove(path: str | os.PathLike[str]) -> bool:
    """Remove ``path`` durably; whether it existed."""
