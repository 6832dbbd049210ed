"""Caching a module's outputs from every rank of a distributed job into one
cache: the DDP helpers over the drop-in's backend, which users import from
:mod:`cachex.torch` (``from cachex.torch import rank_backend``).

By default a segment store has one writer (``writer_rank``) and the other
ranks only fill their in-memory LRU, so the work of every other rank is
recomputed in the next run. In multi-writer mode (segment-store's
``writer_id``) every rank persists into the same directory, each into its
own segments and index log, without a shared lock (fit for NFS and Lustre):

* torchcachex's decorator: ``rank_backend(cache_dir, module_id)`` is an
  :class:`cachex.torchcachex.ArrowIPCCacheBackend` whose ``writer_id`` is
  this process's rank (from ``torch.distributed`` or ``RANK``);
* :func:`cachex.cached`: give the config ``"options": {"multi_writer":
  True}`` (the writer id is ``RANK``).

A rank sees what it wrote at once, and what the other ranks wrote when it
reopens: at the epoch boundary, after every rank flushed (``flush()`` then
a barrier), call :func:`refresh_backend` (or :meth:`cachex.CachedFn.refresh`)
and every rank hits on every key any rank wrote::

    backend = rank_backend("cache", "encoder")
    encoder = CacheModuleDecorator(model, backend)
    for epoch in range(epochs):
        for batch in loader:
            feats = encoder(batch["x"], cache_ids=batch["ids"])
        backend.flush()
        torch.distributed.barrier()
        refresh_backend(backend)

``cache_dir`` may be a URL (``s3://bucket/prefix``; see
:class:`cachex.torchcachex.ArrowIPCCacheBackend`): each rank's ``flush()``
publishes its segments, and :func:`refresh_backend` applies the others'.

``cachex verify <dir>`` checks such a cache like any other.
"""

from __future__ import annotations

import os
from typing import Any

from cachex.dropins.torchcachex.backend import ArrowIPCCacheBackend
from cachex.sampling import distributed_rank

__all__ = ["rank_backend", "refresh_backend"]


def rank_backend(
    cache_dir: str | os.PathLike[str],
    module_id: str,
    *,
    rank: int | None = None,
    **options: Any,
) -> ArrowIPCCacheBackend:
    """An :class:`ArrowIPCCacheBackend` in which this rank persists as writer ``rank``.

    ``rank`` defaults to :func:`cachex.sampling.distributed_rank`'s;
    ``options`` are the backend's (``lru_size``, ``flush_every``, ...).
    """
    r, _ = distributed_rank(rank, None if rank is None else rank + 1)
    options.setdefault("current_rank", r)
    return ArrowIPCCacheBackend(cache_dir, module_id, writer_id=r, **options)


def refresh_backend(backend: ArrowIPCCacheBackend) -> None:
    """Flushes this rank's writes and makes what the other writers had
    committed (their ``flush()``) visible: on a URL the flush publishes and
    :meth:`~ArrowIPCCacheBackend.refresh` applies what the others
    published; in a directory the store reopens
    (:meth:`~ArrowIPCCacheBackend.reopen`) and reads every writer's index log.

    Costs one open of the cache (reading its index logs), so call it at an
    epoch boundary, not per batch.
    """
    backend.flush()
    if backend.url is not None:
        backend.refresh()
    else:
        backend.reopen()
