"""The sampling plan in a training loop: what the plan's readers share.

:class:`Planned` holds a :class:`~cachex.sampling.SamplingPlan`, this
process's rank, the epoch and how far it got in the global order (shared
with DataLoader workers), and the state dict; :class:`PlanSampler` (batches
of indices for a DataLoader's ``sampler``) and
:class:`cachex.torch.IterableBatches` are planned. :class:`PlanLoader` is
what the loaders over one share (:class:`cachex.torch.ResumableDataLoader`,
:class:`cachex.torch.ThreadedLoader`): the plan's epoch and the steps the
loop took in it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from cachex.errors import InvalidInputError
from cachex.sampling import (
    Affinity,
    Deal,
    Policy,
    Progress,
    SamplingPlan,
    SharedProgress,
    data_parallel,
    distributed_rank,
)

__all__ = ["PlanLoader", "PlanSampler", "Planned"]


class PlanLoader:
    """What the loaders over a plan share (``ResumableDataLoader``,
    ``ThreadedLoader``): the plan's epoch and the steps taken in it."""

    planned: Planned
    steps: int

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self.planned.epoch

    def set_epoch(self, epoch: int) -> None:
        """As the dataset's or sampler's ``set_epoch`` (a new epoch starts at step 0)."""
        if int(epoch) != self.planned.epoch:
            self.steps = 0
        self.planned.set_epoch(epoch)


