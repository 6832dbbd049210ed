"""torchcachex 0.2.0's ``torchcachex.backend``: :class:`ArrowIPCCacheBackend`,
a persistent per-sample cache in torchcachex's layout on cachex's Rust
segment store. See :mod:`cachex.torchcachex` for the layout and where it
differs from torchcachex's.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from cachex import _cachex
from cachex._cachex import SegmentStore
from cachex._remote import TierBudget, is_url, join, tier_kwargs
from cachex.dropins._not_provided import NotProvidedError
from cachex.dropins.torchcachex._lru import Lru
from cachex.dropins.torchcachex._schema import (
    arrow_type,
    blob_columns,
    create_durably,
    inferred_schema,
    read_text,
    replace_durably,
    without_ranks,
)
from cachex.dropins.torchcachex._values import (
    from_store_batch,
    key_of,
    to_store,
    unstack_batch,
)
from cachex.dropins.torchcachex.utils import _move
from cachex.errors import CacheError, InvalidInputError

try:  # torch is optional: without it values are numpy arrays.
    import torch
except ImportError:  # pragma: no cover - exercised in the numpy-only CI venv
    torch = None  # type: ignore[assignment]

__all__ = ["ArrowIPCCacheBackend", "WriteQueue"]


# Writers whose locks a forked child must not inherit held.
_LIVE: weakref.WeakSet[ArrowIPCCacheBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_LIVE):
        backend._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class WriteQueue:
    """``backend.executor`` with ``async_write=True``: the store's one
    background writer thread, standing for torchcachex's write thread pool.

    What torchcachex's users do with that pool works:
    ``shutdown(wait=True)`` returns once every value put so far is written
    (it is the backend's :meth:`~ArrowIPCCacheBackend.flush`) and raises
    their write errors; ``shutdown(wait=False)`` leaves the writes running.
    Unlike a thread pool's, the writer keeps taking writes afterwards. It
    runs the store's segment writes only: :meth:`submit` raises
    :class:`NotProvidedError`.
    """

    def __init__(self, backend: ArrowIPCCacheBackend) -> None:
        self._backend = weakref.ref(backend)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """With ``wait``, returns once every value put so far is written;
        queued writes are never cancelled (``cancel_futures`` is ignored)."""
        backend = self._backend()
        if wait and backend is not None:
            backend.flush()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Not provided: the writer runs the store's segment writes only."""
        raise NotProvidedError(
            "ArrowIPCCacheBackend.executor.submit is not provided by cachex: the store's "
            "writer thread runs segment writes only; put_batch() queues values, flush() "
            "waits for them"
        )


class ArrowIPCCacheBackend:
    """A persistent per-sample cache in torchcachex's layout, on the Rust engine.

    ``cache_dir`` may be a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
    ``file://``; cachex only): the cache lives at ``<cache_dir>/<module_id>``
    in the bucket and is read through the machine's local tier; ``flush()``
    and ``close()`` publish what the writer wrote (and so, on their own,
    every few seconds, a drop and the interpreter's exit), :meth:`refresh`
    applies what others published. :attr:`cache_dir` is then the local working
    directory, :attr:`url` the URL (without credentials).

    Parameters
    ----------
    cache_dir : str or os.PathLike
        Root directory (or URL); the cache lives in ``cache_dir/module_id``.
    module_id : str
        Stable name of the cached computation (change it to invalidate).
    lru_size : int
        Values kept in the in-memory LRU (4096); 0 disables it. The LRU
        ages values in two generations of ``lru_size / 2`` (see ``_lru.py``).
    async_write : bool
        Write segments on a background thread (True). ``flush()`` waits for
        it and raises its errors.
    max_workers : int
        Flushes that may queue for the background writer before
        ``put_batch`` waits (2).
    flush_every : int
        Pending values that trigger a new segment (2048).
    writer_rank : int
        The rank that persists (0); other ranks only fill their LRU.
    current_rank : int, optional
        This process's rank (default: the ``RANK`` environment variable, else 0).
    writer_id : int, optional
        cachex only, keyword: let this process write beside others as
        writer ``writer_id`` (multi-writer mode; every rank persists).
    tier_dir, tier_budget, storage_options
        cachex only, keyword, for a URL ``cache_dir``: the local tier's
        directory (default ``CACHEX_TIER_DIR``), its budget (bytes or a size
        such as ``"20G"``) and the object store's options (``aws_endpoint``,
        ...; credentials stay in the environment).

    Values of different shapes and ranks share one cache (the schema fixes
    structure, names and dtypes; each row stores its shape).

    Raises
    ------
    cachex.LockedError
        Another process is the writer of this cache.
    cachex.CacheIOError
        The directory cannot be created or read.

    Notes
    -----
    See the module docstring for where this differs from torchcachex.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        module_id: str,
        lru_size: int = 4096,
        async_write: bool = True,
        max_workers: int = 2,
        flush_every: int = 2048,
        writer_rank: int = 0,
        current_rank: int | None = None,
        *,
        writer_id: int | None = None,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: TierBudget | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if int(lru_size) < 0 or int(flush_every) < 1 or int(max_workers) < 1:
            raise InvalidInputError(
                f"lru_size must be >= 0, flush_every and max_workers >= 1 "
                f"(got {lru_size}, {flush_every}, {max_workers})"
            )
        # Where the store opens: a directory, or a URL whose working
        # directory (self.cache_dir) is known once the store is open.
        self._root = join(cache_dir, module_id)
        self._remote = is_url(cache_dir)
        self._set_dir(Path(self._root) if not self._remote else Path())
        self.module_id = module_id
        self.async_write = bool(async_write)
        self.flush_every = int(flush_every)
        self.writer_rank = int(writer_rank)
        self.current_rank = (
            int(current_rank) if current_rank is not None else int(os.getenv("RANK", "0"))
        )
        self.lru_size = int(lru_size)
        # torchcachex's lru is a dict when disabled: here one that stays empty.
        self.lru: Lru | dict[str, Any] = Lru(self.lru_size) if self.lru_size else {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # Whether values were put since index.pkl was last written (it was
        # removed then, before their segments could land).
        self._index_dirty = False
        # index.pkl is written by a sole local writer only (see _write_index).
        self._writes_index = writer_id is None and not is_url(cache_dir)
        # Set by _settle_schema, at the first put: schema.json then leaves
        # every rank free, and _blobs names its blob columns.
        self._schema_settled = False
        self._blobs: frozenset[str] = frozenset()
        self._stackable = True  # False once a batch's values differ in shape
        self._store_options: dict[str, Any] = {
            "flush_every": self.flush_every,
            "lru_bytes": 0,  # the LRU is ours, bounded by count as torchcachex's
            "async_write": self.async_write,
            "queue_depth": int(max_workers),
            "writer_rank": self.writer_rank,
            "current_rank": self.current_rank,
            "writer_id": writer_id,
            **tier_kwargs(tier_dir, tier_budget, storage_options),
        }
        # Whether the store read a schema.json when it opened (see _settle_schema).
        self._schema_seen_at_open = not self._remote and self.schema_path.exists()
        self.store = self._open_store()
        if self._remote:
            self._schema_seen_at_open = self.schema_path.exists()
        _LIVE.add(self)

    def _set_dir(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.segments_dir = cache_dir / "segments"
        self.index_path = cache_dir / "index.pkl"
        self.schema_path = cache_dir / "schema.json"

    def _open_store(self) -> SegmentStore:
        """Opens the store; on a URL, follows it to its working directory."""
        store = SegmentStore(self._root, **self._store_options)
        if self._remote:
            self._set_dir(Path(store.path))
        return store

    @property
    def url(self) -> str | None:
        """The cache's URL without credentials (cachex only; None for a directory)."""
        return self.store.url

    def refresh(self) -> None:
        """Makes what other writers published (or flushed) since visible
        (cachex only). Values already in the LRU stay as they were read."""
        self.store.refresh()

    def reopen(self) -> None:
        """Closes the store and opens it again with the same options (cachex
        only): it then reads every writer's index log as it is now, so what
        other writers (``writer_id``) committed with ``flush()`` becomes
        visible. Flush first: what this writer has pending is written by
        the close. Values already in the LRU stay as they were read."""
        self.store.close()
        self.store = self._open_store()

    @property
    def lru_enabled(self) -> bool:
        """Whether values are kept in the in-memory LRU (``lru_size > 0``)."""
        return self.lru_size > 0

    @property
    def output_structure(self) -> str | None:
        """What the cache's values are: "tensor", "dict", "tuple", "list" or
        "blob" (``schema.json``'s ``output_structure``); None before the first value."""
        doc = self._schema_doc()
        return None if doc is None else doc.get("output_structure")

    @property
    def schema(self) -> Any:
        """The segments' Arrow schema (a ``pyarrow.Schema``, as torchcachex
        rebuilds it from ``schema.json``); None before the first value.

        Raises
        ------
        NotProvidedError
            pyarrow is not installed (cachex itself does not need it); the
            file it is read from is :attr:`schema_path`.
        """
        try:
            import pyarrow as pa  # type: ignore[import-untyped]
        except ImportError:
            raise NotProvidedError(
                "ArrowIPCCacheBackend.schema is a pyarrow.Schema and pyarrow is not installed: "
                f"pip install pyarrow, or read {self.schema_path} (JSON) instead"
            ) from None
        doc = self._schema_doc()
        if doc is None:
            return None
        fields = [pa.field(f["name"], arrow_type(pa, f["type"])) for f in doc["fields"]]
        return pa.schema(fields, metadata=doc.get("metadata") or None)

    @property
    def index(self) -> dict[str, tuple[int, int]]:
        """torchcachex's index: ``{key: (segment_id, row)}`` for every
        flushed value, built from cachex's index on each read.

        A snapshot: changing it changes nothing (``put_batch`` writes).
        Values still pending a flush appear once flushed, as in torchcachex.
        Building it reads the key column of every segment.
        """
        return {key: (seg, row) for key, seg, row in self.store.key_locations()}

    @property
    def key_to_idx(self) -> dict[str, tuple[int, int]]:
        """The same as :attr:`index` (the name torchcachex's own scale tests read)."""
        return self.index

    def _load_schema(self) -> Any:
        """The segments' Arrow schema read from ``schema.json`` (torchcachex's
        private loader, which :attr:`schema` is): a ``pyarrow.Schema``.

        Raises
        ------
        FileNotFoundError
            No value was cached yet (there is no ``schema.json``).
        """
        if not self.schema_path.exists():
            raise FileNotFoundError(f"{self.schema_path}: no schema yet (nothing was cached)")
        return self.schema

    def _parse_arrow_type(self, type_str: str) -> Any:
        """The pyarrow type a ``schema.json`` type string names, as torchcachex
        parses it: ``list<...>`` recursively, an unknown name as ``string``."""
        import pyarrow as pa

        return arrow_type(pa, type_str, unknown=pa.string())

    def _torch_to_arrow_dtype(self, torch_dtype: Any) -> Any:
        """The pyarrow type cachex stores a tensor of ``torch_dtype`` as (the
        element type of its ``*_data`` column; bfloat16 as uint16).

        Raises
        ------
        cachex.InvalidInputError
            cachex stores no tensor of that dtype (complex ones; torchcachex
            said float32 and then failed to write them).
        """

        if torch is None:
            raise NotProvidedError(
                "ArrowIPCCacheBackend._torch_to_arrow_dtype maps torch dtypes and torch "
                "is not importable"
            )
        probe = to_store(torch.zeros(1, dtype=torch_dtype))
        fields = json.loads(inferred_schema("k", probe))["fields"]
        (data,) = (f["type"] for f in fields if f["name"] == "data")
        return self._parse_arrow_type(data).value_type

    @property
    def executor(self) -> WriteQueue | None:
        """The background writer (torchcachex's write thread pool): a
        :class:`WriteQueue` with ``async_write=True``, None without (as
        torchcachex)."""
        return WriteQueue(self) if self.async_write else None

    def _schema_doc(self) -> dict[str, Any] | None:
        """``schema.json`` as a dict; None when there is none yet, or when it
        is damaged (as torchcachex: the store re-derives it)."""
        try:
            doc: dict[str, Any] = json.loads(self.schema_path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return doc

    @property
    def is_writer(self) -> bool:
        """Whether this process persists puts (the writer rank, not a forked child)."""
        return self.store.is_writer and os.getpid() == self._pid

    def _lru_get_many(self, keys: list[str]) -> tuple[list[Any], list[int]]:
        """The LRU's value (or None) of each key, and the positions of the misses."""
        lru = self.lru
        if not isinstance(lru, Lru):
            return [None] * len(keys), list(range(len(keys)))
        with self._lock:
            return lru.get_many(keys)

    def _lru_put(self, keys: list[str], values: list[Any]) -> None:
        """Adds values as the most recent entries."""
        lru = self.lru
        if isinstance(lru, Lru):
            with self._lock:
                lru.put_many(keys, values)

    def get_batch(
        self, keys: Iterable[Any], map_location: Any = "cpu"
    ) -> tuple[list[Any | None], list[int]]:
        """Look keys up: the LRU, then the store.

        Parameters
        ----------
        keys : iterable
            Cache keys (``str``; other keys are looked up as ``str(key)``).
        map_location : str or torch.device
            Where tensors go ("cpu"); ignored without torch.

        Returns
        -------
        (values, missing)
            ``values[i]`` is the value of ``keys[i]`` or None;
            ``missing`` lists the positions of the keys not found.
        """
        keys = list(keys)
        if not all(type(k) is str for k in keys):
            keys = [key_of(k) for k in keys]
        results: list[Any | None] = [None] * len(keys)
        need: list[int] = []
        if self.lru_size:
            results, need = self._lru_get_many(keys)
        else:
            need = list(range(len(keys)))
        missing: list[int] = []
        if need:
            # Fresh buffers that own their bytes: writable, and an LRU entry
            # pins no segment map (with torch, its batch's buffer: see _read).
            need_keys = keys if len(need) == len(keys) else [keys[i] for i in need]
            decoded, absent = self._read(need_keys)
            if len(need) == len(keys):
                results = decoded
            else:
                for i, v in zip(need, decoded, strict=True):
                    results[i] = v
            if absent:
                missing = [need[j] for j in absent]
                gone = set(absent)
                found = [j for j in range(len(need)) if j not in gone]
                need_keys = [need_keys[j] for j in found]
                decoded = [decoded[j] for j in found]
            self._lru_put(need_keys, decoded)
        if torch is not None and map_location is not None and str(map_location) != "cpu":
            results = [None if r is None else _move(r, map_location) for r in results]
        return results, missing

    def _read(self, keys: list[str]) -> tuple[list[Any], list[int]]:
        """The store's values of ``keys`` (None where absent) and the absent positions.

        With torch, one ``get_stacked`` call copies the batch into one fresh
        buffer per tensor part and one ``unbind`` per part makes the values'
        tensors, instead of a numpy array and a ``from_numpy`` call per
        tensor (a third less time per value for one tensor, half for a dict
        of two). A value then shares its batch's buffer. A cache
        whose values differ in shape is read per value from then on.
        """
        store = self.store
        try:
            return self._read_from(store, keys)
        except CacheError:
            if self.store is store:
                raise
            # The first put reopened the store meanwhile (_settle_schema).
            return self._read_from(self.store, keys)

    def _read_from(self, store: SegmentStore, keys: list[str]) -> tuple[list[Any], list[int]]:
        if torch is not None and self._stackable:
            try:
                stacked, absent = store.get_stacked(keys)
            except InvalidInputError:
                self._stackable = False
            else:
                if stacked is None:
                    return [None] * len(keys), absent
                return unstack_batch(stacked, len(keys), absent), absent
        stored, absent = store.get_batch(keys, copy=True)
        return from_store_batch(stored, absent), absent

    def put_batch(self, items: Mapping[Any, Any]) -> None:
        """Cache values by key (persisted by the writer rank only).

        Parameters
        ----------
        items : mapping
            key -> value: a tensor or array, a dict / tuple / list of them
            (other entries pickled), or any picklable object.

        Raises
        ------
        cachex.SchemaMismatchError
            A value differs from the cache's schema; nothing of the batch
            was written.
        cachex.InvalidInputError
            A tensor of a dtype no cache stores (complex, ...).
        """
        if not items:
            return
        pairs = [(key_of(k), v) for k, v in items.items()]
        if self.is_writer:
            self._index_changes()
            if not self._schema_settled:
                self._settle_schema(pairs[0][0], to_store(pairs[0][1]))
            self.store.put_batch([(k, to_store(v, self._blobs)) for k, v in pairs])
        self._lru_put([k for k, _ in pairs], [v for _, v in pairs])

    def _settle_schema(self, key: str, first: Any) -> None:
        """Makes ``schema.json`` take what torchcachex's schema takes, and
        learns its blob columns (what goes there is pickled, whatever it is).

        Shapes: torchcachex stores a shape per row, so any rank goes.

        segment-store fixes each tensor's rank from the first value unless
        its ``schema.json`` says none; torchcachex writes ``schema.json``
        from the first value before anything else. So does this, once per
        cache: a fresh cache gets the schema segment-store infers for
        ``first`` (in a scratch store, so the inference is the engine's)
        without ranks; a cache whose ``schema.json`` fixes ranks (written
        by an older cachex) has them dropped. The store is then reopened
        on that file. Segments already written keep their ranks, which
        their rows have.
        """
        text = read_text(self.schema_path)
        if text is None:
            inferred = inferred_schema(key, first)
            if not create_durably(self.schema_path, without_ranks(inferred) or inferred):
                # Another writer (writer_id) fixed the schema first: use theirs.
                text = read_text(self.schema_path)
        widened = None if text is None else without_ranks(text)
        if widened is not None:
            replace_durably(self.schema_path, widened)
        if text is None or widened is not None or not self._schema_seen_at_open:
            self.store.close()
            self.store = self._open_store()
        self._blobs = blob_columns(read_text(self.schema_path))
        self._schema_settled = True

    def _index_changes(self) -> None:
        """Removes ``index.pkl`` before the first segment of new values can
        land: torchcachex, which trusts that file, then rebuilds its index
        from the segments rather than missing the new keys."""
        if self._index_dirty:
            return
        _cachex._durable_remove(self.index_path)
        self._index_dirty = True

    def _write_index(self) -> None:
        """Writes ``index.pkl`` (torchcachex's ``{key: (segment_id, row)}``
        pickle) from cachex's index when values were put since it was last
        written, once they are all flushed. A sole local writer only: with
        ``writer_id`` each writer knows only what it has read, and on a URL
        the working directory is not where torchcachex would look."""
        if not self._index_dirty or not self._writes_index:
            return
        self.store.flush()
        index = pickle.dumps(self.index, protocol=pickle.HIGHEST_PROTOCOL)
        _cachex._durable_write(self.index_path, index)
        self._index_dirty = False

    def flush(self) -> None:
        """Write every pending value, wait for queued writes and write
        ``index.pkl`` when values were put since (writer rank only).

        Raises
        ------
        cachex.CacheError
            A write (this one or an earlier async one) failed.
        """
        if self.is_writer:
            self.store.flush()
            self._write_index()

    def close(self) -> None:
        """Flush, write ``index.pkl`` and release the writer lock; the backend
        is unusable after."""
        if not self.store.closed:
            if os.getpid() != self._pid:
                return  # a forked child leaves the parent's writer alone
            if self.is_writer:
                self._write_index()
            self.store.close()

    def __enter__(self) -> ArrowIPCCacheBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        url = self.store.url
        root = str(self.cache_dir.parent) if url is None else url.rsplit("/", 1)[0]
        return (
            f"ArrowIPCCacheBackend({root!r}, {self.module_id!r}, "
            f"lru_size={self.lru_size}, writer={self.is_writer})"
        )
