"""Reading in the order of a sampling plan: :class:`IterableBatches`, over
one map-style dataset or over several streams as one
(:class:`MixedDataset`).

:class:`IterableBatches` reads any :class:`cachex.protocols.PlanDataset`
(``len``, ``item``, ``batch``, ``blocks``) and uses what else the dataset
has (``prefetch``, ``set_plan``, ``empty_batch``: see
:mod:`cachex.protocols`). Given a list of :class:`cachex.Stream`, it reads
their :class:`MixedDataset`, which orders its own epochs.

:class:`MixedDataset` joins the datasets of some :class:`cachex.Stream`\\ s:
its sample ``i`` is sample ``i - offset[s]`` of stream ``s`` (the streams'
samples one after another), and ``dataset.iterable(...)`` /
``IterableBatches(dataset, ...)`` read it in the order of a
:class:`cachex.streams.MixturePlan` (each stream's share of every epoch,
interleaved evenly; see :mod:`cachex.streams`)::

    mixed = MixedDataset([
        Stream(PageDataset("s3://bucket/web.pages"), proportion=0.7),
        Stream(MemmapDataset("/data/code"), proportion=0.3),
    ])
    loader = ResumableDataLoader(mixed.iterable(None, global_batch_size=1024), num_workers=4)

A batch asks each stream's dataset for its rows in one call
(``dataset.batch``). Its form is the mixture's, whichever streams a rank's
slice holds (:attr:`MixedDataset.merged`, decided once from the streams:
each one's batch of zero rows, :attr:`MixedDataset.zero_row_parts`). When
every stream's rows are a dict of the same fields with the same dtypes and
row shapes, the batch is one dict of those fields, rows in the batch's
order, plus ``"stream"`` (int64: each row's stream); otherwise it is
``{"stream": ..., "parts": {s: stream s's batch}}`` with a key for every
stream: stream ``s``'s rows in the order they hold in the batch (the rows
where ``stream == s``), its zero-row batch (the same fields and dtypes)
when the slice has none of them, so ``batch["parts"][s]`` works on every
slice. A :class:`~cachex.torch.PlanSampler` over a mixture is
``MixedDataset.sampler``; ``dataset[indices]`` is :meth:`MixedDataset.batch`.

The two live together because each makes the other: a list of streams
given to :class:`IterableBatches` becomes a :class:`MixedDataset`, whose
``iterable()`` is an :class:`IterableBatches`.
"""

from __future__ import annotations

import functools
import operator
import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, TypeGuard, cast

import numpy as np

from cachex._cachex import PlanHandle, Prefetch
from cachex.errors import InvalidInputError
from cachex.protocols import (
    BuffersBatches,
    MakesPlan,
    PlanDataset,
    Prefetches,
    RegistersPlans,
)
from cachex.ragged import Ragged
from cachex.sampling import Affinity, Deal, Policy, SamplingPlan, data_parallel
from cachex.streams import MixturePlan, Stream, stream_counts
from cachex.torch._buffers import IterableBase, MapBase, indices_of, torch, worker_info
from cachex.torch._ring import RingConfig, WorkerRing
from cachex.torch.planned import Planned, PlanSampler

__all__ = ["IterableBatches", "MixedDataset"]


def _is_streams(dataset: object) -> TypeGuard[Sequence[Stream]]:
    """A non-empty list or tuple of :class:`cachex.Stream` (a plain list of
    samples stays a map-style dataset)."""
    return (
        isinstance(dataset, (list, tuple))
        and len(dataset) > 0
        and all(isinstance(s, Stream) for s in dataset)
    )


#: The plan each iterable's workers registered last, by worker (see
#: :meth:`IterableBatches.register_plan`); an entry goes with its iterable.
_KEPT_PLANS: weakref.WeakKeyDictionary[IterableBatches, dict[int, PlanHandle]] = (
    weakref.WeakKeyDictionary()
)