class Planned:
    """What the plan-driven sampler and iterable share: the plan, this
    process's rank, the epoch and how far it got in the global order
    (shared with DataLoader workers), and the state dict."""

    plan: SamplingPlan
    rank: int
    world_size: int

    def _plan_setup(self, plan: SamplingPlan, rank: int | None, world_size: int | None) -> None:
        self.plan = plan
        self.rank, self.world_size = distributed_rank(rank, world_size)
        # Refused here rather than at the first batch: a world size the
        # replication or the global batch does not divide.
        self.global_batch_size = plan.global_batch(self.world_size)
        if self.global_batch_size % data_parallel(self.world_size, plan.replication):
            raise InvalidInputError(
                f"global_batch_size {self.global_batch_size} does not split over "
                f"{data_parallel(self.world_size, plan.replication)} data-parallel ranks"
            )
        self._progress = SharedProgress(homes=self.plan.homes)
        self._steps = 0  # batches this process yielded in its current run

    @property
    def epoch(self) -> int:
        """The epoch the next iteration reads."""
        return self._progress.get().epoch

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch of the next iterations (as ``DistributedSampler.set_epoch``).

        It reaches persistent DataLoader workers too. Moving to another
        epoch forgets how far a loaded state had got; setting the loaded
        state's own epoch keeps it (so a loop that calls ``set_epoch`` at the
        top of every epoch resumes where the state left off).
        """
        if int(epoch) != self.epoch:
            self._progress.set(Progress(int(epoch)))
        self._steps = 0

    def _layout_workers(self, num_workers: int) -> int:
        """The workers the plan deals batches to when the DataLoader has ``num_workers``."""
        raise NotImplementedError

    def deal(self, num_workers: int = 0) -> Deal:
        """This epoch's unread global batches dealt to the ranks (and a DataLoader's workers)."""
        p = self._progress.get()
        self.plan.adopt_homes(self._progress.homes)  # a state loaded after workers started
        return self.plan.deal(
            p.epoch, self.world_size, self._layout_workers(num_workers), p, self.global_batch_size
        )

    def __len__(self) -> int:
        """Batches every rank yields in the next iteration."""
        return self.deal().num_batches

    def rank_order(self, epoch: int | None = None, num_workers: int = 0) -> np.ndarray:
        """The samples this rank reads in epoch ``epoch`` with a DataLoader of
        ``num_workers``, in the order its loop receives them (default: the
        next iteration's, what a loaded state left of it): what to prefetch
        ahead of that epoch."""
        if epoch is None or int(epoch) == self.epoch:
            deal = self.deal(num_workers)
        else:
            layout = self._layout_workers(num_workers)
            self.plan.adopt_homes(self._progress.homes)
            deal = self.plan.deal(int(epoch), self.world_size, layout, 0, self.global_batch_size)
        return deal.rank_order(self.rank)

    def state_dict(self, steps: int | None = None, num_workers: int = 0) -> dict[str, Any]:
        """The epoch and its position in the global order: a few numbers,
        never a list of samples.

        ``steps`` is how many batches this rank's training loop received in
        this run (default: counted by this object, right when it iterates in
        the main process; with DataLoader workers use
        :class:`cachex.torch.ResumableDataLoader`, which counts them).
        Every rank's state is the same. ``num_workers`` is not needed any
        more (the position does not depend on it) and is accepted for the
        callers that pass it.
        """
        steps = self._steps if steps is None else int(steps)
        p = self._progress.get()
        if steps:
            self.plan.adopt_homes(self._progress.homes)
            n = len(self.plan.epoch_order(p.epoch))  # cached: no deal to build
            end = min(p.position + steps * self.global_batch_size, n)
            p = Progress(p.epoch, end, self.global_batch_size)
        return self.plan.state(p)

    def load_state_dict(self, state: dict[str, Any], skip_steps: int = 0) -> None:
        """Resumes from :meth:`state_dict`'s output, with any world size,
        worker count, replication or global batch size.

        The next iteration reads the state's epoch from its position in the
        global order on, re-dealt to this job's ranks and workers, after
        skipping ``skip_steps`` global batches (of this job's size) unread
        (e.g. the batches around a loss spike).
        """
        progress = self.plan.progress_of(state)
        self._progress.homes = self.plan.homes
        if skip_steps:
            progress = self.plan.skip(progress, skip_steps, self.global_batch_size)
        self._progress.set(progress)
        self._steps = 0


class PlanSampler(Planned):
    """Batches of indices of a :class:`SamplingPlan` for this rank, for a
    map-style dataset (``dataset.sampler(batch_size)`` makes one)::

        loader = DataLoader(dataset, sampler=dataset.sampler(256), batch_size=None,
                            num_workers=4)

    Every rank gets the same number of batches; each sample is read once per
    epoch (see :mod:`cachex.sampling` for ``policy``). The rank comes from
    ``rank``/``world_size``, else ``torch.distributed``, else the environment.
    Call :meth:`set_epoch` before each epoch; resume with
    :meth:`load_state_dict` (the DataLoader runs ahead of the training loop:
    take states from :class:`cachex.torch.ResumableDataLoader`).
    ``global_batch_size`` and ``replication`` are the plan's (see
    :class:`SamplingPlan`); with ``global_batch_size`` the batches are this
    rank's slices of it, whatever ``batch_size``.
    """

    def __init__(
        self,
        blocks: int | Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        policy: Policy = "pad",
        rank: int | None = None,
        world_size: int | None = None,
        affinity: Affinity = "global",
        homes: int | None = None,
        cross_node: float = 0.0,
        global_batch_size: int | None = None,
        replication: int = 1,
    ) -> None:
        plan = SamplingPlan(
            blocks,
            batch_size,
            seed=seed,
            shuffle=shuffle,
            policy=policy,
            affinity=affinity,
            homes=homes,
            cross_node=cross_node,
            global_batch_size=global_batch_size,
            replication=replication,
        )
        self._plan_setup(plan, rank, world_size)

    @classmethod
    def of_plan(
        cls, plan: SamplingPlan, *, rank: int | None = None, world_size: int | None = None
    ) -> PlanSampler:
        """A sampler of ``plan`` (a :class:`cachex.streams.MixturePlan`, say) for this rank."""
        sampler = cls.__new__(cls)
        sampler._plan_setup(plan, rank, world_size)
        return sampler

    def _layout_workers(self, num_workers: int) -> int:
        return 1  # the main process hands out every batch, whatever the workers

    def __iter__(self) -> Iterator[list[int]]:
        self._steps = 0
        for indices in self.deal().worker_batches(self.rank):
            self._steps += 1
            yield indices.tolist()
