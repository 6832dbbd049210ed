"""``LoadIt``: loadit 0.0.8's random access to an iterable, on cachex's engine.

See :mod:`cachex.loadit` for the differences from loadit.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from cachex import _cachex
from cachex._remote import TierBudget, is_url, tier_kwargs
from cachex.dropins._not_provided import not_provided
from cachex.dropins.loadit.util import Indices, SequenceView, is_sequence

__all__ = [
    "LoadIt",
    "LoaditView",
    "PreloadType",
    "ShardInfo",
    "ShardObserver",
    "preload_next_shard",
]

PreloadType = Callable[[Any, int], Iterable[list[int]]]

# Items per get_many call when iterating (bounds the list built at once).
_ITER_CHUNK = 65536


def preload_next_shard(loader: LoadIt, idx: int) -> list[list[int]]:
    """loadit's default ``preload_fn``: the ``max_workers // 2 - 1`` shards
    after the one holding ``idx`` (none below ``max_workers=4``).

    Passed as itself (the default), the engine preloads those same shards,
    scheduled in Rust instead of through this function.
    """
    return [[idx + i * loader.shards.max_shard_length] for i in range(1, loader.max_workers // 2)]


def _next_shards(max_workers: int) -> int:
    """How many shards :func:`preload_next_shard` asks for."""
    return len(range(1, max_workers // 2))


def _byte_budget(memory_limit: Any) -> int:
    """``memory_limit`` (an int or a float, as loadit takes) as whole bytes."""
    wrong = TypeError(f"memory_limit must be a number of bytes, not {type(memory_limit).__name__}")
    if isinstance(memory_limit, str | bytes):
        raise wrong
    try:
        limit = operator.index(memory_limit)
    except TypeError:
        try:
            value = float(memory_limit)
        except (TypeError, ValueError):
            raise wrong from None
        if not math.isfinite(value):
            raise ValueError(f"memory_limit must be finite, got {memory_limit!r}") from None
        limit = math.floor(value)
    if limit < 0:
        raise ValueError(f"memory_limit must be non-negative, got {memory_limit!r}")
    return limit


class ShardInfo(NamedTuple):
    """A shard file on disk, as ``loader.shards.get_all_shards()`` lists it
    (loadit's ``loadit.sharded_dataset.ShardInfo``)."""

    path: Path
    """The shard file."""
    start: int
    """Its first item's index."""
    end: int
    """One past its last item's index."""
    size: int
    """Its size in bytes (compressed, when the root is)."""


class _IterableSource:
    """A re-iterable (a list, a dataset object) as a factory of iterators."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable

    def __call__(self) -> Iterator[Any]:
        return iter(self.iterable)


class ShardObserver:
    """``loader.shards.observer``: loadit's ``watchdog`` observer, which
    cachex does not run.

    loadit watched ``shards/`` with a ``watchdog`` thread to date the shard
    files other processes created, for its eviction order; cachex's engine
    dates the shards itself, so no thread watches anything. The clean-up
    calls loadit users make (``unschedule_all()``, ``stop()``, ``join()``)
    therefore return at once, and :meth:`is_alive` says ``False``.
    """

    def start(self) -> None:
        """Nothing to start: no thread watches the shard directory."""

    def schedule(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to schedule: the engine dates shard files itself."""

    def unschedule_all(self) -> None:
        """Nothing is scheduled."""

    def stop(self) -> None:
        """Nothing runs, so nothing stops."""

    def join(self, timeout: float | None = None) -> None:
        """Returns at once: there is no thread to wait for."""

    def is_alive(self) -> bool:
        """``False``: no observer thread runs."""
        return False


class _Shards:
    """``loader.shards``: what loadit users read from loadit's
    ``ShardedDataset``, answered by the engine (the shard files on disk)."""

    def __init__(self, store: _cachex.ShardStore, memory_limit: int | None) -> None:
        self._store = store
        self.max_size = memory_limit
        self.observer = ShardObserver()

    @property
    def max_shard_length(self) -> int:
        """Items per full shard."""
        return self._store.max_shard_length

    @property
    def root_dir(self) -> Path:
        """The root directory."""
        return Path(self._store.root)

    @property
    def shard_dir(self) -> Path:
        """Where the shard files are (``root_dir / "shards"``)."""
        return self.root_dir / "shards"

    def length(self) -> int | None:
        """The length if known (no work), else ``None``."""
        return self._store.known_len

    def __len__(self) -> int:
        if (n := self._store.known_len) is None:
            raise RuntimeError("Length is currently unknown for this ShardedDataset!")
        return n

    def info(self) -> Any:
        """The ``info`` stored in ``metadata.json``."""
        return self._store.info

    def set_info(self, info: Any) -> None:
        """Replaces ``info`` in ``metadata.json``."""
        self._store.set_info(info)

    def all_present(self) -> bool:
        """Whether every shard is on disk (False while the length is unknown)."""
        return self._store.all_cached_to_disk()

    def size(self) -> int:
        """Bytes of the shard files on disk: what ``memory_limit`` bounds."""
        return self._store.disk_bytes()

    def get_all_shards(self) -> list[ShardInfo]:
        """Every shard file on disk, by start."""
        return [ShardInfo(Path(p), a, b, n) for p, a, b, n in self._store.shard_files()]

    @property
    def _cache_miss_count(self) -> int:
        """Shard lookups (background ones too) that found no shard file and
        had the source generate it, since the loader opened."""
        return self._store.counters()["disk_misses"]

    def stop_observer(self) -> None:
        """Nothing to stop (see :class:`ShardObserver`)."""


class _MemoryCache:
    """``loader.memory_cache``: loadit's ``DictCache`` of decoded shards,
    answered by the engine's in-memory shard cache."""

    def __init__(self, store: _cachex.ShardStore, max_cache_size: int) -> None:
        self._store = store
        self.max_size = max_cache_size

    def size(self) -> int:
        """Decoded shards held in memory (at most ``max_cache_size``)."""
        return self._store.cached_shards

    def __contains__(self, start: object) -> bool:
        """Whether the shard starting at item ``start`` is decoded in memory."""
        return isinstance(start, int) and start >= 0 and self._store.is_cached(start)

    @property
    def _cache_miss_count(self) -> int:
        """Foreground reads whose shard was not in memory (read from disk or
        generated), since the loader opened."""
        return self._store.counters()["memory_misses"]


class _Writer:
    """One of ``loader.writer_pool.writers``: a replay of the source (a
    cursor of the engine)."""

    def __init__(self, store: _cachex.ShardStore, k: int) -> None:
        self._store, self._k = store, k

    @property
    def current_idx(self) -> int:
        """Index of the last item this replay pulled (-1 before any)."""
        cursor = self._store.cursors()[self._k]
        return -1 if cursor is None else cursor[0] - 1

    @property
    def finished(self) -> bool:
        """Whether this replay reached the end of the source."""
        cursor = self._store.cursors()[self._k]
        return cursor is not None and cursor[1]


class _WriterPool:
    """``loader.writer_pool``: the ``max_workers`` replays of the source
    (loadit's ``WriterPool``; the engine picks the replay for each shard)."""

    def __init__(self, store: _cachex.ShardStore, max_workers: int) -> None:
        self.writers = [_Writer(store, k) for k in range(max_workers)]


class LoadIt(SequenceView):
    """Random access to the items of an iterable, cached on disk in shards.

    Same signature, defaults and on-disk layout as loadit 0.0.8's ``LoadIt``
    (``root_dir/metadata.json``, ``shards/<start>.<end>.shard.pickle``,
    ``locks/``, ``scratch/``): roots written by one are read by the other.
    The Rust ``ShardStore`` does the files, fsyncs, locks, the in-memory
    shard cache, eviction and regeneration; Python only pickles.

    **Opening a root unpickles its shards**: open only roots you trust, as
    with loadit or ``pickle.load``.

    ``root_dir`` may be a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
    ``file://``; cachex only): shards published there are read through the
    machine's local tier, shards generated here are published by
    :meth:`flush` / :meth:`close` (and, without them, every few seconds,
    when dropped and at the interpreter's exit), and :meth:`refresh` applies what others
    published since. ``root_dir`` is then the local working directory and
    :attr:`url` the URL (without credentials). On a URL, ``compression=None``
    does not adopt the root's compression: give the one it was written with.

    Parameters
    ----------
    root_dir : str or os.PathLike
        Where the shards live: a directory, or a URL.
    create_iter : callable, optional
        Returns a fresh iterable of the same items in the same order on
        every call. ``None``: only cached items can be read.
    max_shard_length : int or str
        Items per shard, or a size target ``"<N>mb"`` estimated from the
        first items (default ``"64mb"``). An existing root keeps its own.
    max_cache_size : int
        Decoded shards kept in memory (128).
    max_workers : int
        Iterator copies and background workers (1); more than 1 needs
        ``iterator_thread_safe=True``.
    memory_limit : int or float, optional
        Disk budget in bytes for the shard files (a float is rounded down);
        least recently used shards are deleted and regenerated on demand.
    compression : str, optional
        ``None`` or ``"zstd"`` (``shards/*.shard.pickle.zstd``). ``None``
        on an existing root adopts the root's compression.
    preload_fn : callable, optional
        ``preload_fn(loader, idx)`` yields lists of indices to load in the
        background after an access (needs ``max_workers > 1``). The default,
        :func:`preload_next_shard`, is run by the engine (the same shards);
        ``None`` disables preloading. Assigning ``loader.preload_fn`` later
        takes effect from the next access, as in loadit.
    preload_all_async : bool
        Fill the whole cache in the background (needs ``max_workers > 1``).
    info : JSON-able, optional
        Stored in ``metadata.json`` (replacing what is stored, as loadit).
    iterator_thread_safe : bool
        Acknowledges that ``create_iter`` may run in several threads.
    length : int, optional
        The length, if known: ``len(loader)`` returns it until the true
        length is discovered, instead of iterating to the end.
    mode : int
        Accepted for loadit compatibility; files get the process umask.
    tier_dir, tier_budget, storage_options
        cachex only, keyword, for a URL root: the local tier's directory
        (default ``CACHEX_TIER_DIR``), its budget (bytes or a size such as
        ``"20G"``) and the object store's options (``aws_endpoint``, ...;
        credentials stay in the environment).
    """

    def __init__(
        self,
        root_dir: str | Path,
        create_iter: Callable[[], Iterable[Any]] | None = None,
        max_shard_length: str | int | None = "64mb",
        max_cache_size: int = 128,
        max_workers: int = 1,
        memory_limit: float | None = None,
        compression: str | None = None,
        preload_fn: PreloadType | None = preload_next_shard,
        preload_all_async: bool = False,
        info: Any = None,
        iterator_thread_safe: bool = False,
        length: int | None = None,
        mode: int = 0o644,
        *,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: TierBudget | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        if not iterator_thread_safe and max_workers != 1:
            raise ValueError(
                "If you want to use max_workers>1, you must set iterator_thread_safe=True "
                f"(requested max_workers={max_workers})"
            )
        if preload_all_async and max_workers < 2:
            raise ValueError("preload_all_async=True needs max_workers > 1")
        source: Callable[[], Iterable[Any]] | None
        if create_iter is None or callable(create_iter):
            source = create_iter
        elif hasattr(create_iter, "__iter__"):
            source = _IterableSource(create_iter)
        else:
            raise TypeError("create_iter must be a function returning an iterable")
        if source is None:
            max_shard_length = None
        # On a URL, metadata.json is known only once the store has opened.
        metadata = None if is_url(root_dir) else Path(root_dir) / "metadata.json"
        if compression is None and source is not None and metadata and metadata.exists():
            # loadit treats None as "whatever the root has". A damaged
            # metadata.json is left for the store to report (typed, named).
            try:
                stored = json.loads(metadata.read_text())
            except (OSError, ValueError):
                stored = None
            if isinstance(stored, dict) and isinstance(stored.get("compression"), str):
                compression = stored["compression"]
        if memory_limit is not None:
            memory_limit = _byte_budget(memory_limit)
        self.indices, self.index_map, self.length = None, None, None
        self.max_workers = max_workers
        self.manual_length = length
        self._store = _cachex.ShardStore(
            root_dir,
            source,
            max_shard_length=max_shard_length,
            max_cache_size=max_cache_size,
            max_workers=max_workers,
            memory_limit=memory_limit,
            compression=compression,
            preload=0,  # set by the preload_fn setter
            preload_all_async=preload_all_async,
            length=length,
            info=info,
            **tier_kwargs(tier_dir, tier_budget, storage_options),
        )
        self.preload_fn = preload_fn
        self.root_dir = Path(self._store.root)
        self.shards = _Shards(self._store, memory_limit)
        self.memory_cache = _MemoryCache(self._store, max_cache_size)
        self.writer_pool = None if source is None else _WriterPool(self._store, max_workers)

    @property
    def preload_fn(self) -> PreloadType | None:
        """What is loaded in the background after an access: loadit's
        ``preload_fn`` (:func:`preload_next_shard` by default, ``None`` for
        nothing). Assigning it takes effect from the next access."""
        return self._preload_fn

    @preload_fn.setter
    def preload_fn(self, fn: PreloadType | None) -> None:
        self._preload_fn = fn
        # The default runs in the engine; another function runs here.
        self._python_preload = None if fn is None or fn is preload_next_shard else fn
        self._store.set_preload(_next_shards(self.max_workers) if fn is preload_next_shard else 0)

    @property
    def url(self) -> str | None:
        """The URL of the root without credentials (cachex only; None for a directory)."""
        return self._store.url

    def flush(self) -> None:
        """Publishes the shards generated since the last publish (cachex only;
        nothing for a local root)."""
        self._store.flush()

    def refresh(self) -> int:
        """Applies what other processes published since (cachex only); returns
        the number of commits applied (0 for a local root)."""
        return self._store.refresh()

    def close(self) -> None:
        """Publishes (on a URL) and closes the store (cachex only)."""
        self._store.close()

    def __enter__(self) -> LoadIt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> Any:
        """The ``info`` stored in ``metadata.json``."""
        return self._store.info

    def set_info(self, info: Any) -> None:
        """Replaces ``info`` in ``metadata.json`` (must be JSON-able)."""
        self._store.set_info(info)

    def all_cached_to_disk(self) -> bool:
        """Whether every item is in a shard file (False while the length is unknown)."""
        return self._store.all_cached_to_disk()

    def wait_until_all_cached(self) -> None:
        """Returns once every shard is on disk.

        With a source and no ``preload_all_async``, this call caches the
        missing shards itself; under a ``memory_limit`` too small for the
        whole cache it returns after that pass (loadit waited forever).
        """
        self._store.wait_until_all_cached()

    def load_async(self, idx_list: Sequence[int]) -> None:
        """Loads the shards holding ``idx_list`` in the background (needs
        ``max_workers > 1``; otherwise does nothing, as loadit)."""
        self._store.load_async([self._nonnegative(i) for i in idx_list])

    def get_start_idx(self, idx: int) -> int:
        """The first index of the shard holding ``idx``."""
        return idx - idx % self._store.max_shard_length

    def __len__(self) -> int:
        return len(self._store)

    def __getitem__(self, key: Any) -> Any:
        if type(key) is int and self._python_preload is None:
            return self._store[key]
        return self.get(key)

    def get(self, *idx: Any, preload_fn: PreloadType | None = None) -> Any:
        """``loader[idx]``, with ``preload_fn`` in place of the loader's."""
        key: Any = idx[0] if len(idx) == 1 else idx
        if isinstance(key, slice):
            return LoaditView(self, self._slice_range(key))
        if is_sequence(key):
            return LoaditView(self, key)
        i = operator.index(key)
        preload_fn = preload_fn or self._python_preload
        if preload_fn is not None and self.max_workers > 1:
            i = self._nonnegative(i)
            for idx_list in preload_fn(self, i):
                self.load_async(idx_list)
        return self._store[i]

    def __iter__(self) -> Iterator[Any]:
        n = self._store.known_len
        if n is not None:
            return self._items(range(n))
        return self._iter_to_the_end()

    def _iter_to_the_end(self) -> Iterator[Any]:
        """Iteration while the length is unknown: shard by shard until the end."""
        start, shard = 0, self._store.max_shard_length
        n = self._store.known_len
        while n is None:
            try:
                items = self._store.get_many(list(range(start, start + shard)))
            except IndexError:
                # The end is inside this shard (maybe found by another
                # process): the length is cheap to learn now.
                n = len(self._store)
                break
            yield from items
            start += shard
            n = self._store.known_len
        yield from self._items(range(start, n))

    def _items(self, indices: Indices) -> Iterator[Any]:
        """The items at ``indices``, read in chunks by the engine and chained
        in C (no Python frame per item)."""
        n = len(indices)
        chunks = (
            _index_chunk(indices, s, min(n, s + _ITER_CHUNK)) for s in range(0, n, _ITER_CHUNK)
        )
        return itertools.chain.from_iterable(map(self._store.get_many, chunks))

    def _nonnegative(self, index: Any) -> int:
        i = operator.index(index)
        return i + len(self) if i < 0 else i

    def _slice_range(self, s: slice) -> range:
        """The indices of ``loader[s]``, without the length when avoidable."""
        n = self._store.known_len
        if n is None and s.stop is not None:
            start = 0 if s.start is None else operator.index(s.start)
            stop, step = operator.index(s.stop), 1 if s.step is None else operator.index(s.step)
            if step > 0 and 0 <= start and 0 <= stop:
                if stop <= start:
                    return range(0)
                try:
                    self._store[stop - 1]  # the slice ends inside the items
                    return range(start, stop, step)
                except IndexError:
                    pass  # it does not: the length is known now
        return range(*s.indices(len(self)))

    def finalize(self) -> None:
        """Declares that the items end where the shards on disk end: the end
        of the furthest shard file becomes the final length, recorded in
        ``metadata.json`` (loadit's ``finalize``). A length already final is
        kept: the engine records it when the source ends."""
        self._store.finalize()

    # loadit's thread pool, which the Rust engine replaces (see the module docs).
    executor = not_provided(
        "background loads run on the engine's own threads (max_workers - 1 of "
        "them); schedule them with load_async()"
    )

    @property
    def seq(self) -> LoadIt:  # type: ignore[override]
        """The sequence viewed (``SequenceView``'s attribute): the loader itself."""
        return self

    def __repr__(self) -> str:
        return f"LoadIt({self.url or str(self.root_dir)!r})"


class LoaditView(SequenceView):
    """A lazy view of a ``LoadIt`` through an index sequence (what
    ``loader[a:b]``, ``loader[[i, j, k]]`` and ``loader[array]`` return).

    Iterating it reads the items in batches (shards visited once per batch).
    """

    def __init__(self, loader: LoadIt, indices: Indices) -> None:
        super().__init__(loader, indices)
        self.loader = loader
        self._indices = indices

    def preload_fn(self, loader: LoadIt, idx: int) -> list[list[int]]:
        """Preloads the shards of the view's next ``max_workers // 2`` items."""
        n = len(self._indices)
        ahead = range(idx + 1, min(n, idx + max(1, loader.max_workers // 2) + 1))
        return [[loader._nonnegative(int(self._indices[j])) for j in ahead]]

    def _item(self, index: Any) -> Any:
        i = operator.index(index)
        target = self._indices[i]
        if self.loader.max_workers > 1 and self.loader._python_preload is None:
            self.loader.load_async(self.preload_fn(self.loader, i % len(self))[0])
        return self.loader.get(target)

    def __getitem__(self, *idx: Any) -> Any:
        key = idx[0] if len(idx) == 1 else idx
        if isinstance(key, slice):
            key = range(*key.indices(len(self)))
        if is_sequence(key):
            return LoaditView(self.loader, SequenceView(self._indices, key))
        return self._item(key)

    def __iter__(self) -> Iterator[Any]:
        return self.loader._items(self._indices)


def _index_chunk(indices: Indices, start: int, stop: int) -> Sequence[int]:
    """``indices[start:stop]`` as the engine takes it (a sequence of ints).

    Lists, tuples, ranges and numpy arrays are sliced whole (no Python call
    per index: the engine converts each entry with ``__index__``, as
    ``operator.index`` does); any other sequence is read entry by entry.
    """
    if isinstance(indices, list | tuple | range):
        return indices[start:stop]
    if isinstance(indices, np.ndarray) and indices.ndim == 1:
        chunk: list[int] = indices[start:stop].tolist()
        return chunk
    return [operator.index(indices[j]) for j in range(start, stop)]