class IterableBatches(IterableBase[Any], Planned):
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
        A map-style dataset of :mod:`cachex.torch`, or any
        :class:`cachex.protocols.PlanDataset` (``len``, ``item(i)``,
        ``batch(indices, out=None)`` and ``blocks()``), or a list of
        streams (:class:`cachex.Stream`; a :class:`MixedDataset` of them).
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
        (the default) is on, for a page file and a :class:`SegmentDataset`
        alike (a segment store the budget holds whole registers none);
        BENCHMARKS.md, W9, measures what it saves against the LRU.
    """

    def __init__(
        self,
        dataset: PlanDataset | Sequence[Stream],
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
            dataset = MixedDataset(dataset)
        read = cast(PlanDataset, dataset)  # streams became a MixedDataset
        self.dataset = read
        self.reuse_buffers = reuse_buffers
        self.plan_eviction = plan_eviction is None or bool(plan_eviction)
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
        # A dataset of several streams makes its own plan (MixedDataset).
        if isinstance(read, MakesPlan) and blocks is None:
            plan = read.sampling_plan(batch_size or 1, **options)
        else:
            layout = read.blocks() if blocks is None else blocks
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
        if self.plan.num_samples != len(read):
            raise InvalidInputError(
                f"the blocks hold {self.plan.num_samples} samples, the dataset {len(read)}"
            )

    #: Set by ``ResumableDataLoader(ring=True)``: the workers fill a ring of
    #: shared batch buffers (see ``cachex/torch/_ring.py``).
    ring: RingConfig | None = None

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
        if not isinstance(self.dataset, Prefetches):
            return None
        return self.dataset.prefetch(self.rank_order(epoch, num_workers).tolist())

    def register_plan(self, deal: Deal, worker: int = 0) -> PlanHandle | None:
        """Registers the batches worker ``worker`` reads in ``deal`` (positions
        ``j``, the rank's batch index) and in the next epoch's deal
        (positions ``L + j``, ``L`` = this deal's batches) with the
        dataset's tier, in place of the plan the worker registered before;
        the plan's handle, or ``None`` when the dataset has no tier (or
        ``plan_eviction`` is off). Each iteration does it; a loader that
        reads the deal itself (:class:`cachex.torch.ThreadedLoader`) calls it.

        A plan outlives its iteration: its part of the next epoch tells the
        tier what this worker reads next until the next iteration registers
        its own (between the two, the other ranks' plans alone would leave
        those pages unclaimed, and the first to be freed). It goes with
        this object."""
        handle = self._plan_of(deal, worker)
        kept = _KEPT_PLANS.setdefault(self, {})
        previous = kept.pop(worker, None)
        if handle is not None:
            kept[worker] = handle
        if previous is not None:
            previous.close()
        return handle

    def _plan_of(self, deal: Deal, worker: int) -> PlanHandle | None:
        """Registers worker ``worker``'s reads (see :meth:`register_plan`)."""
        ds = self.dataset
        if not self.plan_eviction or not isinstance(ds, RegistersPlans) or deal.num_batches == 0:
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
        return ds.set_plan(samples, np.concatenate(positions), length)

    def __iter__(self) -> Iterator[Any]:
        info = worker_info()
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        deal = self.deal(workers)
        if info is None:
            self._steps = 0
        handle = self.register_plan(deal, worker)
        yield from self._batches(deal, worker, handle, counted=info is None)

    def _batches(
        self, deal: Deal, worker: int, handle: PlanHandle | None, counted: bool
    ) -> Iterator[Any]:
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
        buffers = None
        ring: WorkerRing | None = None
        if isinstance(ds, BuffersBatches):
            if counted and self.reuse_buffers:
                buffers = ds.empty_batch(self.batch_size)
            elif not counted and self.ring is not None:
                # A ResumableDataLoader(ring=True) worker fills its ring's slots.
                ring = self.ring.worker_ring(worker, ds, self.batch_size)
        prefetch = ds.prefetch if isinstance(ds, Prefetches) else None
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


class MixedDataset(MapBase[Any]):
    """The samples of several streams as one dataset (see the module docs).

    Parameters
    ----------
    streams
        :class:`cachex.Stream`\\ s, or datasets / paths (a stream each, every
        sample once per epoch).
    epoch_size
        Samples per epoch with proportions (default: every stream's samples
        together; see :mod:`cachex.streams`).
    """

    def __init__(
        self,
        streams: Sequence[Stream | PlanDataset | str | os.PathLike[str]],
        *,
        epoch_size: int | None = None,
    ) -> None:
        if not streams:
            raise InvalidInputError("a mixture of no streams: give at least one")
        self.streams = [s if isinstance(s, Stream) else Stream(s) for s in streams]
        self.datasets = [s.dataset() for s in self.streams]
        self.epoch_size = epoch_size
        self.sizes = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes)[:-1])).astype(np.int64)
        stream_counts(self.sizes, self.streams, epoch_size)  # refuses bad weights now

    def __len__(self) -> int:
        return int(self.sizes.sum())

    def blocks(self) -> np.ndarray:
        """Every stream's blocks, the streams one after another."""
        return np.concatenate([np.asarray(d.blocks(), dtype=np.int64) for d in self.datasets])

    def counts(self, seed: int = 0) -> np.ndarray:
        """Each stream's samples per epoch (with the plan's ``seed``)."""
        return stream_counts(self.sizes, self.streams, self.epoch_size, seed)

    def sampling_plan(self, batch_size: int, **plan: Any) -> MixturePlan:
        """The :class:`cachex.streams.MixturePlan` of this mixture (``plan``: its keywords)."""
        blocks = [np.asarray(d.blocks(), dtype=np.int64) for d in self.datasets]
        return MixturePlan(blocks, self.counts(plan.get("seed", 0)), batch_size, **plan)

    def sampler(self, batch_size: int, **plan: Any) -> PlanSampler:
        """A :class:`PlanSampler` in the mixture's order (``plan``: its keywords)."""
        rank, world = plan.pop("rank", None), plan.pop("world_size", None)
        return PlanSampler.of_plan(
            self.sampling_plan(batch_size, **plan), rank=rank, world_size=world
        )

    def iterable(self, batch_size: int | None, **plan: Any) -> IterableBatches:
        """An :class:`IterableBatches` in the mixture's order (``plan``: its keywords)."""
        return IterableBatches(self, batch_size, **plan)

    def locate(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Each mixture index's stream and index within it."""
        ids = np.asarray(indices, dtype=np.int64).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(self)):
            raise InvalidInputError(f"indices outside the mixture's {len(self)} samples")
        stream = np.searchsorted(self.offsets, ids, side="right") - 1
        return stream, ids - self.offsets[stream]

    def __getitem__(self, index: Any) -> Any:
        try:
            i = operator.index(index)
        except TypeError:
            return self.batch(indices_of(index, len(self)))
        return self.item(i)

    def item(self, i: int) -> Any:
        """Sample ``i`` of the mixture, from its stream's dataset."""
        stream, local = self.locate([i])
        return self.datasets[int(stream[0])].item(int(local[0]))

    @functools.cached_property
    def zero_row_parts(self) -> list[Any]:
        """Each stream's batch of zero rows: the part of a slice that holds
        none of its rows, and what :attr:`merged` is decided from. A dataset
        that declares its fields (buffers laid out once, as the stores'
        datasets: :class:`cachex.protocols.BuffersBatches`) gives it without
        reading a sample; any other's first sample is read once and its
        batch cut to zero rows."""
        return [_zero_rows(d) for d in self.datasets]

    @functools.cached_property
    def merged(self) -> bool:
        """Whether this mixture's batches are one dict of the streams' fields
        (every stream's rows have the same fields, dtypes and row shapes)
        rather than ``{"stream": ..., "parts": ...}``; the same for every
        slice (see the module docs)."""
        specs = [_row_specs(p) for p in self.zero_row_parts]
        return specs[0] is not None and all(spec == specs[0] for spec in specs)

    def batch(self, indices: Sequence[int], out: Any = None) -> dict[str, Any]:
        """Samples ``indices`` of the mixture, each stream's rows read in one
        call, in the mixture's form (see the module docs; ``out`` is not used)."""
        stream, local = self.locate(list(indices))
        read = {
            s: self.datasets[s].batch(local[stream == s].tolist())
            for s in np.unique(stream).tolist()
        }
        if self.merged:
            return _merge(self.zero_row_parts[0], read, stream)
        parts = {
            s: read[s] if s in read else _no_rows(empty)
            for s, empty in enumerate(self.zero_row_parts)
        }
        return {"stream": stream, "parts": parts}


