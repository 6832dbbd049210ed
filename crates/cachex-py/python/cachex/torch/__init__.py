"""cachex in training loops: datasets over every store, the sampling plan's
sampler and iterable, the resumable ``DataLoader`` and every DDP rank
caching into one store. torch is optional for the datasets (they work on
numpy alone); :class:`ResumableDataLoader` needs it.

=====================================  ===========================================
:mod:`cachex.torch.datasets`           map-style datasets over each store
                                       (:class:`SegmentDataset`, :class:`MemmapDataset`,
                                       :class:`ShardDataset`, :class:`PageDataset`,
                                       :class:`BetonDataset`)
:mod:`cachex.torch.iterable`           :class:`IterableBatches`: any of them read in the
                                       order of one :class:`cachex.sampling.SamplingPlan`;
                                       :class:`MixedDataset`: several streams
                                       (:class:`cachex.Stream`) read as one mixture
:mod:`cachex.torch.planned`            :class:`PlanSampler` (batches of indices in plan
                                       order) and what the plan's readers share
:mod:`cachex.torch.loader`             :class:`ResumableDataLoader` (needs torch)
:mod:`cachex.torch.threaded`           :class:`ThreadedLoader`: native threads fill a
                                       ring of batch buffers, no worker processes
``cachex/torch/_ring.py``              the workers' batch ring (``ring=True``) and
                                       :func:`keep` (needs torch)
``cachex/torch/_batched.py``           the datasets' bases: items, batches, buffers
``cachex/torch/_buffers.py``           batch buffers and collation (numpy or torch)
=====================================  ===========================================

What the readers need of a dataset is in :mod:`cachex.protocols`. Every
name is importable from ``cachex.torch`` itself, with the torchcachex
drop-in's DDP helpers :func:`rank_backend` and :func:`refresh_backend`
(every rank persists into one segment store; their module is
:mod:`cachex.dropins.torchcachex.ddp`, named here where the guide finds
them).
"""

from __future__ import annotations

from cachex.dropins.torchcachex.ddp import rank_backend, refresh_backend
from cachex.torch._buffers import HAS_TORCH
from cachex.torch.datasets import *  # noqa: F403 - every name of its __all__
from cachex.torch.datasets import __all__ as _datasets
from cachex.torch.iterable import MixedDataset
from cachex.torch.threaded import ThreadedLoader

__all__ = [*_datasets, "MixedDataset", "ThreadedLoader", "rank_backend", "refresh_backend"]

if HAS_TORCH:
    from cachex.torch._ring import keep
    from cachex.torch.loader import ResumableDataLoader

    __all__ += ["ResumableDataLoader", "keep"]
