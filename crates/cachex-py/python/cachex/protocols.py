"""What the readers of a sampling plan take from a dataset, as typing protocols.

:class:`cachex.torch.IterableBatches`, :class:`cachex.torch.PlanSampler`'s
loaders, :class:`cachex.torch.MixedDataset` and a :class:`cachex.Stream`
read any object with the methods of :class:`PlanDataset`; the datasets of
:mod:`cachex.torch` have them, and a dataset of your own that has them is
read the same way. What a dataset has beyond that, the readers use when it
is there:

=============================  ==================================================
:class:`PlanDataset`           ``len``, ``item(i)``, ``batch(indices, out=None)``,
                               ``blocks()``: what every reader needs
:class:`Prefetches`            ``prefetch(indices)``: warms the next batch, and the
                               next epoch (``IterableBatches.prefetch_epoch``)
:class:`RegistersPlans`        ``set_plan(samples, positions, epoch_len)``: tells a
                               local tier the reads to come (``plan_eviction``)
:class:`BuffersBatches`        ``empty_batch(n, shared=)`` and ``output``: batches
                               filled into buffers allocated once
                               (``reuse_buffers``, ``ResumableDataLoader(ring=True)``)
:class:`MakesPlan`             ``sampling_plan(batch_size, **plan)``: a dataset
                               that orders its own epochs (a mixture of streams)
=============================  ==================================================

The checks are structural (``isinstance`` against a protocol looks the
methods up), so nothing needs to subclass these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from cachex._cachex import PlanHandle, Prefetch
from cachex.sampling import SamplingPlan

__all__ = [
    "BuffersBatches",
    "MakesPlan",
    "Output",
    "PlanDataset",
    "Prefetches",
    "RegistersPlans",
]

#: The type of a dataset's batches: numpy arrays or torch tensors.
Output = Literal["numpy", "torch"]


@runtime_checkable
class PlanDataset(Protocol):
    """A map-style dataset read in the order of a plan: ``len(dataset)``
    samples, laid out in ``blocks()`` (samples per block in index order,
    the unit a :class:`cachex.sampling.SamplingPlan` keeps together); one
    sample by ``item(i)``, several as one batch by ``batch(indices)``
    (into ``out``'s buffers when the dataset buffers its batches)."""

    def __len__(self) -> int: ...

    def item(self, i: int) -> Any:
        """Sample ``i``."""

    def batch(self, indices: Sequence[int], out: Any = None) -> Any:
        """Samples ``indices`` as one batch."""

    def blocks(self) -> npt.NDArray[np.int64]:
        """Samples per block, in index order."""


@runtime_checkable
class Prefetches(Protocol):
    """A dataset that warms samples ahead of their reads (fetches them into
    a local tier, or asks the kernel to read ahead)."""

    def prefetch(self, indices: Sequence[int]) -> Prefetch:
        """Starts warming samples ``indices``, in that order."""


@runtime_checkable
class RegistersPlans(Protocol):
    """A dataset read through a local tier that takes a plan of reads, so
    that the tier evicts what is needed furthest ahead first."""

    def set_plan(
        self, samples: npt.ArrayLike, positions: npt.ArrayLike, epoch_len: int
    ) -> PlanHandle | None:
        """Registers that sample ``samples[j]`` is read at batch
        ``positions[j]`` (``0..epoch_len`` this epoch, the next epoch
        after); ``None`` where there is no tier to tell."""


@runtime_checkable
class BuffersBatches(PlanDataset, Protocol):
    """A dataset whose batches are buffers its reader fills, which a loader
    may allocate once and pass to ``batch`` as ``out``."""

    #: The type of the buffers.
    output: Output

    def empty_batch(self, n: int, *, shared: bool = False) -> dict[str, Any]:
        """Uninitialised buffers for ``n`` samples (``shared``: torch
        tensors in shared memory, for another process to map)."""


@runtime_checkable
class MakesPlan(Protocol):
    """A dataset that orders its own epochs (a mixture of streams)."""

    def sampling_plan(self, batch_size: int, **plan: Any) -> SamplingPlan:
        """Its plan, with a :class:`cachex.sampling.SamplingPlan`'s keywords."""
