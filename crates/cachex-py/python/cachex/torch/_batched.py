"""The bases of the map-style datasets over the stores: :class:`Batched`
(``dataset[i]`` one item, ``dataset[indices]`` one batch, the plan's
sampler and iterable over it) and :class:`Buffered` (batches that are
buffers its reader fills, laid out by a :class:`BatchLayout`)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from cachex.protocols import Output
from cachex.ragged import Ragged
from cachex.sampling import even_blocks
from cachex.torch._buffers import (
    Allocator,
    BatchLayout,
    MapBase,
    as_numpy,
    check_output,
    empty,
    indices_of,
    like,
    shared,
)
from cachex.torch.iterable import IterableBatches
from cachex.torch.planned import PlanSampler

__all__ = ["Batched", "Buffered"]


class Batched(MapBase[Any]):
    """``dataset[i]`` is one item, ``dataset[indices]`` one batch (see :meth:`batch`)."""

    output: Output
    pin_memory: bool

    def _setup(self, output: Output, pin_memory: bool) -> None:
        """Checks and keeps the type of batches (``output``, ``pin_memory``)."""
        check_output(output, pin_memory)
        self.output = output
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        raise NotImplementedError

    def item(self, i: int) -> Any:
        """Sample ``i``."""
        raise NotImplementedError

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        """Samples ``indices`` as one batch."""
        raise NotImplementedError

    def blocks(self) -> npt.NDArray[np.int64]:
        """Samples per block in index order: the unit a
        :class:`~cachex.sampling.SamplingPlan` keeps together."""
        return even_blocks(len(self), 1)

    def sampler(self, batch_size: int, **plan: Any) -> PlanSampler:
        """A :class:`PlanSampler` over this dataset's blocks (``plan``: its keywords)."""
        return PlanSampler(self.blocks(), batch_size, **plan)

    def iterable(self, batch_size: int | None, **plan: Any) -> IterableBatches:
        """An :class:`IterableBatches` over this dataset (``plan``: its keywords)."""
        return IterableBatches(self, batch_size, **plan)

    def __getitem__(self, index: Any) -> Any:
        try:
            i = operator.index(index)
        except TypeError:
            return self.batch(indices_of(index, len(self)))
        return self.item(i)


class Buffered(Batched):
    """A dataset whose batches are buffers its reader fills (``fill_batch``,
    GIL released; a subclass's ``_fill``), laid out by :attr:`layout`: one
    buffer per name of its ``specs``, a :class:`cachex.Ragged` for each of
    its ``ragged`` names, and what the fill reports per name as
    ``"<name><suffix>"``."""

    #: The batch's buffers (see :class:`BatchLayout`).
    layout: BatchLayout

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
        return self.layout.buffers(n, alloc, alloc)

    def _allocator(self, shared_memory: bool = False) -> Allocator:
        """How this dataset allocates a buffer of a shape and dtype (torch
        tensors in shared memory with ``shared_memory``)."""

        def alloc(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
            if shared_memory:
                return shared(shape, dtype)
            return empty(shape, dtype, self.output, self.pin_memory)

        return alloc

    def batch(self, indices: Sequence[int], out: dict[str, Any] | None = None) -> dict[str, Any]:
        """Samples ``indices`` as ``{name: buffer}`` (``out``'s first rows when
        given). A ragged field is a :class:`cachex.Ragged` over ``out``'s
        pair; when a batch's values outgrow its values buffer, ``out[name]``
        is replaced by a pair with a larger one (at least twice as large,
        so a reused ``out`` stops growing after the first batches)."""
        indices = list(indices)
        n = len(indices)
        fresh = out is None
        layout = self.layout
        alloc = self._allocator()
        if out is None:
            # Ragged values sized once the fill reported them.
            out = layout.buffers(n, alloc, np.empty)
        buffers: dict[str, Any] = {}
        for name, (dtype, _) in layout.specs.items():
            if name in layout.ragged:
                values, offsets = out[name]
                buffers[name] = (as_numpy(values, dtype), as_numpy(offsets))
            else:
                buffers[name] = as_numpy(out[name], dtype)
        reported = self._fill(indices, buffers)
        short = [name for name in layout.ragged if reported[name] > len(buffers[name][0])]
        for name in layout.ragged if fresh else short:
            values, offsets = out[name]
            need = int(reported[name])
            # A buffer kept for reuse grows with room to spare, one for this
            # batch alone to its size.
            dtype = layout.specs[name][0]
            if fresh:
                grown = alloc((need,), dtype)
            else:
                grown = like(values, (max(need + need // 4, 2 * len(values)),), dtype)
            out[name] = Ragged(grown, offsets)
            buffers[name] = (as_numpy(grown, dtype), buffers[name][1])
        if short:
            reported = self._fill(indices, buffers)
        batch: dict[str, Any] = {}
        for name in layout.specs:
            if name in layout.ragged:
                values, offsets = out[name]
                batch[name] = Ragged(values[: int(reported[name])], offsets[: n + 1])
            else:
                batch[name] = out[name][:n]
        suffix, dtype = layout.extra
        for name, rows in reported.items():
            if name not in layout.ragged:
                batch[f"{name}{suffix}"] = np.asarray(rows, dtype=dtype)
        return batch
