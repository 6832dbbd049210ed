"""Datasets over the cachex stores for training loops; torch is optional.

Map-style datasets (``len`` and ``dataset[i]``) over each store, and the
iterable and sampler forms that read them in the order of one
:class:`~cachex.sampling.SamplingPlan` (blocks shuffled, then the samples
within each block; dealt evenly to ranks and DataLoader workers; resumable):

=============================  ===============================================
:class:`SegmentDataset`        a segment store, item ``i`` is the record of ``keys[i]``
:class:`MemmapDataset`         a memmap-array cache, item ``i`` is row ``i``
:class:`ShardDataset`          a shard store (loadit layout), item ``i`` is item ``i``
:class:`PageDataset`           a page file, item ``i`` is sample ``i``
:class:`BetonDataset`          an FFCV ``.beton`` file, item ``i`` is sample ``i``
:class:`IterableBatches`       batches of any of them in plan order
                               (``dataset.iterable(batch_size)``)
:class:`PlanSampler`           batches of indices in plan order, for a
                               DataLoader's ``sampler`` (``dataset.sampler(batch_size)``)
=============================  ===============================================

:class:`IterableBatches` is the one iterable type, over any of them
(``PageDataset(path).iterable(256)``).

Each dataset's ``blocks()`` is the layout its plan keeps together: the
pages of a page file or a ``.beton`` (FFCV's quasi-random order), the
shards of a shard store, runs of rows (about 1 MiB) of a memmap array, runs
of keys of a segment store. The rank comes from ``torch.distributed`` or
``RANK``/``WORLD_SIZE`` (explicit ``rank`` and ``world_size`` override
them); every rank yields the same number of batches.
``state_dict()`` / ``load_state_dict()`` resume an epoch, also with another
world size or worker count; with DataLoader workers, take the state from
:class:`cachex.torch.ResumableDataLoader`.

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

    loader = DataLoader(dataset, sampler=dataset.sampler(256), batch_size=None, num_workers=4)
    loader = DataLoader(dataset.iterable(256), batch_size=None, num_workers=4)

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

Caches in object storage
------------------------
Every dataset takes a URL (``s3://bucket/prefix``, ``gs://``, ``az://``,
``file://``) where it takes a path, with the keywords ``tier_dir``,
``tier_budget`` and ``storage_options`` (see :class:`cachex.SegmentStore`;
credentials stay in the environment). Blocks are fetched into the
machine's local tier as samples are read; every worker (``fork``,
``spawn``, ``forkserver``) opens its own working directory over that one
tier, so no block is fetched twice on a machine. Credentials come from
the environment: a ``forkserver`` worker has the environment the fork
server started with (set them before the first DataLoader starts it).

A page file on a URL stays within ``tier_budget`` even when it is larger:
the tier frees blocks of the open file that no read holds. While
:class:`IterableBatches` iterates it, it registers the batches its worker
reads this epoch and the next with the tier (``plan_eviction=True``), so
the tier evicts the pages needed furthest ahead first;
:func:`cachex.tier_stats` reports the tier's traffic and bytes.

Warming the next epoch
----------------------
A page file or memmap array on a URL can be fetched into the tier ahead of
the reads, in the order this rank will read them (MosaicML's
``predownload``), within the tier's budget: ``prefetch_epoch`` starts it in
the background and returns a :class:`cachex.Prefetch` at once::

    it = PageDataset("s3://bucket/prefix/data.pages").iterable(256)
    warming = it.prefetch_epoch(epoch + 1)   # while epoch ``epoch`` trains
    ...
    warming.wait(60.0)                       # optional: it runs on its own

With a :class:`PlanSampler`, ``dataset.prefetch(sampler.rank_order(epoch))``
does the same. While iterating, :class:`IterableBatches` also warms the next
batch while the current one is read. A local file needs none of it
(``prefetch`` asks the kernel to read ahead and returns a finished
``Prefetch``); a ``.beton`` on a URL is copied whole when opened.
"""

from __future__ import annotations

import operator
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from cachex._cachex import (
    BetonReader,
    MemmapArray,
    PageReader,
    PlanHandle,
    Prefetch,
    SegmentStore,
    ShardStore,
)
from cachex._remote import TierBudget, tier_kwargs
from cachex.errors import InvalidInputError
from cachex.ragged import Ragged
from cachex.sampling import (
    Affinity,
    Deal,
    Policy,
    Progress,
    SamplingPlan,
    SharedProgress,
    data_parallel,
    distributed_rank,
    even_blocks,
)
from cachex.torch._buffers import (
    HAS_TORCH,
    Output,
    _as_numpy,
    _check_output,
    _empty,
    _IterableBase,
    _like,
    _MapBase,
    _numpy_dtype,
    _shared,
    _worker_info,
    collate,
    torch,
)

__all__ = [
    "HAS_TORCH",
    "BetonDataset",
    "IterableBatches",
    "MemmapDataset",
    "PageDataset",
    "PlanSampler",
    "SegmentDataset",
    "ShardDataset",
    "batch_indices",
    "collate",
    "worker_share",
]


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

    def blocks(self) -> np.ndarray:
        """Samples per block in index order: the unit a :class:`SamplingPlan` keeps together."""
        return even_blocks(len(self), 1)

    def sampler(self, batch_size: int, **plan: Any) -> PlanSampler:
        """A :class:`PlanSampler` over this dataset's blocks (``plan``: its keywords)."""
        return PlanSampler(self.blocks(), batch_size, **plan)

    def iterable(self, batch_size: int, **plan: Any) -> IterableBatches:
        """An :class:`IterableBatches` over this dataset (``plan``: its keywords)."""
        return IterableBatches(self, batch_size, **plan)

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


