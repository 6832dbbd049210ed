"""A drop-in for torchcachex 0.2.0 over cachex's Rust segment store.

Change one import and keep the cache directories::

    # from torchcachex import ArrowIPCCacheBackend, CacheModuleDecorator
    from cachex.torchcachex import ArrowIPCCacheBackend, CacheModuleDecorator

:class:`ArrowIPCCacheBackend` keeps torchcachex's constructor, defaults and
methods (``put_batch``, ``get_batch``, ``flush``) and its on-disk layout::

    <cache_dir>/<module_id>/
      segments/segment_000000.arrow   Arrow IPC files: key, data, shape, ... columns
      schema.json                     {"fields", "metadata", "output_structure"}
      index.pkl                       torchcachex's index (read by torchcachex only)
      segment-index.log               cachex's index (key hashes, appended per flush)
      segment-store.lock              the writer's lock

:class:`CacheModuleDecorator` (needs torch) wraps a stateless
``nn.Module`` exactly as torchcachex's does.

Values are torch tensors when torch is importable, numpy arrays otherwise
(the backend works with numpy alone). Tensors read from disk are CPU
copies the caller owns (writable, independent of the mapped files). With
torch, one ``get_batch`` copies each tensor part of its values into one
fresh buffer and cuts it into the values' tensors with one ``unbind``
(a third to a half less time than a tensor per value): a value's tensor
is a view that shares that buffer with the other values read in the
same call, never overlapping them, so writing into one changes no other.
What shares a buffer stays alive together: one value kept (by the caller
or the LRU) keeps its batch's buffer, and ``torch.save`` of one value
writes the whole buffer; ``.clone()`` a value to keep it on its own.
Non-tensor values (inside dicts, tuples and lists, or whole) are pickled
as torchcachex pickles them: **opening a cache unpickles its blobs**, so
open only caches you trust.

Differences from torchcachex (deliberate)
-----------------------------------------
* ``flush()`` waits for every write queued before it, including async
  ones, and raises their errors; torchcachex's returned while queued
  writes were still in its thread pool and lost their errors.
* Every write is durable when ``flush()`` returns: segments are fsynced
  and renamed, then the index log is appended and fsynced. torchcachex did
  no fsync.
* A value whose structure, names or dtypes differ from the cache's schema
  raises :class:`cachex.SchemaMismatchError` and nothing of its batch is
  written; torchcachex cast it silently (or wrote garbage). Shapes and
  ranks are free, as in torchcachex (a shape per row): values of any
  shapes share one cache. The first value fixes the schema, as in
  torchcachex, even when the rest of its batch is refused.
* bfloat16 is kept as bfloat16 (numpy side: ``ml_dtypes.bfloat16``);
  torchcachex declared it float32 and failed converting it.
* ``lru_size=0`` means no in-memory LRU; torchcachex then kept *every*
  value in an unbounded dict. The LRU holds at most ``lru_size`` values
  and evicts the least recently used in bulk (two generations of
  ``lru_size / 2``), which costs a dict probe per value instead of
  per-value reordering.
* Two writer processes: the writer rank takes a lock, so a second writer
  on the same directory gets :class:`cachex.LockedError` instead of both
  numbering segments from the same id and overwriting each other's. To let
  several processes write at once pass ``writer_id`` (say, the rank): each
  then writes its own segment ids and index log (segment-store's
  multi-writer mode).
* When a non-tensor first argument makes the decorator run the whole
  batch, outputs are taken at each miss's position in the batch;
  torchcachex took them at the position in the list of misses (caching
  other samples' outputs under those keys).
* Keys that are not ``str`` (ints, numpy or torch scalars) are stored as
  ``str(key)`` (torchcachex could not persist them).
* The first write into a directory torchcachex wrote removes its
  ``index.pkl`` (before any new segment lands), so torchcachex, which
  trusts that file, rebuilds its index from the segments on its next open
  instead of missing the new keys.
* In a forked child (a DataLoader worker) of the writer, puts fill the
  LRU only, as on a non-writer rank; the child reads the directory
  read-only. ``max_workers`` bounds how many flushes may queue for the one
  background writer thread (segments are written in order).
* numpy arrays are stored as tensors (torchcachex pickled them). Where
  the cache's schema holds a blob (a dict member or tuple item that was
  no tensor in the first value, or a whole value that was neither tensor,
  dict, tuple nor list), anything is pickled, as torchcachex does.
* A batch's tensors are views of one buffer per tensor part (see above);
  torchcachex copied each value's tensor on its own.
* ``cache_dir`` may be a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
  ``file://``; torchcachex took local directories only), with the
  keyword-only ``tier_dir``, ``tier_budget`` and ``storage_options``: the
  cache is read and written in a working directory over the machine's
  local tier, ``flush()`` / ``close()`` publish, ``refresh()`` applies
  what other writers published. Without them, what the writer persists
  still reaches the bucket: each segment it flushes within a few seconds
  (``CACHEX_PUBLISH_INTERVAL``, default 5), the rest when the backend is
  dropped or the interpreter exits; a killed writer loses at most its last
  interval.

Attributes: torchcachex 0.2.0's public ones all exist. ``schema`` is a
``pyarrow.Schema`` read from ``schema.json`` as torchcachex reads it (it
needs pyarrow, which cachex does not). ``lru`` is cachex's own two-generation
LRU (``len``, ``in``, ``get``; torchcachex had a ``cachetools.LRUCache``).
Two are internals cachex has no equivalent of; reading them raises
:class:`NotProvidedError` (a :class:`cachex.CacheError` and an
``AttributeError``) that names what to use instead:

* ``index`` (torchcachex's ``{key: (segment_id, row)}`` dict): cachex's
  index holds key hashes in ``segment-index.log``; use ``key in
  backend.store``, ``len(backend.store)`` or ``get_batch``.
* ``executor`` (its write thread pool): the store writes on its own
  thread; ``flush()`` waits for the queued writes.

cachex adds ``lru_size``, ``store`` (the :class:`cachex.SegmentStore`),
``is_writer``, ``url``, ``refresh()``, ``close()`` and the context-manager
protocol.
:class:`CacheModuleDecorator` keeps every public name of torchcachex's
(it is the same kind of ``nn.Module``).
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cachex import _cachex
from cachex._cachex import SegmentStore
from cachex._remote import TierBudget, is_url, join, tier_kwargs
from cachex.dropins._not_provided import NotProvidedError, not_provided
from cachex.errors import CacheError, InvalidInputError

try:  # torch is optional: without it values are numpy arrays.
    import torch
    import torch.nn as nn
except ImportError:  # pragma: no cover - exercised in the numpy-only CI venv
    torch = None
    nn = None

__all__ = [
    "ArrowIPCCacheBackend",
    "CacheModuleDecorator",
    "NotProvidedError",
    "TorchRequiredError",
]


class TorchRequiredError(CacheError, ImportError):
    """The call needs PyTorch (``CacheModuleDecorator``) and torch is not importable."""


# Writers whose locks a forked child must not inherit held.
_LIVE: weakref.WeakSet[ArrowIPCCacheBackend] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for backend in list(_LIVE):
        backend._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _key(k: Any) -> str:
    if isinstance(k, str):
        return k
    item = getattr(k, "item", None)  # numpy / torch scalars
    if callable(item) and getattr(k, "ndim", 0) == 0:
        k = item()
    return str(k)


def _bf16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return ml_dtypes.bfloat16


_BF16_DTYPE = None if _bf16() is None else np.dtype(_bf16())


def _leaf_to_store(v: Any) -> Any:
    """A value part as the store takes it: an array, or a pickle."""
    if torch is not None and isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            bf16 = _bf16()
            if bf16 is None:
                raise InvalidInputError(
                    "a bfloat16 tensor needs the ml_dtypes package (pip install ml_dtypes)"
                )
            return t.view(torch.int16).numpy().view(bf16)
        return t.resolve_conj().resolve_neg().numpy()
    if isinstance(v, np.ndarray):
        return v
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def _to_store(value: Any, blobs: frozenset[str] = frozenset()) -> Any:
    """A whole value as a store record: array, dict, tuple, list, or blob.

    ``blobs`` names the blob columns of the cache's schema (``blob``,
    ``{name}_blob``, ``item{i}_blob``): what goes there is pickled whatever
    it is, as torchcachex pickles what its schema does not hold as a tensor.
    """
    if "blob" in blobs:
        return _pickled(value)
    if isinstance(value, dict):
        return {
            str(k): _pickled(v) if f"{k}_blob" in blobs else _leaf_to_store(v)
            for k, v in value.items()
        }
    if isinstance(value, tuple | list):
        parts = [
            _pickled(v) if f"item{i}_blob" in blobs else _leaf_to_store(v)
            for i, v in enumerate(value)
        ]
        return tuple(parts) if isinstance(value, tuple) else parts
    return _leaf_to_store(value)


def _pickled(v: Any) -> bytes:
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def _blob_columns(schema_json: str | None) -> frozenset[str]:
    """The blob columns ``schema.json`` declares (none when it is missing or damaged)."""
    try:
        fields = json.loads(schema_json or "")["fields"]
        return frozenset(f["name"] for f in fields if f["type"] in ("binary", "large_binary"))
    except (ValueError, KeyError, TypeError):
        return frozenset()


def _own(a: np.ndarray) -> Any:
    """A fresh array the caller owns (``get_batch(copy=True)``) as the user's value type."""
    if torch is None:
        return a
    if a.dtype.kind == "V" and a.dtype == _BF16_DTYPE:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _leaf_from_store(v: Any) -> Any:
    return pickle.loads(v) if isinstance(v, bytes) else _own(v)


