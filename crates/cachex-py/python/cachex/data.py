"""Datasets over the cachex stores for training loops; torch is optional.

Map-style datasets (``len`` and ``dataset[i]``) over each store, and an
iterable one that streams a page file in FFCV's quasi-random page order:

=========================  ===============================================
:class:`SegmentDataset`    a segment store, item ``i`` is the record of ``keys[i]``
:class:`MemmapDataset`     a memmap-array cache, item ``i`` is row ``i``
:class:`ShardDataset`      a shard store (loadit layout), item ``i`` is item ``i``
:class:`PageDataset`       a page file, item ``i`` is sample ``i``
:class:`PageIterableDataset`  a page file, batches in quasi-random page order,
                           each DataLoader worker reading its own pages
=========================  ===============================================

``dataset[i]`` returns one item as the store gives it (read-only numpy views
of the mapped files where the store has them). ``dataset[indices]`` (a list,
array or slice of indices) returns the whole batch in one call: the page
file and memmap datasets copy the rows straight from the mapped files into
one buffer per field (``fill_batch``, with the GIL released), the others
stack the records into one buffer per field — no tensor per item. Pass
``out=`` to :meth:`~PageDataset.batch` to fill buffers you allocated (pinned
or reused); :meth:`~PageDataset.empty_batch` allocates them.

With torch installed, the classes are ``torch.utils.data.Dataset`` /
``IterableDataset`` subclasses. Give the DataLoader batches of indices and no
collation of its own::

    loader = DataLoader(
        dataset,
        sampler=BatchSampler(RandomSampler(dataset), batch_size=256, drop_last=False),
        batch_size=None,
        num_workers=4,
    )

``output="torch"`` makes batches torch tensors: in a DataLoader worker they
are allocated in shared memory (the worker's batch reaches the main process
without a copy), elsewhere pinned when ``pin_memory=True``. Without torch
the same classes work on numpy alone.

Worker processes
----------------
Every dataset holds store handles, which pickle as their path and options
and reopen in the process that unpickles them (``spawn``, ``forkserver``);
in a ``fork`` child each handle reopens on first use (``os.register_at_fork``
marks them), never touching the parent's descriptors, mappings or threads.
No ``worker_init_fn`` is needed. Datasets open their stores read-only.
"""

from __future__ import annotations

import multiprocessing
import operator
from collections.abc import Iterator, Sequence
from multiprocessing.context import get_spawning_popen
from typing import Any, Literal

import numpy as np

from cachex._cachex import MemmapArray, PageReader, SegmentStore, ShardStore
from cachex.errors import InvalidInputError