#: A batch field's dtype and the shape of one row.
_RowSpec = tuple[str, tuple[int, ...]]


def _row_spec(value: Any) -> _RowSpec | None:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None or len(shape) < 1:
        return None
    return str(dtype), tuple(int(d) for d in shape[1:])


def _row_specs(batch: Any) -> dict[str, _RowSpec] | None:
    """Each field's row spec of a dict batch whose every field is an array
    or tensor of rows; ``None`` for any other batch."""
    if not isinstance(batch, dict):
        return None
    specs = {name: _row_spec(v) for name, v in batch.items()}
    if any(spec is None for spec in specs.values()):
        return None
    return cast(dict[str, _RowSpec], specs)


def _no_rows(batch: Any) -> Any:
    """``batch`` cut to zero rows: an array or tensor to ``[:0]``, a
    :class:`cachex.Ragged` to no values, a dict or tuple part by part, a
    list (an item a row) to ``[]``."""
    if isinstance(batch, Ragged):
        return Ragged(batch.values[:0], batch.offsets[:1])
    if isinstance(batch, dict):
        return {name: _no_rows(v) for name, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(_no_rows(v) for v in batch)
    if isinstance(batch, list):
        return []
    if _row_spec(batch) is not None:
        return batch[:0]
    return batch


def _zero_rows(dataset: PlanDataset) -> Any:
    """``dataset``'s batch of zero rows (see :attr:`MixedDataset.zero_row_parts`)."""
    if isinstance(dataset, BuffersBatches) or len(dataset) == 0:
        return dataset.batch([])
    return _no_rows(dataset.batch([0]))


def _merge(like: dict[str, Any], parts: dict[int, Any], stream: np.ndarray) -> dict[str, Any]:
    """One dict of the parts' fields with rows in the batch's order; the
    fields, dtypes and row shapes are ``like``'s (a zero-row batch), which
    every part must have."""
    specs = _row_specs(like)
    for s, part in parts.items():
        got = _row_specs(part)
        if got != specs:
            raise InvalidInputError(
                f"stream {s}'s rows are {got}, not the mixture's {specs} "
                "(its streams' zero-row batches): a batch's fields, dtypes or "
                "row shapes differ from the stream's zero-row batch"
            )
    merged: dict[str, Any] = {}
    rows: Any
    for name, value in like.items():
        if torch is not None and isinstance(value, torch.Tensor):
            rows = torch.empty((len(stream), *value.shape[1:]), dtype=value.dtype)
            for s, part in parts.items():
                rows[torch.from_numpy(np.flatnonzero(stream == s))] = part[name]
        else:
            rows = np.empty((len(stream), *value.shape[1:]), dtype=value.dtype)
            for s, part in parts.items():
                rows[stream == s] = np.asarray(part[name])
        merged[name] = rows
    merged["stream"] = stream
    return merged