class _Buffered(_Batched):
    """A dataset whose batches are buffers its reader fills (``fill_batch``,
    GIL released): one per name of ``_specs`` (dtype and shape of one
    sample), plus what ``fill_batch`` reports per name (``_extra``: the
    suffix and dtype of that array, e.g. ``"_lengths"``). The names in
    ``_ragged`` are bytes fields batched as :class:`cachex.Ragged` (their
    spec is the values' dtype)."""

    _specs: dict[str, tuple[np.dtype[Any], tuple[int, ...]]]
    _extra: tuple[str, Any]
    _ragged: tuple[str, ...] = ()

    def _fill(self, indices: list[int], buffers: dict[str, Any]) -> dict[str, Any]:
        """Fills ``buffers``' first rows with samples ``indices`` (a ragged
        name's buffer is its ``(values, offsets)`` pair); what the reader
        reports per name."""
        raise NotImplementedError

    def empty_batch(self, n: int, *, shared: bool = False) -> dict[str, Any]:
        """Uninitialised buffers for ``n`` samples of every buffered name
        (reuse them with ``out=``); a ragged field's values buffer starts
        empty and grows as batches need. ``shared=True``: torch tensors in
        shared memory whatever the output, for another process to map."""
        alloc = self._allocator(shared)
        return self._buffers(n, alloc, alloc)

    def _allocator(self, shared: bool) -> Callable[[tuple[int, ...], np.dtype[Any]], Any]:
        """How this dataset allocates a buffer of a shape and dtype."""

        def alloc(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
            if shared:
                return _shared(shape, dtype)
            return _empty(shape, dtype, self.output, self.pin_memory)

        return alloc

    def _buffers(
        self, n: int, alloc: Callable[..., Any], values: Callable[..., Any]
    ) -> dict[str, Any]:
        """Buffers for ``n`` samples from ``alloc``; a ragged field's empty
        values buffer from ``values``."""
        out: dict[str, Any] = {}
        for name, (dtype, shape) in self._specs.items():
            if name in self._ragged:
                out[name] = Ragged(values((0,), dtype), alloc((n + 1,), np.dtype(np.int64)))
            else:
                out[name] = alloc((n, *shape), dtype)
        return out

    def batch(self, indices: Sequence[int], out: dict[str, Any] | None = None) -> dict[str, Any]:
        """Samples ``indices`` as ``{name: buffer}`` (``out``'s first rows when
        given). A ragged field is a :class:`cachex.Ragged` over ``out``'s
        pair; when a batch's values outgrow its values buffer, ``out[name]``
        is replaced by a pair with a larger one (at least twice as large,
        so a reused ``out`` stops growing after the first batches)."""
        indices = list(indices)
        n = len(indices)
        fresh = out is None
        alloc = self._allocator(shared=False)
        if out is None:
            # Ragged values sized once the fill reported them.
            out = self._buffers(n, alloc, np.empty)
        buffers: dict[str, Any] = {}
        for name, (dtype, _) in self._specs.items():
            if name in self._ragged:
                values, offsets = out[name]
                buffers[name] = (_as_numpy(values, dtype), _as_numpy(offsets))
            else:
                buffers[name] = _as_numpy(out[name], dtype)
        reported = self._fill(indices, buffers)
        short = [name for name in self._ragged if reported[name] > len(buffers[name][0])]
        for name in self._ragged if fresh else short:
            values, offsets = out[name]
            need = int(reported[name])
            # A buffer kept for reuse grows with room to spare, one for this
            # batch alone to its size.
            dtype = self._specs[name][0]
            if fresh:
                grown = alloc((need,), dtype)
            else:
                grown = _like(values, (max(need + need // 4, 2 * len(values)),), dtype)
            out[name] = Ragged(grown, offsets)
            buffers[name] = (_as_numpy(grown, dtype), buffers[name][1])
        if short:
            reported = self._fill(indices, buffers)
        batch: dict[str, Any] = {}
        for name in self._specs:
            if name in self._ragged:
                values, offsets = out[name]
                batch[name] = Ragged(values[: int(reported[name])], offsets[: n + 1])
            else:
                batch[name] = out[name][:n]
        suffix, dtype = self._extra
        for name, rows in reported.items():
            if name not in self._ragged:
                batch[f"{name}{suffix}"] = np.asarray(rows, dtype=dtype)
        return batch


def _field_specs(
    kinds: dict[str, Any], widths: dict[str, int], fields: Sequence[str], ragged: bool = False
) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """The buffer of one sample of each of ``fields`` of a page or beton
    file: int64 for ints, float64 for floats, zero-padded uint8 of the
    longest value for bytes (the values' uint8 when ``ragged``), the
    array's dtype and shape for arrays."""
    specs: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    for f in fields:
        kind = kinds[f]
        if kind == "int":
            specs[f] = (np.dtype(np.int64), ())
        elif kind == "float":
            specs[f] = (np.dtype(np.float64), ())
        elif kind == "bytes":
            specs[f] = (np.dtype(np.uint8), () if ragged else (max(int(widths[f]), 1),))
        else:
            specs[f] = (_numpy_dtype(str(kind[0])), tuple(int(d) for d in kind[1]))
    return specs


def _chosen(names: Sequence[str] | None, have: Any, what: str, shown: Any) -> list[str]:
    """``names`` (default: all of ``have``), refused with the file named
    when one is not there."""
    chosen = list(have) if names is None else list(names)
    unknown = [n for n in chosen if n not in have]
    if unknown:
        raise InvalidInputError(f"{shown}: no {what} {unknown} (it has {list(have)})")
    return chosen


def _from_end(indices: list[int], n: int) -> list[int]:
    """``indices`` with negative ones counted from the end of ``n``."""
    return [i + n if i < 0 else i for i in indices]


class MemmapDataset(_Buffered):
    """Rows of a memmap-array cache: ``dataset[i]`` is ``{name: array}``
    (read-only views, ``None`` for a null entry), ``dataset[indices]`` one
    buffer per array, filled from the mapped files by ``fill_batch``; a
    nullable array also gets ``"<name>_present"`` (bool: which rows have
    it, the others zero-filled).

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
    tier_dir, tier_budget, storage_options
        For a URL ``path`` (see the module docs).
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
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: TierBudget | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._setup(output, pin_memory)
        kwargs: dict[str, Any] = {"load_in_memory": load_in_memory}
        if ram_fraction is not None:
            kwargs["ram_fraction"] = ram_fraction
        kwargs.update(tier_kwargs(tier_dir, tier_budget, storage_options))
        self.cache = MemmapArray(path, **kwargs)
        schema = self.cache.schema["arrays"]
        self.arrays = _chosen(arrays, schema, "arrays", self.cache.url or self.cache.path)
        self._specs = {
            a: (_numpy_dtype(schema[a]["dtype"]), tuple(schema[a]["shape"])) for a in self.arrays
        }
        self._extra = ("_present", bool)

    def __len__(self) -> int:
        return len(self.cache)

    def blocks(self, block_bytes: int = 1 << 20) -> np.ndarray:
        """Runs of rows of about ``block_bytes`` (1 MiB) of the selected arrays."""
        row = sum(d.itemsize * int(np.prod(s, dtype=np.int64)) for d, s in self._specs.values())
        return even_blocks(len(self), max(1, block_bytes // max(row, 1)))

    def prefetch(self, indices: Sequence[int]) -> Prefetch:
        """Warms rows ``indices`` in that order (see :meth:`cachex.MemmapArray.prefetch`)."""
        return self.cache.prefetch(list(indices))

    def item(self, i: int) -> dict[str, Any]:
        row = self.cache.get_row(i)
        return {a: row[a] for a in self.arrays}

    def _fill(self, indices: list[int], buffers: dict[str, np.ndarray]) -> dict[str, Any]:
        # A nullable array's rows that have it, as "<name>_present" (the
        # others are zero-filled).
        return self.cache.fill_batch(indices, buffers)


class PageDataset(_Buffered):
    """Samples of a page file: ``dataset[i]`` is ``{field: value}`` (ints and
    floats by value, bytes and arrays as read-only views), ``dataset[indices]``
    one buffer per field filled from the mapped pages by ``fill_batch``: int64
    for ints, float64 for floats, ``(n, *shape)`` for arrays and zero-padded
    uint8 ``(n, max size)`` for bytes, with ``"<field>_lengths"`` (int64).

    ``ragged=True`` batches each bytes field as a :class:`cachex.Ragged`
    instead: the values end to end in one uint8 buffer plus ``n + 1``
    offsets, no padding and no ``"<field>_lengths"`` (``.lengths`` has
    them; ``.padded()`` gives the padded rows on request). It moves the
    payload's bytes where padding moves ``n`` times the widest value; the
    default stays padded, the layout batches have always had.

    ``path`` may be a URL naming the file under a prefix
    (``s3://bucket/prefix/data.pages``), with ``tier_dir``, ``tier_budget``
    and ``storage_options`` (see the module docs).
    """

    def __init__(
        self,
        path: Any,
        *,
        fields: Sequence[str] | None = None,
        populate: bool = False,
        output: Output = "numpy",
        pin_memory: bool = False,
        ragged: bool = False,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: TierBudget | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._setup(output, pin_memory)
        self.reader = PageReader(
            path,
            populate=populate,
            **tier_kwargs(tier_dir, tier_budget, storage_options),
        )
        kinds = self.reader.fields
        self.fields = _chosen(fields, kinds, "fields", self.reader.url or self.reader.path)
        self.ragged = bool(ragged)
        self._ragged = tuple(f for f in self.fields if self.ragged and kinds[f] == "bytes")
        self._specs = _field_specs(kinds, self.reader.max_sizes, self.fields, self.ragged)
        self._extra = ("_lengths", np.int64)

    def __len__(self) -> int:
        return len(self.reader)

    def blocks(self) -> np.ndarray:
        """The samples of each page, in file order."""
        return self.reader.page_blocks()

    def prefetch(self, indices: Sequence[int]) -> Prefetch:
        """Warms the pages of samples ``indices`` in that order (see
        :meth:`cachex.PageReader.prefetch`): on a URL in the background."""
        return self.reader.prefetch(list(indices))

    def set_plan(self, samples: Any, positions: Any, epoch_len: int) -> PlanHandle | None:
        """Registers a plan of reads with the local tier (see
        :meth:`cachex.PageReader.set_plan`): sample ``samples[j]`` is read at
        batch ``positions[j]`` (``0..epoch_len`` this epoch, the next epoch
        after); ``None`` for a local file. :class:`IterableBatches` does it
        for you (``plan_eviction``)."""
        return self.reader.set_plan(
            np.asarray(samples, dtype=np.int64).reshape(-1),
            np.asarray(positions, dtype=np.int64).reshape(-1),
            int(epoch_len),
        )

    def item(self, i: int) -> dict[str, Any]:
        sample = self.reader.sample(i)
        return {f: sample[f] for f in self.fields}

    def _fill(self, indices: list[int], buffers: dict[str, np.ndarray]) -> dict[str, Any]:
        return self.reader.fill_batch(_from_end(indices, len(self.reader)), buffers)


class BetonDataset(_Buffered):
    """Samples of an FFCV ``.beton`` file: ``dataset[i]`` is ``{field: value}``
    as :meth:`cachex.BetonReader.sample` gives it (ints, floats and JSON
    text by value, bytes and arrays as read-only views, RGB images as
    ``{mode, width, height, data}``, never decoded); ``dataset[indices]``
    one buffer per field filled from the mapped file by ``fill_batch`` (GIL
    released): int64 for ints, float64 for floats, ``(n, *shape)`` for
    arrays, zero-padded uint8 ``(n, max size)`` for bytes with
    ``"<field>_lengths"`` (int64), or with ``ragged=True`` a
    :class:`cachex.Ragged` per bytes field (as :class:`PageDataset`); JSON
    and images as lists.

    Its plan's blocks are the file's pages (:meth:`blocks`), so the plan's
    order is FFCV's quasi-random one: pages shuffled, then the samples of
    each page. ``path`` may be a URL naming the file under a prefix
    (``s3://bucket/prefix/data.beton``), with ``tier_dir``, ``tier_budget``
    and ``storage_options`` (see the module docs): the file is copied whole
    into the tier when opened.
    """

    def __init__(
        self,
        path: Any,
        *,
        fields: Sequence[str] | None = None,
        output: Output = "numpy",
        pin_memory: bool = False,
        ragged: bool = False,
        tier_dir: str | os.PathLike[str] | None = None,
        tier_budget: TierBudget | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self._setup(output, pin_memory)
        self.reader = BetonReader(path, **tier_kwargs(tier_dir, tier_budget, storage_options))
        kinds = self.reader.fields
        self.fields = _chosen(fields, kinds, "fields", self.reader.url or self.reader.path)
        # Numbers, arrays and bytes are copied into buffers by
        # ``fill_batch``; JSON and images stay Python values.
        self._listed = [f for f in self.fields if kinds[f] in ("json", "rgb_image")]
        buffered = [f for f in self.fields if f not in self._listed]
        self.ragged = bool(ragged)
        self._ragged = tuple(f for f in buffered if self.ragged and kinds[f] == "bytes")
        self._specs = _field_specs(kinds, self.reader.max_sizes, buffered, self.ragged)
        self._extra = ("_lengths", np.int64)

    def __len__(self) -> int:
        return len(self.reader)

    def blocks(self) -> np.ndarray:
        """The runs of consecutive samples that lie in one page, in file order."""
        return self.reader.page_blocks()

    def item(self, i: int) -> dict[str, Any]:
        sample = self.reader.sample(i)
        return {f: sample[f] for f in self.fields}

    def _fill(self, indices: list[int], buffers: dict[str, np.ndarray]) -> dict[str, Any]:
        return self.reader.fill_batch(_from_end(indices, len(self.reader)), buffers)

    def batch(self, indices: Sequence[int], out: dict[str, Any] | None = None) -> dict[str, Any]:
        """Samples ``indices`` as ``{field: buffer}`` (``out``'s first rows when
        given), filled from the mapped file by ``fill_batch``; JSON and image
        fields as lists."""
        indices = list(indices)
        batch = super().batch(indices, out)
        if self._listed:
            samples = [self.reader.sample(i) for i in _from_end(indices, len(self.reader))]
            for f in self._listed:
                batch[f] = [s[f] for s in samples]
        return batch


class SegmentDataset(_Batched):
    """Records of a segment store in the order of ``keys``: ``dataset[i]`` is
    the record of ``keys[i]`` (views of the mapped segments),
    ``dataset[indices]`` the records stacked field by field (:func:`collate`).
    A key not in the store raises ``KeyError`` naming it and the store.

    ``options`` are :class:`cachex.SegmentStore`'s (``tier_dir``,
    ``tier_budget``, ``storage_options`` for a URL ``path``); the store opens
    read-only unless ``read_only=False`` is given.
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

    def blocks(self, block_size: int = 256) -> np.ndarray:
        """The shuffle's blocks: each run of consecutive keys that lie in one
        segment (:meth:`cachex.SegmentStore.segment_ids`, from the index; keys
        in no segment run together), cut evenly into pieces of at most
        ``block_size``. A block never spans two segments, so a node's group
        of blocks under ``affinity="node"`` is whole pieces of segments,
        and groups come out even to within one piece."""
        if block_size < 1:
            raise InvalidInputError(f"blocks(block_size={block_size}): give at least 1")
        ids = np.asarray(self.store.segment_ids(self.keys), dtype=np.int64)
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ids)) + 1))
        runs = np.diff(np.append(starts, len(ids)))
        pieces = -(-runs // block_size)
        base, longer = np.divmod(runs, pieces)
        # Each run: ``longer`` pieces of ``base + 1``, then the rest of ``base``.
        piece = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        return (np.repeat(base, pieces) + (piece < np.repeat(longer, pieces))).astype(np.int64)

    def _records(self, keys: list[str]) -> list[Any]:
        values, missing = self.store.get_batch(keys)
        if missing:
            shown = self.store.url or self.store.path
            raise KeyError(f"{shown}: key {keys[missing[0]]!r} is not in the store")
        return values

    def prefetch(self, indices: Sequence[int]) -> Prefetch:
        """Warms the segments holding the keys of ``indices``, in that order
        (see :meth:`cachex.SegmentStore.prefetch`): on a URL, whole, in the
        background."""
        return self.store.prefetch([self.keys[i] for i in indices])

    #: :class:`IterableBatches` registers a plan unless given
    #: ``plan_eviction=False`` (see there).
    plan_eviction_default = True

    def set_plan(self, samples: Any, positions: Any, epoch_len: int) -> PlanHandle | None:
        """Registers a plan of reads with the local tier (see
        :meth:`cachex.SegmentStore.set_plan`): the record of
        ``keys[samples[j]]`` is read at batch ``positions[j]``
        (``0..epoch_len`` this epoch, the next epoch after); ``None`` for a
        directory or a store the tier's budget holds whole.
        :class:`IterableBatches` does it for you (``plan_eviction``)."""
        keys = self.keys
        return self.store.set_plan(
            [keys[int(i)] for i in np.asarray(samples).reshape(-1)],
            np.asarray(positions, dtype=np.int64).reshape(-1),
            int(epoch_len),
        )

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

    ``source`` and ``options`` are :class:`cachex.ShardStore`'s (``tier_dir``,
    ``tier_budget``, ``storage_options`` for a URL ``root``). A worker
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

    def blocks(self) -> np.ndarray:
        """The items of each shard, in order."""
        return even_blocks(len(self), self.store.max_shard_length)

    def item(self, i: int) -> Any:
        return self.store[i]

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        """Items ``indices``, stacked (into ``out`` when given)."""
        items = self.store.get_many(list(indices))
        return collate(items, out=out, output=self.output, pin_memory=self.pin_memory)


# --- the sampling plan in a training loop ------------------------------------


class _PlanLoader:
    """What the loaders over a plan share (``ResumableDataLoader``,
    ``ThreadedLoader``): the plan's epoch and the steps taken in it."""

    planned: _Planned
    steps: int

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self.planned.epoch

    def set_epoch(self, epoch: int) -> None:
        """As the dataset's or sampler's ``set_epoch`` (a new epoch starts at step 0)."""
        if int(epoch) != self.planned.epoch:
            self.steps = 0
        self.planned.set_epoch(epoch)


class _Planned:
    """What the plan-driven sampler and iterable share: the plan, this
    process's rank, the epoch and how far it got in the global order
    (shared with DataLoader workers), and the state dict."""

    plan: SamplingPlan
    rank: int
    world_size: int

    def _plan_setup(self, plan: SamplingPlan, rank: int | None, world_size: int | None) -> None:
        self.plan = plan
        self.rank, self.world_size = distributed_rank(rank, world_size)
        # Refused here rather than at the first batch: a world size the
        # replication or the global batch does not divide.
        self.global_batch_size = plan.global_batch(self.world_size)
        if self.global_batch_size % data_parallel(self.world_size, plan.replication):
            raise InvalidInputError(
                f"global_batch_size {self.global_batch_size} does not split over "
                f"{data_parallel(self.world_size, plan.replication)} data-parallel ranks"
            )
        self._progress = SharedProgress(homes=self.plan.homes)
        self._steps = 0  # batches this process yielded in its current run

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._progress.get().epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next iterations (as ``DistributedSampler.set_epoch``).

        It reaches persistent DataLoader workers too. Moving to another
        epoch forgets how far a loaded state had got; setting the loaded
        state's own epoch keeps it (so a loop that calls ``set_epoch`` at the
        top of every epoch resumes where the state left off).
        """
        if int(epoch) != self.epoch:
            self._progress.set(Progress(int(epoch)))
        self._steps = 0

    def _layout_workers(self, num_workers: int) -> int:
        """The workers the plan deals batches to when the DataLoader has ``num_workers``."""
        raise NotImplementedError

    def deal(self, num_workers: int = 0) -> Deal:
        """This epoch's unread global batches dealt to the ranks (and a DataLoader's workers)."""
        p = self._progress.get()
        self.plan.adopt_homes(self._progress.homes)  # a state loaded after workers started
        return self.plan.deal(
            p.epoch, self.world_size, self._layout_workers(num_workers), p, self.global_batch_size
        )

    def __len__(self) -> int:
        """Batches every rank yields in the next iteration."""
        return self.deal().num_batches

    def rank_order(self, epoch: int | None = None, num_workers: int = 0) -> np.ndarray:
        """The samples this rank reads in epoch ``epoch`` with a DataLoader of
        ``num_workers``, in the order its loop receives them (default: the
        next iteration's, what a loaded state left of it): what to prefetch
        ahead of that epoch."""
        if epoch is None or int(epoch) == self.epoch:
            deal = self.deal(num_workers)
        else:
            layout = self._layout_workers(num_workers)
            self.plan.adopt_homes(self._progress.homes)
            deal = self.plan.deal(int(epoch), self.world_size, layout, 0, self.global_batch_size)
        return deal.rank_order(self.rank)

    def state_dict(self, steps: int | None = None, num_workers: int = 0) -> dict[str, Any]:
        """The epoch and its position in the global order: a few numbers,
        never a list of samples.

        ``steps`` is how many batches this rank's training loop received in
        this run (default: counted by this object, right when it iterates in
        the main process; with DataLoader workers use
        :class:`cachex.torch.ResumableDataLoader`, which counts them).
        Every rank's state is the same. ``num_workers`` is not needed any
        more (the position does not depend on it) and is accepted for the
        callers that pass it.
        """
        steps = self._steps if steps is None else int(steps)
        p = self._progress.get()
        if steps:
            self.plan.adopt_homes(self._progress.homes)
            n = len(self.plan.epoch_order(p.epoch))  # cached: no deal to build
            end = min(p.position + steps * self.global_batch_size, n)
            p = Progress(p.epoch, end, self.global_batch_size)
        return self.plan.state(p)

    def load_state_dict(self, state: dict[str, Any], skip_steps: int = 0) -> None:
        """Resumes from :meth:`state_dict`'s output, with any world size,
        worker count, replication or global batch size.

        The next iteration reads the state's epoch from its position in the
        global order on, re-dealt to this job's ranks and workers, after
        skipping ``skip_steps`` global batches (of this job's size) unread
        (e.g. the batches around a loss spike).
        """
        progress = self.plan.progress_of(state)
        self._progress.homes = self.plan.homes
        if skip_steps:
            progress = self.plan.skip(progress, skip_steps, self.global_batch_size)
        self._progress.set(progress)
        self._steps = 0


class PlanSampler(_Planned):
    """Batches of indices of a :class:`SamplingPlan` for this rank, for a
    map-style dataset (``dataset.sampler(batch_size)`` makes one)::

        loader = DataLoader(dataset, sampler=dataset.sampler(256), batch_size=None,
                            num_workers=4)

    Every rank gets the same number of batches; each sample is read once per
    epoch (see :mod:`cachex.sampling` for ``policy``). The rank comes from
    ``rank``/``world_size``, else ``torch.distributed``, else the environment.
    Call :meth:`set_epoch` before each epoch; resume with
    :meth:`load_state_dict` (the DataLoader runs ahead of the training loop:
    take states from :class:`cachex.torch.ResumableDataLoader`).
    ``global_batch_size`` and ``replication`` are the plan's (see
    :class:`SamplingPlan`); with ``global_batch_size`` the batches are this
    rank's slices of it, whatever ``batch_size``.
    """

    def __init__(
        self,
        blocks: int | Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        policy: Policy = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        affinity: Affinity = "global",
        homes: int | None = None,
        cross_node: float = 0.0,
        global_batch_size: int | None = None,
        replication: int = 1,
    ) -> None:
        plan = SamplingPlan(
            blocks,
            batch_size,
            seed=seed,
            shuffle=shuffle,
            policy=policy,
            affinity=affinity,
            homes=homes,
            cross_node=cross_node,
            global_batch_size=global_batch_size,
            replication=replication,
        )
        self._plan_setup(plan, rank, world_size)

    @classmethod
    def of_plan(
        cls, plan: SamplingPlan, *, rank: int | None = None, world_size: int | None = None
    ) -> PlanSampler:
        """A sampler of ``plan`` (a :class:`cachex.streams.MixturePlan`, say) for this rank."""
        sampler = cls.__new__(cls)
        sampler._plan_setup(plan, rank, world_size)
        return sampler

    def _layout_workers(self, num_workers: int) -> int:
        return 1  # the main process hands out every batch, whatever the workers

    def __iter__(self) -> Iterator[list[int]]:
        self._steps = 0
        for indices in self.deal().worker_batches(self.rank):
            self._steps += 1
            yield indices.tolist()


def _is_streams(dataset: Any) -> bool:
    """A non-empty list or tuple of :class:`cachex.Stream` (a plain list of
    samples stays a map-style dataset)."""
    from cachex.streams import Stream

    return (
        isinstance(dataset, (list, tuple))
        and len(dataset) > 0
        and all(isinstance(s, Stream) for s in dataset)
    )


def _worker_ring(config: Any, worker: int, dataset: Any, batch_size: int) -> Any:
    """The worker's batch ring (see ``cachex/torch/_ring.py``), or ``None``."""
    if config is None:
        return None
    from cachex.torch._ring import worker_ring

    return worker_ring(config, worker, dataset, batch_size)


#: The plan each iterable's workers registered last, by worker (see
#: ``IterableBatches._keep_plan``); an entry goes with its iterable.
_KEPT_PLANS: weakref.WeakKeyDictionary[Any, dict[int, Any]] = weakref.WeakKeyDictionary()


class IterableBatches(_IterableBase, _Planned):
    """Batches of a map-style dataset in the order of a :class:`SamplingPlan`:
    batch ``j`` of a rank is its slice of global batch ``j``.

    Use ``DataLoader(it, batch_size=None, num_workers=...)``; batch ``j`` of
    a rank comes from worker ``j % num_workers``, the order in which the
    DataLoader takes them, so the loader yields the rank's batches in plan
    order and a state is just a position (see :mod:`cachex.sampling`). Every
    rank yields the same number of batches. A :class:`cachex.torch.MixedDataset`
    brings its own plan (its streams interleaved; see :mod:`cachex.streams`).

    Parameters
    ----------
    dataset
        A map-style dataset of :mod:`cachex.torch` (anything with ``len``,
        ``batch(indices, out=None)`` and ``blocks()``), or a list of
        streams (:class:`cachex.Stream`; a :class:`cachex.torch.MixedDataset` of them).
    batch_size
        Samples per batch; ``None`` yields single samples (``dataset.item``).
    blocks
        The block layout (default: ``dataset.blocks()``: pages, shards, row
        or key runs).
    seed, shuffle, policy, affinity, homes, cross_node, global_batch_size, replication
        The plan's (see :class:`SamplingPlan`; ``affinity="node"`` keeps
        each node on mostly the same blocks across epochs; with
        ``global_batch_size``, ``batch_size=None`` takes this rank's slice
        of it; ``replication=k`` gives k consecutive ranks the same batches).
    rank, world_size
        Override the rank found in ``torch.distributed`` or the environment.
    reuse_buffers
        Outside DataLoader workers, fill the same buffers for every batch
        (a batch is valid until the next one is requested). Inside workers
        each batch gets its own buffer, since it goes to another process,
        unless the loader fills a ring of shared ones
        (``ResumableDataLoader(..., ring=True)``).
    plan_eviction
        For a dataset read through a local tier (a :class:`PageDataset` on
        a URL): each iteration registers the batches this worker reads in
        this epoch and the next with the tier (``dataset.set_plan``) and
        moves the plan forward after every batch, so the tier evicts the
        pages needed furthest ahead first and keeps the nearest (every
        process of the machine shares the tier and sees every rank's
        plan). A plan stays registered after its iteration, until the next
        one registers its own or this object goes. ``False`` registers
        nothing: the tier evicts the least recently used pages. ``None``
        (the default): the dataset's ``plan_eviction_default``, on for a
        page or beton file and a :class:`SegmentDataset` (whose planned
        epochs fetch 0.34-0.6 of the LRU's bytes and, from a loopback S3
        server, read at 0.9-1.9 x its speed from run to run: BENCHMARKS.md,
        W9; a store the budget holds whole registers none).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None,
        *,
        blocks: int | Sequence[int] | np.ndarray | None = None,
        seed: int = 0,
        shuffle: bool = True,
        policy: Policy = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        reuse_buffers: bool = False,
        affinity: Affinity = "global",
        homes: int | None = None,
        cross_node: float = 0.0,
        plan_eviction: bool | None = None,
        global_batch_size: int | None = None,
        replication: int = 1,
    ) -> None:
        if batch_size is not None and batch_size < 1:
            raise InvalidInputError(f"batch_size {batch_size}: give at least 1 or None")
        if _is_streams(dataset):
            from cachex.torch.mixed import MixedDataset  # it builds on this module

            dataset = MixedDataset(dataset)
        self.dataset = dataset
        self.reuse_buffers = reuse_buffers
        if plan_eviction is None:
            plan_eviction = getattr(dataset, "plan_eviction_default", True)
        self.plan_eviction = bool(plan_eviction)
        options: dict[str, Any] = {
            "seed": seed,
            "shuffle": shuffle,
            "policy": policy,
            "affinity": affinity,
            "homes": homes,
            "cross_node": cross_node,
            "global_batch_size": global_batch_size,
            "replication": replication,
        }
        # A dataset of several streams makes its own plan (cachex.torch.MixedDataset).
        make_plan = getattr(dataset, "sampling_plan", None)
        if make_plan is not None and blocks is None:
            plan = make_plan(batch_size or 1, **options)
        else:
            layout = dataset.blocks() if blocks is None else blocks
            plan = SamplingPlan(layout, batch_size or 1, **options)
        self._plan_setup(plan, rank, world_size)
        per_rank = self.global_batch_size // data_parallel(self.world_size, replication)
        if batch_size is None and global_batch_size is not None:
            batch_size = per_rank  # derived: the rank's slice of the global batch
        elif batch_size is not None and batch_size != per_rank:
            raise InvalidInputError(
                f"batch_size {batch_size} is not global_batch_size {self.global_batch_size} "
                f"over {data_parallel(self.world_size, replication)} data-parallel ranks "
                f"({per_rank}): give batch_size=None with a global_batch_size"
            )
        self.batch_size = batch_size
        if self.plan.num_samples != len(dataset):
            raise InvalidInputError(
                f"the blocks hold {self.plan.num_samples} samples, the dataset {len(dataset)}"
            )

    #: Set by ``ResumableDataLoader(ring=True)``: the workers' batch ring.
    _ring: Any = None

    def _layout_workers(self, num_workers: int) -> int:
        return max(int(num_workers), 1)

    def order(self, worker: int = 0, num_workers: int = 0) -> list[int]:
        """The sample indices that worker ``worker`` of this rank reads in the next iteration."""
        deal = self.deal(num_workers)
        parts = list(deal.worker_batches(self.rank, worker))
        return np.concatenate(parts).tolist() if parts else []

    def prefetch_epoch(self, epoch: int | None = None, num_workers: int = 0) -> Prefetch | None:
        """Starts warming the samples this rank reads in epoch ``epoch``
        (default: the next iteration's) with a DataLoader of ``num_workers``,
        in the order the loop receives them, and returns at once.

        On a URL the page file's pages or the memmap array's blocks are
        fetched into the local tier in the background, within its budget
        (a :class:`cachex.Prefetch` to wait on or cancel); on a local file
        the kernel is asked to read ahead and the ``Prefetch`` is already
        done; a segment store's segments are fetched whole, in the order
        the keys need them. ``None`` for a dataset without ``prefetch``
        (shard and ``.beton`` datasets fetch their own way).
        """
        prefetch = getattr(self.dataset, "prefetch", None)
        if prefetch is None:
            return None
        result: Prefetch = prefetch(self.rank_order(epoch, num_workers))
        return result

    def _register_plan(self, deal: Deal, worker: int) -> Any:
        """Registers the batches worker ``worker`` reads in ``deal`` (positions
        ``j``, the rank's batch index) and in the next epoch's deal
        (positions ``L + j``, ``L`` = this deal's batches) with the
        dataset's tier; the plan's handle, or ``None`` when the dataset has
        no tier (or ``plan_eviction`` is off)."""
        set_plan = getattr(self.dataset, "set_plan", None)
        if not self.plan_eviction or set_plan is None or deal.num_batches == 0:
            return None
        length = deal.num_batches
        following = self.plan.deal(
            self.epoch + 1, self.world_size, deal.num_workers, 0, self.global_batch_size
        )
        parts: list[np.ndarray] = []
        positions: list[np.ndarray] = []
        for d, offset in ((deal, 0), (following, length)):
            # Batches of the next epoch past ``2 L`` are left out: the next
            # iteration registers them.
            for j in range(worker, min(d.num_batches, length), deal.num_workers):
                batch = d.batch(self.rank, j)
                parts.append(batch)
                positions.append(np.full(len(batch), offset + j, dtype=np.int64))
        samples = np.concatenate(parts).astype(np.int64, copy=False)
        return set_plan(samples, np.concatenate(positions), length)

    def _keep_plan(self, worker: int, handle: Any) -> None:
        """Keeps worker ``worker``'s new plan ``handle`` and removes the one
        it registered before. A plan outlives its iteration: its part of
        the next epoch tells the tier what this worker reads next until
        the next iteration registers its own (between the two, the other
        ranks' plans alone would leave those pages unclaimed, and the
        first to be freed). It goes with this object."""
        kept = _KEPT_PLANS.setdefault(self, {})
        previous = kept.pop(worker, None)
        if handle is not None:
            kept[worker] = handle
        if previous is not None:
            previous.close()

    def __iter__(self) -> Iterator[Any]:
        info = _worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        deal = self.deal(workers)
        if info is None:
            self._steps = 0
        handle = self._register_plan(deal, worker)
        self._keep_plan(worker, handle)
        yield from self._batches(deal, worker, handle, counted=info is None)

    def _batches(self, deal: Deal, worker: int, handle: Any, counted: bool) -> Iterator[Any]:
        """The batches (items when ``batch_size`` is ``None``) of worker
        ``worker`` in ``deal``; the plan ``handle`` moves past each once the
        next is asked for."""
        positions = range(worker, deal.num_batches, deal.num_workers)
        batches = zip(positions, deal.worker_batches(self.rank, worker), strict=True)
        ds = self.dataset
        if self.batch_size is None:
            for j, indices in batches:
                if counted:
                    self._steps += 1
                yield ds.item(int(indices[0]))
                if handle is not None and not handle.closed:
                    handle.advance(j + 1)
            return
        reuse = self.reuse_buffers and counted and hasattr(ds, "empty_batch")
        buffers = ds.empty_batch(self.batch_size) if reuse else None
        # A ResumableDataLoader(ring=True) worker fills its ring's slots.
        ring = None if counted else _worker_ring(self._ring, worker, ds, self.batch_size)
        prefetch = getattr(ds, "prefetch", None)
        upcoming = next(batches, None)
        while upcoming is not None:
            (j, current), upcoming = upcoming, next(batches, None)
            if prefetch is not None and upcoming is not None:
                prefetch(upcoming[1].tolist())
            if ring is not None:
                batch = ring.put(current.tolist())
            else:
                batch = ds.batch(current.tolist(), out=buffers)
            if counted:
                self._steps += 1
            yield batch
            if handle is not None and not handle.closed:
                handle.advance(j + 1)
