"""A dataset over several streams of any store kinds, read as one mixture.

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
(``dataset.batch``). When every stream gives a dict of the same fields with
the same dtypes and row shapes, the batch is one dict of those fields, rows
in the batch's order, plus ``"stream"`` (int64: each row's stream);
otherwise it is ``{"stream": ..., "parts": {s: stream s's batch}}``, stream
``s``'s rows in the order they hold in the batch (the rows where
``stream == s``). A :class:`PlanSampler` over a mixture is
``MixedDataset.sampler``; ``dataset[indices]`` is :meth:`batch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cachex.errors import InvalidInputError
from cachex.streams import MixturePlan, Stream, stream_counts
from cachex.torch._buffers import torch
from cachex.torch.datasets import IterableBatches, PlanSampler, _Batched

__all__ = ["MixedDataset"]


class MixedDataset(_Batched):
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

    def __init__(self, streams: Sequence[Any], *, epoch_size: int | None = None) -> None:
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

    def item(self, i: int) -> Any:
        stream, local = self.locate([i])
        return self.datasets[int(stream[0])].item(int(local[0]))

    def batch(self, indices: Sequence[int], out: Any = None) -> dict[str, Any]:
        """Samples ``indices`` of the mixture, each stream's rows read in one
        call (see the module docs for the form; ``out`` is not used)."""
        stream, local = self.locate(list(indices))
        parts = {
            int(s): self.datasets[int(s)].batch(local[stream == s].tolist())
            for s in np.unique(stream).tolist()
        }
        merged = _merge(parts, stream)
        if merged is not None:
            return merged
        return {"stream": stream, "parts": parts}


def _row_spec(value: Any) -> tuple[str, tuple[int, ...]] | None:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None or len(shape) < 1:
        return None
    return str(dtype), tuple(int(d) for d in shape[1:])


def _merge(parts: dict[int, Any], stream: np.ndarray) -> dict[str, Any] | None:
    """One dict of the parts' fields with rows in the batch's order, when
    every part is a dict of the same fields, dtypes and row shapes."""
    if not parts or not all(isinstance(p, dict) for p in parts.values()):
        return None
    first = next(iter(parts.values()))
    specs = {name: _row_spec(v) for name, v in first.items()}
    if any(spec is None for spec in specs.values()):
        return None
    for part in parts.values():
        if part.keys() != first.keys() or any(_row_spec(v) != specs[k] for k, v in part.items()):
            return None
    merged: dict[str, Any] = {}
    rows: Any
    for name, value in first.items():
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
