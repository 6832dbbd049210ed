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

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

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
from cachex.protocols import Output
from cachex.sampling import even_blocks
from cachex.streams import DATASET_KINDS
from cachex.torch._batched import Batched, Buffered
from cachex.torch._buffers import HAS_TORCH, BatchLayout, collate, numpy_dtype, worker_info
from cachex.torch.iterable import IterableBatches
from cachex.torch.planned import PlanSampler

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
    info = worker_info()
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
            specs[f] = (numpy_dtype(str(kind[0])), tuple(int(d) for d in kind[1]))
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


class MemmapDataset(Buffered):
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
        specs = {
            a: (numpy_dtype(schema[a]["dtype"]), tuple(schema[a]["shape"])) for a in self.arrays
        }
        self.layout = BatchLayout(specs, ("_present", np.dtype(bool)))

    def __len__(self) -> int:
        return len(self.cache)

    def blocks(self, block_bytes: int = 1 << 20) -> np.ndarray:
        """Runs of rows of about ``block_bytes`` (1 MiB) of the selected arrays."""
        row = sum(
            d.itemsize * int(np.prod(s, dtype=np.int64)) for d, s in self.layout.specs.values()
        )
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


class PageDataset(Buffered):
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
        self.layout = BatchLayout(
            _field_specs(kinds, self.reader.max_sizes, self.fields, self.ragged),
            ("_lengths", np.dtype(np.int64)),
            tuple(f for f in self.fields if self.ragged and kinds[f] == "bytes"),
        )

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


class BetonDataset(Buffered):
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
        self.layout = BatchLayout(
            _field_specs(kinds, self.reader.max_sizes, buffered, self.ragged),
            ("_lengths", np.dtype(np.int64)),
            tuple(f for f in buffered if self.ragged and kinds[f] == "bytes"),
        )

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


class SegmentDataset(Batched):
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
        sizes: npt.NDArray[np.int64] = np.repeat(base, pieces) + (piece < np.repeat(longer, pieces))
        return sizes.astype(np.int64)

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


class ShardDataset(Batched):
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


# A stream's path opens as the dataset of its store kind (cachex.streams).
DATASET_KINDS.update(pages=PageDataset, beton=BetonDataset, memmap=MemmapDataset)