try:
    import torch
    from torch.utils.data import Dataset as _MapBase
    from torch.utils.data import IterableDataset as _IterableBase
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # numpy-only install
    torch = None

    class _MapBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.Dataset`` when torch is not installed."""

    class _IterableBase:  # type: ignore[no-redef]
        """Stand-in for ``torch.utils.data.IterableDataset`` when torch is not installed."""

    def _worker_info() -> None:
        return None


__all__ = [
    "HAS_TORCH",
    "MemmapDataset",
    "PageDataset",
    "PageIterableDataset",
    "SegmentDataset",
    "ShardDataset",
    "batch_indices",
    "collate",
    "worker_share",
]

#: Whether torch is importable (the dataset classes then subclass its datasets).
HAS_TORCH = torch is not None

Output = Literal["numpy", "torch"]


def worker_share(rank: int = 0, world_size: int = 1) -> tuple[int, int]:
    """This process's share of the data: ``(share, shares)``.

    ``shares`` is ``world_size`` times the DataLoader's worker count (one
    share per worker of every rank); outside a DataLoader worker a rank has
    one share.
    """
    if not 0 <= rank < world_size:
        raise InvalidInputError(
            f"rank {rank} of world_size {world_size}: give 0 <= rank < world_size"
        )
    info = _worker_info()
    if info is None:
        return rank, world_size
    return rank * info.num_workers + info.id, world_size * info.num_workers


def batch_indices(
    n: int, batch_size: int, *, shuffle: bool = False, seed: int = 0, drop_last: bool = False
) -> Iterator[list[int]]:
    """Batches of indices of ``range(n)``, for map-style datasets without a DataLoader."""
    if batch_size < 1:
        raise InvalidInputError(f"batch_size {batch_size}: give at least 1")
    order = np.random.default_rng(seed).permutation(n) if shuffle else np.arange(n)
    for start in range(0, n, batch_size):
        chunk = order[start : start + batch_size]
        if drop_last and len(chunk) < batch_size:
            return
        yield chunk.tolist()


# --- buffers ----------------------------------------------------------------


def _check_output(output: str, pin_memory: bool) -> None:
    if output not in ("numpy", "torch"):
        raise InvalidInputError(f"output {output!r}: give 'numpy' or 'torch'")
    if output == "torch" and torch is None:
        raise InvalidInputError("output='torch' needs torch installed")
    if pin_memory and output != "torch":
        raise InvalidInputError("pin_memory=True needs output='torch'")


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        except ImportError:
            return np.dtype("<u2")
    return np.dtype(name)


def _torch_dtype(dtype: np.dtype) -> Any:
    if dtype.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype


def _empty(shape: tuple[int, ...], dtype: np.dtype, output: Output, pin_memory: bool) -> Any:
    """An uninitialised buffer; in a DataLoader worker a torch one lives in shared memory."""
    if output == "numpy":
        return np.empty(shape, dtype)
    tdtype = _torch_dtype(dtype)
    if _worker_info() is not None:
        # As torch's default_collate: the batch goes to the main process
        # through shared memory, so allocate it there and skip the copy.
        numel = int(np.prod(shape, dtype=np.int64))
        proto = torch.empty(0, dtype=tdtype)
        storage = proto._typed_storage()._new_shared(numel, device="cpu")
        return proto.new(storage).resize_(shape)
    return torch.empty(shape, dtype=tdtype, pin_memory=pin_memory)


def _as_numpy(buf: Any, dtype: np.dtype | None = None) -> np.ndarray:
    """A numpy view of a numpy array or CPU torch tensor (no copy)."""
    if isinstance(buf, np.ndarray):
        return buf
    if torch is not None and isinstance(buf, torch.Tensor):
        if buf.dtype == torch.bfloat16:
            return buf.view(torch.int16).numpy().view(dtype or np.dtype("<u2"))
        return buf.numpy()
    raise InvalidInputError(f"a batch buffer must be a numpy array or CPU tensor, not {type(buf)}")


def _leaf(x: Any) -> np.ndarray | None:
    if isinstance(x, np.ndarray):
        return x
    if torch is not None and isinstance(x, torch.Tensor):
        return _as_numpy(x)
    return None


def collate(
    samples: Sequence[Any],
    *,
    out: Any = None,
    output: Output = "numpy",
    pin_memory: bool = False,
) -> Any:
    """Stacks items into one batch: arrays into one buffer each (``out``'s
    when given, with the same structure), numbers into one array, dicts,
    tuples and lists field by field; anything else stays a list."""
    if not samples:
        raise InvalidInputError("cannot collate an empty batch")
    first = samples[0]
    arr = _leaf(first)
    if arr is not None:
        leaves = [_leaf(s) for s in samples]
        if out is None:
            out = _empty((len(samples), *arr.shape), arr.dtype, output, pin_memory)
        try:
            np.stack(leaves, out=_as_numpy(out, arr.dtype)[: len(samples)])
        except (ValueError, TypeError) as e:
            raise InvalidInputError(f"cannot stack the batch's arrays: {e}") from e
        return out[: len(samples)]
    if isinstance(first, (bool, int, float, np.number)):
        values = np.asarray(samples)
        if output == "torch":
            return torch.as_tensor(values)
        return values
    if isinstance(first, dict):
        return {
            k: collate(
                [s[k] for s in samples],
                out=None if out is None else out[k],
                output=output,
                pin_memory=pin_memory,
            )
            for k in first
        }
    if isinstance(first, (tuple, list)):
        parts = [
            collate(
                [s[j] for s in samples],
                out=None if out is None else out[j],
                output=output,
                pin_memory=pin_memory,
            )
            for j in range(len(first))
        ]
        return type(first)(parts) if type(first) in (tuple, list) else parts
    return list(samples)


# --- map-style datasets ------------------------------------------------------


class _Batched(_MapBase):
    """``dataset[i]`` is one item, ``dataset[indices]`` one batch (see :meth:`batch`)."""

    output: Output
    pin_memory: bool

    def _setup(self, output: Output, pin_memory: bool) -> None:
        _check_output(output, pin_memory)
        self.output = output
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        raise NotImplementedError

    def item(self, i: int) -> Any:
        raise NotImplementedError

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        raise NotImplementedError

    def __getitem__(self, index: Any) -> Any:
        try:
            i = operator.index(index)
        except TypeError:
            return self.batch(self._indices(index))
        return self.item(i)

    def _indices(self, index: Any) -> list[int]:
        if isinstance(index, slice):
            return list(range(*index.indices(len(self))))
        if torch is not None and isinstance(index, torch.Tensor):
            index = index.tolist()
        return [operator.index(i) for i in np.asarray(index).reshape(-1).tolist()]


class MemmapDataset(_Batched):
    """Rows of a memmap-array cache: ``dataset[i]`` is ``{name: array}``
    (read-only views, ``None`` for a null entry), ``dataset[indices]`` one
    buffer per array, filled from the mapped files by ``fill_batch``.

    Parameters
    ----------
    path
        The cache directory (finished).
    arrays
        The arrays to return (default: all).
    load_in_memory, ram_fraction
        As :class:`cachex.MemmapArray`; a worker that unpickles the dataset
        loads its own copy.
    output, pin_memory
        The type of batches (see the module docs).
    """

    def __init__(
        self,
        path: Any,
        *,
        arrays: Sequence[str] | None = None,
        load_in_memory: bool = False,
        ram_fraction: float | None = None,
        output: Output = "numpy",
        pin_memory: bool = False,
    ) -> None:
        self._setup(output, pin_memory)
        kwargs: dict[str, Any] = {"load_in_memory": load_in_memory}
        if ram_fraction is not None:
            kwargs["ram_fraction"] = ram_fraction
        self.cache = MemmapArray(path, **kwargs)
        schema = self.cache.schema["arrays"]
        self.arrays = list(schema) if arrays is None else list(arrays)
        unknown = [a for a in self.arrays if a not in schema]
        if unknown:
            raise InvalidInputError(f"{path}: no arrays {unknown} (it has {list(schema)})")
        self._specs = {
            a: (_numpy_dtype(schema[a]["dtype"]), tuple(schema[a]["shape"]), schema[a]["nullable"])
            for a in self.arrays
        }

    def __len__(self) -> int:
        return len(self.cache)

    def item(self, i: int) -> dict[str, Any]:
        row = self.cache.get_row(i)
        return {a: row[a] for a in self.arrays}

    def empty_batch(self, n: int) -> dict[str, Any]:
        """Uninitialised buffers for ``n`` rows of every array (reuse them with ``out=``)."""
        return {
            a: _empty((n, *shape), dtype, self.output, self.pin_memory)
            for a, (dtype, shape, _) in self._specs.items()
        }

    def batch(self, indices: Sequence[int], out: dict[str, Any] | None = None) -> dict[str, Any]:
        """Rows ``indices`` as ``{name: buffer}`` (``out``'s first rows when given).

        A nullable array also gets ``"<name>_present"``: which rows have it
        (the others are zero-filled).
        """
        indices = list(indices)
        n = len(indices)
        out = self.empty_batch(n) if out is None else out
        present = self.cache.fill_batch(
            indices, {a: _as_numpy(out[a], self._specs[a][0]) for a in self.arrays}
        )
        batch = {a: out[a][:n] for a in self.arrays}
        for a, rows in present.items():
            batch[f"{a}_present"] = np.asarray(rows, dtype=bool)
        return batch


class PageDataset(_Batched):
    """Samples of a page file: ``dataset[i]`` is ``{field: value}`` (ints and
    floats by value, bytes and arrays as read-only views), ``dataset[indices]``
    one buffer per field filled from the mapped pages by ``fill_batch``: int64
    for ints, float64 for floats, ``(n, *shape)`` for arrays and zero-padded
    uint8 ``(n, max size)`` for bytes, with ``"<field>_lengths"`` (int64).
    """

    def __init__(
        self,
        path: Any,
        *,
        fields: Sequence[str] | None = None,
        populate: bool = False,
        output: Output = "numpy",
        pin_memory: bool = False,
    ) -> None:
        self._setup(output, pin_memory)
        self.reader = PageReader(path, populate=populate)
        kinds = self.reader.fields
        self.fields = list(kinds) if fields is None else list(fields)
        unknown = [f for f in self.fields if f not in kinds]
        if unknown:
            raise InvalidInputError(f"{path}: no fields {unknown} (it has {list(kinds)})")
        widths = self.reader.max_sizes
        self._specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for f in self.fields:
            kind = kinds[f]
            if kind == "int":
                self._specs[f] = (np.dtype(np.int64), ())
            elif kind == "float":
                self._specs[f] = (np.dtype(np.float64), ())
            elif kind == "bytes":
                self._specs[f] = (np.dtype(np.uint8), (max(int(widths[f]), 1),))
            else:
                self._specs[f] = (_numpy_dtype(kind[0]), tuple(kind[1]))

    def __len__(self) -> int:
        return len(self.reader)

    def item(self, i: int) -> dict[str, Any]:
        sample = self.reader.sample(i)
        return {f: sample[f] for f in self.fields}

    def empty_batch(self, n: int) -> dict[str, Any]:
        """Uninitialised buffers for ``n`` samples of every field (reuse them with ``out=``)."""
        return {
            f: _empty((n, *shape), dtype, self.output, self.pin_memory)
            for f, (dtype, shape) in self._specs.items()
        }

    def batch(self, indices: Sequence[int], out: dict[str, Any] | None = None) -> dict[str, Any]:
        """Samples ``indices`` as ``{field: buffer}`` (``out``'s first rows when given)."""
        n = len(self.reader)
        indices = [i + n if i < 0 else i for i in indices]
        out = self.empty_batch(len(indices)) if out is None else out
        lengths = self.reader.fill_batch(
            indices, {f: _as_numpy(out[f], self._specs[f][0]) for f in self.fields}
        )
        batch = {f: out[f][: len(indices)] for f in self.fields}
        for f, lens in lengths.items():
            batch[f"{f}_lengths"] = np.asarray(lens, dtype=np.int64)
        return batch


class SegmentDataset(_Batched):
    """Records of a segment store in the order of ``keys``: ``dataset[i]`` is
    the record of ``keys[i]`` (views of the mapped segments),
    ``dataset[indices]`` the records stacked field by field (:func:`collate`).
    A key not in the store raises ``KeyError`` naming it and the store.

    ``options`` are :class:`cachex.SegmentStore`'s; the store opens read-only
    unless ``read_only=False`` is given.
    """

    def __init__(
        self,
        path: Any,
        keys: Sequence[str],
        *,
        output: Output = "numpy",
        pin_memory: bool = False,
        **options: Any,
    ) -> None:
        self._setup(output, pin_memory)
        options.setdefault("read_only", True)
        self.store = SegmentStore(path, **options)
        self.keys = list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def _records(self, keys: list[str]) -> list[Any]:
        values, missing = self.store.get_batch(keys)
        if missing:
            raise KeyError(f"{self.store.path}: key {keys[missing[0]]!r} is not in the store")
        return values

    def item(self, i: int) -> Any:
        return self._records([self.keys[i]])[0]

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        """The records of ``keys[indices]``, stacked (into ``out`` when given)."""
        records = self._records([self.keys[i] for i in indices])
        return collate(records, out=out, output=self.output, pin_memory=self.pin_memory)


class ShardDataset(_Batched):
    """Items of a shard store (loadit's layout): ``dataset[i]`` is item ``i``
    (unpickled), ``dataset[indices]`` the items stacked by :func:`collate`
    (arrays and numbers into buffers, other objects as a list).

    ``source`` and ``options`` are :class:`cachex.ShardStore`'s. A worker
    started by ``spawn`` or ``forkserver`` unpickles the dataset, so
    ``source`` must then be picklable (a module-level function) or ``None``
    (read what is cached).
    """

    def __init__(
        self,
        root: Any,
        source: Any = None,
        *,
        output: Output = "numpy",
        pin_memory: bool = False,
        **options: Any,
    ) -> None:
        self._setup(output, pin_memory)
        self.store = ShardStore(root, source, **options)
        self._len = len(self.store)

    def __len__(self) -> int:
        return self._len

    def item(self, i: int) -> Any:
        return self.store[i]

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        """Items ``indices``, stacked (into ``out`` when given)."""
        items = self.store.get_many(list(indices))
        return collate(items, out=out, output=self.output, pin_memory=self.pin_memory)


# --- iterable dataset --------------------------------------------------------


class _SharedEpoch:
    """The epoch, in shared memory so that ``set_epoch`` in the main process
    reaches persistent DataLoader workers too. It travels to workers as
    shared memory (fork, spawn, forkserver) and pickles as a plain number
    anywhere else."""

    def __init__(self, epoch: int = 0) -> None:
        self.value = multiprocessing.RawValue("q", epoch)

    def get(self) -> int:
        return int(self.value.value)

    def set(self, epoch: int) -> None:
        self.value.value = epoch

    def __reduce__(self) -> Any:
        if get_spawning_popen() is not None:
            return (_shared_epoch, (self.value,))
        return (_SharedEpoch, (self.get(),))


def _shared_epoch(value: Any) -> _SharedEpoch:
    epoch = _SharedEpoch.__new__(_SharedEpoch)
    epoch.value = value
    return epoch


class PageIterableDataset(_IterableBase):
    """Batches of a page file in FFCV's quasi-random order, each DataLoader
    worker (and each rank) reading its own pages.

    Pages are shuffled per epoch (``seed`` and :meth:`set_epoch`), dealt out
    whole to the ``world_size * num_workers`` shares so that the shares are
    disjoint and together hold every sample once, and each share's samples are
    shuffled within windows of ``window_pages`` pages: a worker keeps only a
    few pages resident and never reads a page another worker reads. With
    ``shuffle=False`` each share is a contiguous run of samples in file order.

    Iterating yields batches as :meth:`PageDataset.batch` does (``batch_size``
    samples, the last one smaller unless ``drop_last``), or single samples
    when ``batch_size`` is None. Use ``DataLoader(dataset, batch_size=None,
    num_workers=...)``. The next batch's pages are prefetched
    (``madvise(WILLNEED)``) while the current one is in use.

    ``reuse_buffers=True`` fills the same buffers for every batch outside
    DataLoader workers (no allocation per batch; a batch is valid until the
    next one is requested). Inside workers each batch gets its own buffer,
    since it is handed to another process.

    Call ``set_epoch(e)`` before each epoch for a new order; it reaches
    persistent workers too.
    """

    def __init__(
        self,
        path: Any,
        batch_size: int | None = None,
        *,
        fields: Sequence[str] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        window_pages: int = 8,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        output: Output = "numpy",
        pin_memory: bool = False,
        reuse_buffers: bool = False,
        populate: bool = False,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise InvalidInputError(f"batch_size {batch_size}: give at least 1 or None")
        if not 0 <= rank < world_size:
            raise InvalidInputError(f"rank {rank} of world_size {world_size}")
        self.pages = PageDataset(
            path, fields=fields, populate=populate, output=output, pin_memory=pin_memory
        )
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.window_pages = window_pages
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.reuse_buffers = reuse_buffers
        self._epoch = _SharedEpoch()

    @property
    def epoch(self) -> int:
        """The epoch whose order the next iteration reads."""
        return self._epoch.get()

    def set_epoch(self, epoch: int) -> None:
        """Selects the order of the next iterations (as ``DistributedSampler.set_epoch``)."""
        self._epoch.set(epoch)

    def order(self, share: int | None = None, shares: int | None = None) -> list[int]:
        """The sample indices this process (or share ``share`` of ``shares``) reads this epoch."""
        if share is None or shares is None:
            share, shares = worker_share(self.rank, self.world_size)
        n = len(self.pages)
        if not self.shuffle:
            lo, hi = n * share // shares, n * (share + 1) // shares
            return list(range(lo, hi))
        seed = (self.seed * 0x9E3779B97F4A7C15 + self.epoch) % (1 << 64)
        return self.pages.reader.quasi_random_order(
            seed, self.window_pages, share=share, shares=shares
        )

    def __iter__(self) -> Iterator[Any]:
        order = self.order()
        if self.batch_size is None:
            for i in order:
                yield self.pages.item(i)
            return
        bs = self.batch_size
        batches = [order[k : k + bs] for k in range(0, len(order), bs)]
        if self.drop_last and batches and len(batches[-1]) < bs:
            batches.pop()
        reader = self.pages.reader
        reuse = self.reuse_buffers and _worker_info() is None
        buffers = self.pages.empty_batch(bs) if reuse and batches else None
        for k, indices in enumerate(batches):
            if k + 1 < len(batches):
                reader.prefetch(batches[k + 1])
            yield self.pages.batch(indices, out=buffers)
