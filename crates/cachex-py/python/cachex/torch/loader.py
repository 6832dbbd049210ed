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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from cachex.errors import InvalidInputError
from cachex.torch.datasets import IterableBatches, PlanSampler

__all__ = ["ResumableDataLoader"]


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` over a plan-driven dataset or sampler, with
    ``state_dict()`` / ``load_state_dict()``.

    Takes ``DataLoader``'s arguments. An :class:`~cachex.torch.IterableBatches`
    dataset (which batches itself) is loaded with ``batch_size=None``; a
    map-style dataset gets ``sampler=dataset.sampler(batch_size)`` the same
    way. ``len(loader)`` is the number of batches every rank yields.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(dataset, IterableBatches):
            kwargs.setdefault("batch_size", None)
        elif isinstance(kwargs.get("sampler"), PlanSampler):
            kwargs.setdefault("batch_size", None)
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

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self.planned.epoch

    def set_epoch(self, epoch: int) -> None:
        """As the dataset's or sampler's ``set_epoch`` (reaches persistent workers)."""
        if int(epoch) != self.planned.epoch:
            self.steps = 0
        self.planned.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        self.steps = 0
        if self._IterableDataset_len_called is not None:
            # DataLoader keeps the length it last reported and warns past
            # it; a new epoch or a loaded state changes it.
            self._IterableDataset_len_called = len(self.planned)
        for batch in super().__iter__():
            # Counted as handed over: a state taken after this batch's step
            # resumes with the next one.
            self.steps += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The plan's state after the batches this run handed to the loop."""
        return self.planned.state_dict(steps=self.steps, num_workers=self.num_workers)

    def load_state_dict(self, state: dict[str, Any], skip_steps: int = 0) -> None:
        """Resume from :meth:`state_dict`'s output (taken by any rank of the stopped
        job), skipping ``skip_steps`` global batches unread."""
        self.planned.load_state_dict(state, skip_steps=skip_steps)
        self.steps = 0