def _from_store(v: Any) -> Any:
    """A stored record (fresh arrays, dicts, tuples, lists, pickles) as the user's value."""
    if isinstance(v, np.ndarray):
        return _own(v)
    if isinstance(v, dict):
        return {k: _leaf_from_store(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_leaf_from_store(x) for x in v)
    if isinstance(v, list):
        return [_leaf_from_store(x) for x in v]
    return pickle.loads(v)


def _from_store_batch(stored: list[Any], absent: list[int]) -> list[Any]:
    """``get_batch(copy=True)``'s values as user values (None stays None)."""
    if not stored or len(absent) == len(stored):
        return stored
    first = stored[next(i for i in range(len(stored)) if stored[i] is not None)]
    if isinstance(first, np.ndarray) and (torch is None or first.dtype.kind != "V"):
        if torch is None:
            return stored  # fresh, writable arrays already
        if not absent:
            return list(map(torch.from_numpy, stored))
        return [None if v is None else torch.from_numpy(v) for v in stored]
    return [None if v is None else _from_store(v) for v in stored]


def _unstack_column(col: Any) -> Any:
    """One column of ``get_stacked`` as a sequence of per-value parts.

    An array becomes its rows as tensors made by one ``unbind`` call (views
    of the batch's one fresh buffer: writable, none overlapping another); a
    list of pickles becomes the unpickled objects.
    """
    if isinstance(col, np.ndarray):
        return _own(col).unbind(0)
    return [None if b is None else pickle.loads(b) for b in col]


def _unstack_batch(stacked: Any, n: int, absent: list[int]) -> list[Any]:
    """``get_stacked``'s batch as ``n`` values (torch only), None where absent.

    ``stacked`` is shaped like one value with a leading batch axis: an
    array, a list of pickles (a whole-value blob: every entry ``bytes`` or
    ``None``), or a dict / tuple / list of such columns.
    """
    if isinstance(stacked, np.ndarray):
        values = list(_unstack_column(stacked))
    elif isinstance(stacked, dict):
        names = list(stacked)
        columns = [_unstack_column(stacked[k]) for k in names]
        values = [dict(zip(names, row, strict=True)) for row in _rows(columns, n)]
    elif isinstance(stacked, tuple):
        values = list(_rows([_unstack_column(c) for c in stacked], n))
    elif stacked and all(b is None or isinstance(b, bytes) for b in stacked):
        values = _unstack_column(stacked)  # whole values pickled
    else:
        values = [list(row) for row in _rows([_unstack_column(c) for c in stacked], n)]
    for i in absent:
        values[i] = None
    return values


def _rows(columns: list[Any], n: int) -> Iterable[tuple[Any, ...]]:
    """The batch's values as tuples of parts (``n`` empty ones without columns)."""
    return zip(*columns, strict=True) if columns else [()] * n


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _inferred_schema(key: str, first: Any) -> str:
    """The ``schema.json`` segment-store writes for a cache whose first value is ``first``.

    Raises the store's own error when ``first`` cannot be stored.
    """
    with tempfile.TemporaryDirectory(prefix="cachex-schema-") as scratch:
        probe = SegmentStore(scratch, async_write=False, lru_bytes=0, current_rank=0)
        try:
            probe.put_batch([(key, first)])
            return (Path(scratch) / "schema.json").read_text()
        finally:
            probe.close()


def _without_ranks(text: str) -> str | None:
    """``schema.json`` text with no tensor rank fixed, or None when none is
    (torchcachex's own files have no ``cachex_parts``) or the file is not
    JSON (the store reports and re-derives a damaged one)."""
    try:
        doc = json.loads(text)
        parts = json.loads(doc["metadata"]["cachex_parts"])
    except (ValueError, KeyError, TypeError):
        return None
    if not any(isinstance(p, dict) and "rank" in p for p in parts):
        return None
    for p in parts:
        p.pop("rank", None)
    doc["metadata"]["cachex_parts"] = json.dumps(parts, separators=(",", ":"))
    return json.dumps(doc, indent=2)


def _create_durably(path: Path, text: str) -> bool:
    """Writes ``path`` unless it exists (then False), durably, atomically."""
    return _cachex._durable_write(path, text.encode(), replace=False)


def _replace_durably(path: Path, text: str) -> None:
    _cachex._durable_write(path, text.encode())


# torchcachex's type table for schema.json's strings, with pyarrow's
# spelling of float16 (which torchcachex's parser misread as a string).
_ARROW_TYPES = {
    "string": "string",
    "binary": "binary",
    "bool": "bool_",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "float16": "float16",
    "halffloat": "float16",
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
}


def _arrow_type(pa: Any, text: str) -> Any:
    """The pyarrow type a ``schema.json`` type string names."""
    if text.startswith("list<") and text.endswith(">"):
        return pa.list_(_arrow_type(pa, text[5:-1].split(": ")[-1]))
    try:
        return getattr(pa, _ARROW_TYPES[text])()
    except KeyError:
        raise CacheError(f"schema.json: unknown type {text!r}") from None


def _move(obj: Any, device: Any) -> Any:
    if torch is None or device is None:
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.to(device=device, non_blocking=torch.device(device).type != "mps")
    if isinstance(obj, dict):
        return {k: _move(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_move(v, device) for v in obj)
    if isinstance(obj, list):
        return [_move(v, device) for v in obj]
    return obj


class _Lru:
    """At most ``size`` values by key, least recently used out first, in bulk.

    Two generations of plain dicts: new values and hits go into ``hot``;
    when ``hot`` outgrows half the size it becomes ``cold`` (keeping its
    newest ``size - size // 2``) and the old ``cold`` is dropped. A lookup
    costs one or two dict probes and eviction is amortized O(1), so the LRU
    adds almost nothing per value to a batch (an exact LRU's per-value
    bookkeeping cost more than reading the value from the mapped file).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.hot: dict[str, Any] = {}
        self.cold: dict[str, Any] = {}

    def get_many(self, keys: list[str]) -> tuple[list[Any], list[int]]:
        """Each key's value or None, and the positions of the Nones."""
        out = list(map(self.hot.get, keys))
        need = [i for i, v in enumerate(out) if v is None]
        if need and self.cold:
            cold, hot = self.cold, self.hot
            still = []
            for i in need:
                v = cold.get(keys[i])
                if v is None:
                    still.append(i)
                else:
                    hot[keys[i]] = out[i] = v
            need = still
            self._age()
        return out, need

    def put_many(self, keys: list[str], values: list[Any]) -> None:
        # A stale copy left in `cold` is harmless: `hot` is looked up first
        # and `cold` is dropped whole at the next aging.
        self.hot.update(zip(keys, values, strict=True))
        self._age()

    def _age(self) -> None:
        if len(self.hot) > self.size // 2:
            keep = self.size - self.size // 2
            hot = self.hot
            if len(hot) > keep:
                hot = dict(itertools.islice(hot.items(), len(hot) - keep, None))
            self.cold, self.hot = hot, {}

    def __len__(self) -> int:
        return len(self.hot) + sum(1 for k in self.cold if k not in self.hot)

    def __contains__(self, key: object) -> bool:
        return key in self.hot or key in self.cold

    def __iter__(self) -> Iterator[str]:
        """Keys, least recently used first."""
        yield from (k for k in self.cold if k not in self.hot)
        yield from self.hot

    def get(self, key: str, default: Any = None) -> Any:
        v = self.get_many([key])[0][0]
        return default if v is None else v


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
        ages values in two generations of ``lru_size / 2`` (see ``_Lru``).
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
        self.lru = _Lru(self.lru_size)
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._legacy_index_checked = False
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
            import pyarrow as pa
        except ImportError:
            raise NotProvidedError(
                "ArrowIPCCacheBackend.schema is a pyarrow.Schema and pyarrow is not installed: "
                f"pip install pyarrow, or read {self.schema_path} (JSON) instead"
            ) from None
        doc = self._schema_doc()
        if doc is None:
            return None
        fields = [pa.field(f["name"], _arrow_type(pa, f["type"])) for f in doc["fields"]]
        return pa.schema(fields, metadata=doc.get("metadata") or None)

    index = not_provided(
        "cachex's index holds key hashes, not a dict of keys; test a key with "
        "`key in backend.store`, count with `len(backend.store)`, read with get_batch()"
    )
    executor = not_provided(
        "writes run on the store's own background thread (async_write=True); "
        "flush() waits for them and raises their errors"
    )

    def _schema_doc(self) -> dict[str, Any] | None:
        """``schema.json`` as a dict; None when there is none yet, or when it
        is damaged (as torchcachex: the store re-derives it)."""
        try:
            return json.loads(self.schema_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    @property
    def is_writer(self) -> bool:
        """Whether this process persists puts (the writer rank, not a forked child)."""
        return self.store.is_writer and os.getpid() == self._pid

    def _lru_get_many(self, keys: list[str]) -> tuple[list[Any], list[int]]:
        """The LRU's value (or None) of each key, and the positions of the misses."""
        with self._lock:
            return self.lru.get_many(keys)

    def _lru_put(self, keys: list[str], values: list[Any]) -> None:
        """Adds values as the most recent entries."""
        if self.lru_size:
            with self._lock:
                self.lru.put_many(keys, values)

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
            keys = [_key(k) for k in keys]
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
                return _unstack_batch(stacked, len(keys), absent), absent
        stored, absent = store.get_batch(keys, copy=True)
        return _from_store_batch(stored, absent), absent

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
        pairs = [(_key(k), v) for k, v in items.items()]
        if self.is_writer:
            self._forget_legacy_index()
            if not self._schema_settled:
                self._settle_schema(pairs[0][0], _to_store(pairs[0][1]))
            self.store.put_batch([(k, _to_store(v, self._blobs)) for k, v in pairs])
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
        text = _read_text(self.schema_path)
        if text is None:
            inferred = _inferred_schema(key, first)
            if not _create_durably(self.schema_path, _without_ranks(inferred) or inferred):
                # Another writer (writer_id) fixed the schema first: use theirs.
                text = _read_text(self.schema_path)
        widened = None if text is None else _without_ranks(text)
        if widened is not None:
            _replace_durably(self.schema_path, widened)
        if text is None or widened is not None or not self._schema_seen_at_open:
            self.store.close()
            self.store = self._open_store()
        self._blobs = _blob_columns(_read_text(self.schema_path))
        self._schema_settled = True

    def _forget_legacy_index(self) -> None:
        """Remove torchcachex's ``index.pkl`` before the first new segment lands."""
        if self._legacy_index_checked:
            return
        _cachex._durable_remove(self.index_path)
        self._legacy_index_checked = True

    def flush(self) -> None:
        """Write every pending value and wait for queued writes (writer rank only).

        Raises
        ------
        cachex.CacheError
            A write (this one or an earlier async one) failed.
        """
        if self.is_writer:
            self.store.flush()

    def close(self) -> None:
        """Flush and release the writer lock; the backend is unusable after."""
        if not self.store.closed:
            if os.getpid() != self._pid:
                return  # a forked child leaves the parent's writer alone
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


# Batch tree helpers (torchcachex's _tree_index / _tree_stack semantics).
def _tree_index(x: Any, i: int) -> Any:
    if torch is not None and isinstance(x, torch.Tensor):
        return x[i]
    if isinstance(x, list):
        if x and torch is not None and isinstance(x[0], torch.Tensor):
            return x[i]  # a list of per-sample tensors (variable shapes)
        return [_tree_index(v, i) for v in x]
    if isinstance(x, tuple):
        return tuple(_tree_index(v, i) for v in x)
    if isinstance(x, dict):
        return {k: _tree_index(v, i) for k, v in x.items()}
    return x


def _tree_stack(samples: list[Any]) -> Any:
    if not samples:
        raise ValueError("cannot stack an empty list of samples")
    x0 = samples[0]
    if torch is not None and isinstance(x0, torch.Tensor):
        if all(s.shape == x0.shape for s in samples):
            return torch.stack(samples, dim=0)
        return samples  # variable shapes: a list keeps each one
    if isinstance(x0, list):
        return [_tree_stack([s[j] for s in samples]) for j in range(len(x0))]
    if isinstance(x0, tuple):
        return tuple(_tree_stack([s[j] for s in samples]) for j in range(len(x0)))
    if isinstance(x0, dict):
        return {k: _tree_stack([s[k] for s in samples]) for k in x0}
    return samples


def _cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _cpu(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_cpu(v) for v in obj)
    if isinstance(obj, list):
        return [_cpu(v) for v in obj]
    return obj


if nn is not None:

    class CacheModuleDecorator(nn.Module):
        """Read-through cache around a stateless module, per sample (torchcachex's).

        Calls look every sample's ``cache_ids`` up, run ``module`` only on
        the misses (rows of the first argument when it is a tensor), cache
        their outputs (detached, on CPU) and return the whole batch in
        input order, stacked, on the first argument's device.

        Parameters
        ----------
        module : nn.Module
            The computation; no trainable parameters while training unless
            ``enforce_stateless=False``.
        cache_backend : ArrowIPCCacheBackend
            Where outputs live.
        enabled : bool
            False runs ``module`` directly (True).
        key_from_batch_fn : callable, optional
            ``fn(*args, **kwargs) -> ids`` when calls carry no ``cache_ids``.
        enforce_stateless : bool
            Raise RuntimeError when the module has trainable parameters in
            training mode (True).
        map_location_on_read : str
            Where cached tensors are read to before moving to the input's
            device ("cpu").
        """

        def __init__(
            self,
            module: nn.Module,
            cache_backend: ArrowIPCCacheBackend,
            enabled: bool = True,
            key_from_batch_fn: Callable[..., list[str]] | None = None,
            enforce_stateless: bool = True,
            map_location_on_read: str = "cpu",
        ) -> None:
            super().__init__()
            self.module = module
            self.cache = cache_backend
            self.enabled = enabled
            self.key_from_batch_fn = key_from_batch_fn
            self.enforce_stateless = enforce_stateless
            self.map_location_on_read = map_location_on_read

        def _extract_keys(self, args: tuple, kwargs: dict) -> list[Any]:
            ids = kwargs.get("cache_ids")
            if ids is None and args and isinstance(args[0], dict) and "cache_ids" in args[0]:
                ids = args[0]["cache_ids"]
            if ids is None and self.key_from_batch_fn is not None:
                ids = self.key_from_batch_fn(*args, **kwargs)
            if ids is None:
                raise ValueError(
                    "CacheModuleDecorator requires `cache_ids` in kwargs or batch dict, "
                    "or provide `key_from_batch_fn` to derive per-sample keys."
                )
            if isinstance(ids, torch.Tensor):
                ids = ids.tolist()
            return list(ids)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            """The module's output for the batch, cached per sample."""
            clean = {k: v for k, v in kwargs.items() if k != "cache_ids"}
            if not self.enabled:
                return self.module(*args, **clean)
            keys = self._extract_keys(args, kwargs)
            cached, missing = self.cache.get_batch(keys, map_location=self.map_location_on_read)
            if self.enforce_stateless and self.training:
                for p in self.module.parameters(recurse=True):
                    if p.requires_grad:
                        raise RuntimeError(
                            "CacheModuleDecorator: wrapped module has trainable parameters "
                            "while caching is enabled. Set enforce_stateless=False to allow."
                        )
            ref = args[0] if args else None
            device = ref.device if isinstance(ref, torch.Tensor) else torch.device("cpu")
            if not missing:
                return _tree_stack([_move(v, device) for v in cached])
            sub_batch = isinstance(ref, torch.Tensor)
            if sub_batch:
                idx = torch.tensor(missing, dtype=torch.long, device=ref.device)
                call_args = (ref.index_select(0, idx), *args[1:])
            else:
                call_args = args  # the whole batch runs; outputs indexed by position
            with torch.no_grad():
                out = self.module(*call_args, **clean)
            if any(t.device.type == "mps" for t in _leaves(out)):
                torch.mps.synchronize()
            fresh: dict[int, Any] = {}
            for j, pos in enumerate(missing):
                fresh[pos] = _tree_index(out, j if sub_batch else pos)
            self.cache.put_batch({keys[pos]: _cpu(v) for pos, v in fresh.items()})
            merged = [fresh[i] if i in fresh else cached[i] for i in range(len(keys))]
            return _tree_stack([_move(v, device) for v in merged])

        def state_dict(self, *args: Any, **kwargs: Any) -> dict:
            """The wrapped module's state dict (the cache lives on disk, not in it)."""
            return self.module.state_dict(*args, **kwargs)

        def load_state_dict(
            self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
        ) -> Any:
            """Loads into the wrapped module."""
            return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def _leaves(obj: Any) -> list[Any]:
        if isinstance(obj, torch.Tensor):
            return [obj]
        if isinstance(obj, dict):
            return [t for v in obj.values() for t in _leaves(v)]
        if isinstance(obj, tuple | list):
            return [t for v in obj for t in _leaves(v)]
        return []

else:

    class CacheModuleDecorator:  # type: ignore[no-redef]
        """torchcachex's module decorator; needs PyTorch (not importable here)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise TorchRequiredError(
                "cachex.torchcachex.CacheModuleDecorator wraps a torch.nn.Module and needs "
                "PyTorch, which is not importable; ArrowIPCCacheBackend works without it"
            )
