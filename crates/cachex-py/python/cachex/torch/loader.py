"""A torch ``DataLoader`` that saves and restores its place in the epoch (needs torch).

The DataLoader prefetches: its workers and its sampler run ahead of the
training loop, so only the loader knows how many batches the loop really
received. :class:`ResumableDataLoader` counts them and asks the plan-driven
dataset or sampler (:class:`cachex.torch.IterableBatches`,
:class:`cachex.torch.PlanSampler`) for a state of that count, as litdata's
``StreamingDataLoader`` does::

    loader = ResumableDataLoader(PageDataset(path).iterable(256), num_workers=2)
    if saved:
        loader.load_state_dict(saved)          # any world size / worker count
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...
            if step % 100 == 0:
                torch.save(loader.state_dict(), "loader.pt")   # on each rank

Take the state between batches, in the main process. Restarted from it, the
job reads the rest of the epoch: no sample twice, none lost, also with a
different ``world_size``, ``num_workers`` or batch size.

With ``ring=True`` (an :class:`~cachex.torch.IterableBatches` over a page,
``.beton`` or memmap dataset, with workers), each worker fills a ring of
shared-memory batch buffers allocated once and only the slot's number and
lengths cross the queue (see ``cachex/torch/_ring.py``)::

    ds = PageDataset(path, ragged=True, output="torch")
    loader = ResumableDataLoader(ds.iterable(256), num_workers=2, ring=True)
    for batch in loader:          # valid until the loop takes the next batch
        kept = cachex.torch.keep(batch)   # a copy, for a batch kept longer

No segment is created and nothing is allocated per batch once every slot
was used; a batch's memory is reused once the loop took the next one, so
code that keeps batches (``list(loader)``) copies them with :func:`keep`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data._utils.collate import default_convert
from torch.utils.data._utils.pin_memory import pin_memory as _pin
from torch.utils.data._utils.signal_handling import (  # type: ignore[attr-defined]
    _remove_worker_pids,
)

from cachex.errors import InvalidInputError, WorkerError
from cachex.protocols import BuffersBatches
from cachex.torch._ring import RingBatch, RingConfig, RingReader
from cachex.torch.iterable import IterableBatches
from cachex.torch.planned import PlanLoader, PlanSampler

__all__ = ["ResumableDataLoader"]


class ResumableDataLoader(PlanLoader, DataLoader[Any]):
    """A ``DataLoader`` over a plan-driven dataset or sampler, with
    ``state_dict()`` / ``load_state_dict()``.

    Takes ``DataLoader``'s arguments. An :class:`~cachex.torch.IterableBatches`
    dataset (which batches itself) is loaded with ``batch_size=None``; a
    map-style dataset gets ``sampler=dataset.sampler(batch_size)`` the same
    way. ``len(loader)`` is the number of batches every rank yields.

    ``ring=True`` (with ``num_workers > 0``, over an ``IterableBatches`` of a
    dataset with ``empty_batch``: page, ``.beton``, memmap) reuses batch
    memory across the worker boundary: each worker fills
    ``prefetch_factor + 2`` shared-memory slots allocated once, and each
    batch is valid until the loop takes the next one (:func:`keep` copies
    one). ``ring_timeout`` is the longest a worker waits for a slot the
    loop still holds before raising :class:`cachex.WorkerError`. Off by
    default: batches a loop keeps (``list(loader)``) would be overwritten.
    A ``collate_fn`` runs in the main process over the views; with
    ``pin_memory=True`` each batch is then copied into pinned memory, as
    the DataLoader does. A worker that dies raises
    :class:`cachex.WorkerError` (from the DataLoader's ``RuntimeError``).
    """

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        ring: bool = False,
        ring_timeout: float = 300.0,
        **kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableBatches):
            kwargs.setdefault("batch_size", None)
        elif isinstance(kwargs.get("sampler"), PlanSampler):
            kwargs.setdefault("batch_size", None)
        self._ring_reader: RingReader | None = None
        self._ring_collate: Any = None
        if ring and kwargs.get("num_workers", 0) > 0:
            if not isinstance(dataset, IterableBatches) or not isinstance(
                dataset.dataset, BuffersBatches
            ):
                raise InvalidInputError(
                    "ring=True needs an IterableBatches over a dataset with empty_batch "
                    "(PageDataset, BetonDataset, MemmapDataset)"
                )
            # The batches cross as RingBatch messages; the loop's collation
            # runs on the views, in this process.
            self._ring_collate = kwargs.pop("collate_fn", None) or default_convert
            kwargs["collate_fn"] = _as_is
            workers = int(kwargs["num_workers"])
            prefetch = kwargs.get("prefetch_factor") or 2
            acks = torch.zeros((workers, 2), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
            config = RingConfig(depth=int(prefetch) + 2, acks=acks, timeout=float(ring_timeout))
            dataset.ring = config
            self._ring_reader = RingReader(config, numpy_output=dataset.dataset.output == "numpy")
        super().__init__(dataset, *args, **kwargs)
        if isinstance(dataset, IterableBatches):
            self.planned: IterableBatches | PlanSampler = dataset
        elif isinstance(self.sampler, PlanSampler):
            self.planned = self.sampler
        else:
            raise InvalidInputError(
                "ResumableDataLoader needs a cachex.torch.IterableBatches dataset "
                "or sampler=cachex.torch.PlanSampler(...)"
            )
        self.steps = 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self.steps = 0
        if self._IterableDataset_len_called is not None:
            # DataLoader keeps the length it last reported and warns past
            # it; a new epoch or a loaded state changes it.
            self._IterableDataset_len_called = len(self.planned)
        ring = self._ring_reader
        if ring is not None:
            ring.start(forget=not self.persistent_workers)
        held: RingBatch | None = None
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (RuntimeError, EOFError, OSError) as e:
                if not _worker_died(batches, e):
                    raise
                # Stop the other workers and torch's watch on them now: the
                # error may be caught and the loader iterated again.
                _stop(batches)
                self._iterator = None
                raise WorkerError(
                    f"ResumableDataLoader: a DataLoader worker exited unexpectedly ({e})"
                ) from e
            if ring is not None:
                msg = batch if isinstance(batch, RingBatch) else None
                batch = self._ring_collate(batch if msg is None else ring.view(msg))
                if self.pin_memory:
                    batch = _pin(batch)  # type: ignore[no-untyped-call]
                # The loop took this batch: the one before is free.
                if held is not None:
                    ring.release(held)
                held = msg
            # Counted as handed over: a state taken after this batch's step
            # resumes with the next one.
            self.steps += 1
            yield batch

    def ring_stats(self) -> dict[str, int]:
        """With ``ring=True``: ``{"mapped": slot buffer sets this process
        mapped, "allocations": shared buffers the workers allocated}``;
        both stay flat once every slot was used. Empty without a ring."""
        return {} if self._ring_reader is None else self._ring_reader.stats()

    def state_dict(self) -> dict[str, Any]:
        """The plan's state after the batches this run handed to the loop."""
        return self.planned.state_dict(steps=self.steps, num_workers=self.num_workers)

    def load_state_dict(self, state: dict[str, Any], skip_steps: int = 0) -> None:
        """Resume from :meth:`state_dict`'s output (taken by any rank of the stopped
        job), skipping ``skip_steps`` global batches unread."""
        self.planned.load_state_dict(state, skip_steps=skip_steps)
        self.steps = 0


def _worker_died(batches: Any, error: BaseException) -> bool:
    """Whether ``error`` from the DataLoader iterator ``batches`` means one
    of its workers is gone: torch's own report, or a broken connection
    while this process fetched memory a worker sent (then its exit shows
    within a second or two)."""
    if "exited unexpectedly" in str(error):
        return True
    if isinstance(error, RuntimeError):
        return False
    workers = getattr(batches, "_workers", [])
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            if any(not w.is_alive() for w in workers):
                return True
            time.sleep(0.01)
        except RuntimeError as again:  # torch's SIGCHLD handler saw it first
            if "exited unexpectedly" in str(again):
                return True
            raise
    return False


def _stop(batches: Any) -> None:
    """Ends the workers of the DataLoader iterator ``batches`` after one died."""
    for _ in range(3):
        # torch's SIGCHLD handler raises while the dead worker is watched.
        try:
            if getattr(batches, "_worker_pids_set", False):
                _remove_worker_pids(id(batches))
                batches._worker_pids_set = False
            break
        except RuntimeError as e:
            if "exited unexpectedly" not in str(e):
                break
    shutdown = getattr(batches, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _as_is(batch: Any) -> Any:
    """The workers' collation with a ring: the message crosses as it is."""
    return batch
