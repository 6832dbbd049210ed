"""A loader without worker processes: native threads fill a ring of batch
buffers, allocated once, ahead of the training loop.

For a store read without Python transforms (a :class:`PageDataset`), the
DataLoader's worker processes only move bytes: each batch is allocated in a
worker and crosses into the training process. :class:`ThreadedLoader`
reads the same batches, in the same plan order, with native threads
(:class:`cachex._cachex.ThreadedFill`, the GIL released) straight into
``depth`` preallocated buffer sets in the training process::

    loader = ThreadedLoader(PageDataset(path, output="torch").iterable(256), threads=2)
    if saved:
        loader.load_state_dict(saved)          # any world size, any loader
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...                                # batch["data"], batch["data_lengths"]
            if step % 100 == 0:
                torch.save(loader.state_dict(), "loader.pt")

Where it differs from :class:`ResumableDataLoader` (deliberately):

- A dataset opened with ``ragged=True`` gets each bytes field as a
  :class:`cachex.Ragged` (values and offsets, no padding); the ring's
  values buffers are sized for the widest batch the file can make.
- A batch's buffers are a slot of the ring: valid until the next batch is
  requested (with ``pin_memory=True``, until the one after: the loop may
  still be copying the pinned batch to the GPU with ``non_blocking=True``).
  Copy what you keep (``.copy()``, ``.clone()``).
- Its batches are the rank's batches of the plan dealt as to a loader
  without workers (``num_workers=0``); the state says so, and loads into
  either loader with any world size or worker count.
- Fork safety: the threads do not exist in a forked child; an iteration
  started before the fork raises :class:`cachex.CacheError` there, a new
  iteration in the child starts its own threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from cachex._cachex import ThreadedFill
from cachex.errors import InvalidInputError
from cachex.ragged import Ragged
from cachex.torch._buffers import as_numpy, check_output, empty
from cachex.torch.datasets import PageDataset
from cachex.torch.iterable import IterableBatches
from cachex.torch.planned import PlanLoader

__all__ = ["ThreadedLoader"]


class ThreadedLoader(PlanLoader):
    """Batches of an :class:`IterableBatches` over a :class:`PageDataset`,
    filled by ``threads`` native threads into a ring of ``depth`` buffer
    sets allocated once, with ``state_dict()`` / ``load_state_dict()``.

    Parameters
    ----------
    dataset
        ``PageDataset(...).iterable(batch_size, ...)``: the plan (its seed,
        policy, rank and world size) and the fields read. Every rank yields
        the same number of batches.
    threads
        Fill threads (at least 1).
    depth
        Buffer sets in the ring (at least 2, 3 with ``pin_memory``): the
        threads run up to ``depth - 1`` batches ahead of the loop
        (``depth - 2`` with ``pin_memory``).
    pin_memory
        Allocate the ring in pinned memory (needs ``output="torch"`` on the
        dataset and CUDA); the buffers are reused, never reallocated.
    timeout
        Seconds to wait for a batch before raising :class:`cachex.CacheError`
        (``None``: as long as it takes).
    """

    def __init__(
        self,
        dataset: IterableBatches,
        *,
        threads: int = 2,
        depth: int = 4,
        pin_memory: bool = False,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(dataset, IterableBatches) or not isinstance(dataset.dataset, PageDataset):
            raise InvalidInputError(
                "ThreadedLoader reads PageDataset(...).iterable(batch_size): a page file "
                "read without Python transforms (use ResumableDataLoader for the others)"
            )
        if dataset.batch_size is None:
            raise InvalidInputError("ThreadedLoader needs batches: give iterable(batch_size)")
        pages = dataset.dataset
        check_output(pages.output, pin_memory)
        self.hold = 2 if pin_memory else 1
        if threads < 1 or depth <= self.hold:
            raise InvalidInputError(
                f"threads {threads}, depth {depth}: give threads >= 1 and depth >= {self.hold + 1}"
            )
        self.planned: IterableBatches = dataset
        self._pages = pages
        self.threads = int(threads)
        self.timeout = timeout
        self.steps = 0
        self._fill: ThreadedFill | None = None
        rows = dataset.batch_size
        layout = pages.layout
        self._ragged = layout.ragged
        int64 = np.dtype(np.int64)

        def alloc(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
            return empty(shape, dtype, pages.output, pin_memory)

        self._slots: list[dict[str, Any]] = []
        self._lengths: list[dict[str, Any]] = []
        for _ in range(depth):
            slot: dict[str, Any] = {}
            for name, (dtype, shape) in layout.specs.items():
                if name in self._ragged:
                    # Room for the widest values: never grown while threads fill.
                    widest = max(int(pages.reader.max_sizes[name]), 1) * rows
                    slot[name] = Ragged(alloc((widest,), dtype), alloc((rows + 1,), int64))
                else:
                    slot[name] = alloc((rows, *shape), dtype)
            self._slots.append(slot)
            self._lengths.append(
                {
                    name: alloc((rows,), int64)
                    for name in layout.specs
                    if pages.reader.fields[name] == "bytes" and name not in self._ragged
                }
            )
        self._views = [
            {
                name: (
                    (as_numpy(buf.values), as_numpy(buf.offsets))
                    if name in self._ragged
                    else as_numpy(buf, layout.specs[name][0])
                )
                for name, buf in slot.items()
            }
            for slot in self._slots
        ]
        self._length_views = [
            {name: as_numpy(buf) for name, buf in lengths.items()} for lengths in self._lengths
        ]

    @property
    def depth(self) -> int:
        """Buffer sets in the ring."""
        return len(self._slots)

    def __len__(self) -> int:
        """Batches every rank yields in the next iteration."""
        return len(self.planned)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.close()
        planned = self.planned
        deal = planned.deal(0)
        batches = list(deal.worker_batches(planned.rank, 0))
        offsets = np.zeros(len(batches) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in batches], out=offsets[1:])
        indices = (
            np.concatenate(batches).astype(np.int64, copy=False)
            if batches
            else np.empty(0, dtype=np.int64)
        )
        fill = ThreadedFill(
            self._pages.reader,
            indices,
            offsets,
            self._views,
            self._length_views,
            threads=self.threads,
            hold=self.hold,
        )
        self._fill = fill
        self.steps = 0
        handle = planned.register_plan(deal, 0)
        try:
            while (got := fill.next_batch(self.timeout)) is not None:
                slot, rows = got
                batch = {}
                for name, buf in self._slots[slot].items():
                    if name in self._ragged:
                        end = int(self._views[slot][name][1][rows])
                        batch[name] = Ragged(buf.values[:end], buf.offsets[: rows + 1])
                    else:
                        batch[name] = buf[:rows]
                for name, buf in self._lengths[slot].items():
                    batch[f"{name}_lengths"] = buf[:rows]
                # Counted as handed over: a state taken after this batch's
                # step resumes with the next one.
                self.steps += 1
                yield batch
                if handle is not None and not handle.closed:
                    handle.advance(self.steps)
        finally:
            fill.close()

    def close(self, timeout: float = 10.0) -> bool:
        """Stops the fill threads of the current iteration and joins them
        within ``timeout`` seconds; whether they ended."""
        fill, self._fill = self._fill, None
        return True if fill is None else fill.close(timeout)

    def __enter__(self) -> ThreadedLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The plan's state after the batches this iteration handed to the loop."""
        return self.planned.state_dict(steps=self.steps, num_workers=0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state of this loader or :class:`ResumableDataLoader`
        (taken by any rank of the stopped job)."""
        self.planned.load_state_dict(state)
        self.steps = 0
