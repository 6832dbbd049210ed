"""One sampling plan for every store: partitioned, deterministic, resumable.

A :class:`SamplingPlan` is a pure function of the dataset's size and block
layout (the pages of a page file or an FFCV ``.beton``, the shards of a
shard store, row blocks of a memmap array, key blocks of a segment store),
the seed, the epoch, the global batch size, the world size, the
replication, the DataLoader worker count and how far the epoch has got. No
store is touched; numpy does the work (a 10M-sample epoch costs one
``argsort``, no Python loop per sample). A mixture of several stores
(:class:`cachex.Stream`) is a :class:`cachex.streams.MixturePlan`: the same
plan over an epoch order that interleaves the streams.

The epoch's order
-----------------
For ``(seed, epoch)`` the blocks are shuffled, then the samples within each
block (FFCV's quasi-random order, MosaicML's block shuffle): consecutive
samples of the order come from one block, so a reader keeps a few blocks
resident. ``shuffle=False`` keeps file order.

Node-affine order
-----------------
With ``affinity="node"`` the blocks have **homes**, ``homes`` groups (one
per node; default ``WORLD_SIZE // LOCAL_WORLD_SIZE``, else 1) fixed for the
run: a seed-derived permutation of the blocks cut into contiguous groups of
about ``N / homes`` samples each (within one block). Each epoch a fraction
``cross_node`` = f of the blocks, drawn afresh, leaves its home and is dealt
to the groups short of ``N / homes``. Each group's blocks are shuffled and
the samples within each block every epoch, and the epoch's order takes the
groups in turn, one sample each (round robin: any stretch of the order
holds about as many of each group); within each global batch the samples
are then sorted by group, stably, so the batch holds ``G / homes`` samples
of every group, group 0's first. ``torchrun``'s ranks are node-major
(``rank = node * ranks_per_node + local``), so with ``world_size = homes *
ranks_per_node`` and ``G`` a multiple of ``homes`` node ``n`` reads group
``n`` (until the smaller groups run out near the epoch's end): the same
blocks every epoch, which its local tier keeps, in a new order. The order
does not depend on the world size (for a fixed ``homes``), so every
guarantee below holds as it does for the global order; ``cross_node=1``
(or one home) *is* the global order.

The price is shuffle quality: a node's epoch draws from its own group, and
only a fraction f of the blocks crosses between nodes per epoch. Once each
node's tier holds its share, the bucket serves per epoch the blocks away
from home, about ``f * (1 - 1/homes) * D`` (D: the dataset), if the tier
keeps a node's home blocks while they are away (a budget of about
``1 + f`` shares), and ``(1 - overlap) * D`` if it holds just the blocks
of the node's last epoch. :func:`node_overlap` measures the overlap: the
fraction of a node's samples of one epoch that it also read in the epoch
before. For 1000 blocks of 32 samples, 4 homes, 2 ranks per node (mean
over the nodes and epochs 1..4)::

    cross_node f   overlap   bucket / D per epoch, tier of 1+f shares   1 share
    0              1.000     0                                          0
    0.1            0.858     0.075                                      0.14
    0.25           0.668     0.19                                       0.33
    0.5            0.444     0.375                                      0.56
    1              0.239     -                                          0.76

``cross_node=1`` is the global order, where a node overlaps by about
``1 / homes``.

Global batches
--------------
The order is cut into **global batches** of ``G`` samples
(``global_batch_size``; default ``batch_size`` times the data-parallel
ranks): global batch ``k`` is the order's samples ``[k G, (k + 1) G)``
(from where the epoch was resumed), the same samples in the same places
whatever the world size and worker count. The ``world_size`` ranks form
``D = world_size / replication`` data-parallel ranks (``replication=k``:
``k`` consecutive ranks, a tensor- or sequence-parallel group, read the
same batches; the world size must be a multiple of ``k``), and
data-parallel rank ``d`` reads the ``d``-th slice of ``G / D`` samples of
each global batch (``D`` must divide ``G``). Rank batch ``j`` is its slice
of global batch ``j`` and is produced by DataLoader worker ``j %
num_workers`` (the order in which torch's DataLoader takes batches from
its workers). So that **every rank yields the same number of batches** (a
rank with fewer would leave the collective and hang the others), the
``policy`` settles the last, partial global batch of ``m < G`` samples:

``"pad"`` (default; ``DistributedSampler``'s ``drop_last=False``)
    It is read: every rank's slice is ``ceil(m / D)`` samples, the order
    extended by repeating its first samples, fewer than ``D`` of them
    (:attr:`Deal.padded` counts them).
``"drop_last"``
    It is not read this epoch (:attr:`Deal.dropped`).

Otherwise every sample is read exactly once per epoch. A rank's
consecutive batches are ``G`` samples apart in the order, so a worker no
longer reads a run of blocks of its own: a global batch of ``G``
consecutive samples spans about ``G / block`` blocks, which the ranks
share. That is the price of an order that does not depend on the world
size.

Resumption and skipping
-----------------------
How far an epoch got is its **position**: the samples of the order read,
``k G`` after ``k`` global batches. A state dict (format
``cachex.sampling/2``) holds the plan's identity, the epoch and the
position; a restart with any world size, worker count or replication
deals global batches from the position on, so it reads exactly what the
uninterrupted job would have (with ``"pad"``, the last batch's padding
depends on ``D``). ``load_state_dict(state, skip_steps=n)`` moves the
position ``n`` global batches on, unread (e.g. past a loss spike).

The global batch size may change on a restart: the position is kept, so
no sample is read twice or skipped, but the batches after the change are
cut at ``position + k G'``, not where the old size would have cut them,
and a job that changes ``G`` reads other global batches than one that did
not.

A state of format ``cachex.sampling/1`` (ranks reading contiguous spans,
before the global order) is read when it stopped at an epoch's start and
refused with :class:`~cachex.errors.InvalidInputError` when it stopped
within one: its ranks' reads are no prefix of the global order. The
:class:`Step` entries of its ``history`` are what it stored.

Rank
----
:func:`distributed_rank` takes the rank and world size from explicit
arguments, else from an initialised ``torch.distributed`` (when the caller
imported it), else from ``RANK``/``WORLD_SIZE``, else ``(0, 1)``.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass
from multiprocessing.context import get_spawning_popen
from typing import Any, Literal

import numpy as np

from cachex._cachex import PageReader
from cachex.errors import InvalidInputError

__all__ = [
    "Affinity",
    "Deal",
    "Policy",
    "Progress",
    "SamplingPlan",
    "SharedProgress",
    "Step",
    "as_blocks",
    "data_parallel",
    "distributed_rank",
    "even_blocks",
    "node_overlap",
    "page_blocks",
]

Policy = Literal["pad", "drop_last"]
Affinity = Literal["global", "node"]

#: The ``format`` of a plan state; a state of another format is refused.
STATE_FORMAT = "cachex.sampling/2"
#: The format of states of per-rank spans (before the global order).
_OLD_FORMAT = "cachex.sampling/1"

_SEED_MASK = 0xFFFFFFFFFFFFFFFF
#: Mixed into the seed of the homes ("home"), so they differ from every epoch's draw.
_HOMES_STREAM = 0x686F6D65


def distributed_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """This process's ``(rank, world_size)``.

    Explicit arguments win; then an initialised ``torch.distributed`` (only
    looked at when already imported, so this module never imports torch);
    then the ``RANK`` and ``WORLD_SIZE`` environment variables that
    ``torchrun`` sets; else ``(0, 1)``.
    """
    env_rank: int | None = None
    env_world: int | None = None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        env_rank, env_world = dist.get_rank(), dist.get_world_size()
    elif "WORLD_SIZE" in os.environ or "RANK" in os.environ:
        try:
            env_rank = int(os.environ.get("RANK", "0"))
            env_world = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError as e:
            raise InvalidInputError(f"RANK / WORLD_SIZE are not integers: {e}") from e
    r = rank if rank is not None else (env_rank if env_rank is not None else 0)
    w = world_size if world_size is not None else (env_world if env_world is not None else 1)
    r, w = int(r), int(w)
    if w < 1 or not 0 <= r < w:
        raise InvalidInputError(f"rank {r} of world_size {w}: give 0 <= rank < world_size")
    return r, w


# --- block layouts -----------------------------------------------------------


def even_blocks(n: int, block_size: int) -> np.ndarray:
    """Block sizes of ``n`` samples in blocks of ``block_size`` (the last shorter)."""
    if n < 0 or block_size < 1:
        raise InvalidInputError(f"even_blocks({n}, {block_size}): give n >= 0, block_size >= 1")
    sizes = np.full(n // block_size, block_size, dtype=np.int64)
    if n % block_size:
        sizes = np.append(sizes, n % block_size)
    return sizes


def page_blocks(path: str | os.PathLike[str]) -> np.ndarray:
    """The samples per page (per run of pages) of a page file, in file order:
    :meth:`cachex.PageReader.page_blocks` of the file at ``path`` (opened and
    validated; the format is read in Rust, never here)."""
    return PageReader(path).page_blocks()


def default_homes() -> int:
    """The nodes of a ``torchrun`` job: ``WORLD_SIZE // LOCAL_WORLD_SIZE``, else 1."""
    try:
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 1
    return max(world // local, 1) if local >= 1 else 1


def as_blocks(blocks: int | Sequence[int] | np.ndarray) -> np.ndarray:
    """Block sizes from a layout, or a sample count (blocks of one sample)."""
    if isinstance(blocks, (int, np.integer)):
        return even_blocks(int(blocks), 1)
    sizes = np.asarray(blocks, dtype=np.int64).reshape(-1)
    if sizes.size and int(sizes.min()) < 1:
        raise InvalidInputError("every block must hold at least one sample")
    return sizes


# --- the plan ----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """How far one run of an epoch got under the per-rank spans of format
    ``cachex.sampling/1``: ``steps`` batches on every rank. Read from old
    states only (see "Resumption" in the module docs)."""

    world_size: int
    num_workers: int
    batch_size: int
    steps: int


@dataclass
class Progress:
    """An epoch and how far it got: ``position`` samples of its global order read."""

    epoch: int = 0
    position: int = 0
    #: The global batch size the position was reached with (0: none yet).
    global_batch_size: int = 0


def data_parallel(world_size: int, replication: int) -> int:
    """The data-parallel ranks of ``world_size`` ranks in groups of ``replication``."""
    if replication < 1 or world_size < 1 or world_size % replication:
        raise InvalidInputError(
            f"world_size {world_size} is not a multiple of replication {replication}: "
            "give replication >= 1 that divides the world size"
        )
    return world_size // replication


class Deal:
    """The samples of an epoch's global order from ``start`` on, dealt in
    global batches to ranks and workers.

    Global batch ``k`` is the order's positions ``[start + k G, start + (k + 1) G)``;
    data-parallel rank ``d`` (rank ``r // replication``) reads its
    ``d``-th slice of ``G / D`` samples (``D``: the data-parallel ranks), so
    the batch is the same whatever the world size.

    Attributes
    ----------
    order : numpy.ndarray
        The epoch's samples in their global order.
    start : int
        The position the deal begins at (what earlier runs read).
    global_batch_size : int
        Samples of one global batch (``G``).
    batch_size : int
        Samples of one full batch of one rank (``G / D``).
    num_batches : int
        Batches each rank yields (the same on every rank).
    sizes : numpy.ndarray
        Each batch's samples on one rank (the last may be shorter).
    padded : int
        Samples read twice to even out the ranks' last batch (policy ``"pad"``).
    dropped : int
        Samples not read this epoch (policy ``"drop_last"``).
    """

    def __init__(
        self,
        order: np.ndarray,
        start: int,
        world_size: int,
        num_workers: int,
        global_batch_size: int,
        policy: Policy,
        replication: int = 1,
    ) -> None:
        if num_workers < 1 or global_batch_size < 1:
            raise InvalidInputError(
                f"num_workers {num_workers}, global_batch_size {global_batch_size}: "
                "give at least 1 each"
            )
        ranks = data_parallel(world_size, replication)
        if global_batch_size % ranks:
            raise InvalidInputError(
                f"global_batch_size {global_batch_size} does not split over {ranks} "
                f"data-parallel ranks (world_size {world_size}, replication {replication})"
            )
        n = len(order)
        if not 0 <= start <= n:
            raise InvalidInputError(f"position {start} outside an epoch of {n} samples")
        self.order = order
        self.start = int(start)
        self.world_size = world_size
        self.replication = replication
        self.data_parallel = ranks
        self.num_workers = num_workers
        self.global_batch_size = global_batch_size
        self.batch_size = global_batch_size // ranks
        m = n - self.start
        if policy == "pad":
            nb = -(-m // global_batch_size)
            last = m - (nb - 1) * global_batch_size if nb else 0
            last_per_rank = -(-last // ranks)
        elif policy == "drop_last":
            nb = m // global_batch_size
            last_per_rank = self.batch_size
        else:
            raise InvalidInputError(f"policy {policy!r}: give 'pad' or 'drop_last'")
        self.num_batches = nb
        self.sizes = np.full(nb, self.batch_size, dtype=np.int64)
        if nb:
            self.sizes[-1] = last_per_rank
        read = int(self.sizes.sum()) * ranks
        self.padded = max(read - m, 0)
        self.dropped = max(m - read, 0)

    @property
    def remaining(self) -> np.ndarray:
        """The samples from :attr:`start` on, in the global order."""
        return self.order[self.start :]

    @property
    def per_rank(self) -> int:
        """Samples each rank reads (padding included)."""
        return int(self.sizes.sum())

    def end(self, steps: int) -> int:
        """The position after ``steps`` global batches (the epoch's end at most)."""
        return min(self.start + max(int(steps), 0) * self.global_batch_size, len(self.order))

    def batch(self, rank: int, j: int) -> np.ndarray:
        """The sample indices of rank ``rank``'s batch ``j`` (its slice of global batch ``j``)."""
        if not 0 <= rank < self.world_size:
            raise InvalidInputError(f"rank {rank} of world_size {self.world_size}")
        size = int(self.sizes[j])
        lo = self.start + j * self.global_batch_size + (rank // self.replication) * size
        return self.order[np.arange(lo, lo + size) % max(len(self.order), 1)]

    def global_batch(self, j: int) -> np.ndarray:
        """Global batch ``j``: every data-parallel rank's batch ``j`` in rank order."""
        return np.concatenate(
            [self.batch(d * self.replication, j) for d in range(self.data_parallel)]
        )

    def rank_order(self, rank: int) -> np.ndarray:
        """Every sample rank ``rank`` reads, its batches ``0, 1, ...`` in turn
        (the order its loop receives them; padding included)."""
        if not 0 <= rank < self.world_size:
            raise InvalidInputError(f"rank {rank} of world_size {self.world_size}")
        sizes, total = self.sizes, self.per_rank
        j = np.arange(self.num_batches, dtype=np.int64)
        first = self.start + j * self.global_batch_size + (rank // self.replication) * sizes
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return self.order[(np.repeat(first, sizes) + within) % max(len(self.order), 1)]

    def worker_batches(self, rank: int, worker: int = 0, start: int = 0) -> Iterator[np.ndarray]:
        """Batches ``j >= start`` of rank ``rank`` that worker ``worker`` produces, in order."""
        if not 0 <= worker < self.num_workers:
            raise InvalidInputError(f"worker {worker} of {self.num_workers}")
        first = start + (worker - start) % self.num_workers
        for j in range(first, self.num_batches, self.num_workers):
            yield self.batch(rank, j)


class SamplingPlan:
    """The order of every epoch of a dataset, dealt to ranks and workers.

    Parameters
    ----------
    blocks : int or sequence of int
        The block sizes in file order (samples ``0..b0`` are block 0, the
        next ``b1`` block 1, ...), or a sample count (blocks of one sample:
        a plain permutation).
    batch_size : int
        Samples per batch of one rank (the global batch is ``batch_size``
        times the data-parallel ranks) unless ``global_batch_size`` is given.
    seed : int
        The seed of every epoch's order.
    shuffle : bool
        Shuffle blocks and samples within blocks (else file order).
    policy : {"pad", "drop_last"}
        How the last global batch is evened out (see the module docs).
    affinity : {"global", "node"}
        ``"node"``: the blocks a node reads stay mostly the same across
        epochs (see the module docs); ``"global"``: one shuffle of all.
    homes : int, optional
        The node count of ``affinity="node"`` (default: ``WORLD_SIZE //
        LOCAL_WORLD_SIZE``, else 1; a defaulted count takes a loaded
        state's).
    cross_node : float
        The fraction of blocks, 0 to 1, that moves between nodes each epoch.
    global_batch_size : int, optional
        Samples of one global batch, all data-parallel ranks together: fix it
        and global batch ``k`` is the same whatever the world size.
    replication : int
        Consecutive ranks that read the same batches (a tensor- or
        sequence-parallel group); the world size must be a multiple.
    """

    def __init__(
        self,
        blocks: int | Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        policy: Policy = "pad",
        affinity: Affinity = "global",
        homes: int | None = None,
        cross_node: float = 0.0,
        global_batch_size: int | None = None,
        replication: int = 1,
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError(f"batch_size {batch_size}: give at least 1")
        if global_batch_size is not None and int(global_batch_size) < 1:
            raise InvalidInputError(f"global_batch_size {global_batch_size}: give at least 1")
        if int(replication) < 1:
            raise InvalidInputError(f"replication {replication}: give at least 1")
        if policy not in ("pad", "drop_last"):
            raise InvalidInputError(f"policy {policy!r}: give 'pad' or 'drop_last'")
        if affinity not in ("global", "node"):
            raise InvalidInputError(f"affinity {affinity!r}: give 'global' or 'node'")
        if homes is not None and int(homes) < 1:
            raise InvalidInputError(f"homes {homes}: give at least 1")
        if not 0.0 <= float(cross_node) <= 1.0:
            raise InvalidInputError(f"cross_node {cross_node}: give a fraction from 0 to 1")
        self.blocks = as_blocks(blocks)
        self.num_samples = int(self.blocks.sum())
        self.batch_size = int(batch_size)
        self.global_batch_size = None if global_batch_size is None else int(global_batch_size)
        self.replication = int(replication)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.policy: Policy = policy
        self.affinity: Affinity = affinity
        self.homes = default_homes() if homes is None else int(homes)
        self.cross_node = float(cross_node)
        self._homes_given = homes is not None
        self._cached: tuple[int, np.ndarray] | None = None
        self._node_cached: tuple[tuple[int, int, int, int], np.ndarray] | None = None
        self._home_of_block: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A worker recomputes the epoch's order rather than unpickling it.
        return {**self.__dict__, "_cached": None, "_node_cached": None, "_home_of_block": None}

    @property
    def layout_digest(self) -> str:
        """A short hash of the block layout (a state names the layout it was taken on)."""
        return hashlib.blake2b(self.blocks.tobytes(), digest_size=8).hexdigest()

    def global_batch(self, world_size: int) -> int:
        """The global batch size with ``world_size`` ranks (``global_batch_size``,
        else ``batch_size`` times the data-parallel ranks)."""
        if self.global_batch_size is not None:
            return self.global_batch_size
        return self.batch_size * data_parallel(int(world_size), self.replication)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every sample index once, in epoch ``epoch``'s global order (int64)."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        n, sizes = self.num_samples, self.blocks
        if not self.shuffle or n == 0:
            order = np.arange(n, dtype=np.int64)
        else:
            seed = self.seed & _SEED_MASK
            if self._affine:
                rng = np.random.default_rng([seed, int(epoch), 2])
                # The groups in turn, each group's blocks shuffled.
                home = self.epoch_homes(epoch)
                blocks = rng.permutation(len(sizes))
                blocks = blocks[np.argsort(home[blocks], kind="stable")]
            else:
                rng = np.random.default_rng([seed, int(epoch)])
                blocks = rng.permutation(len(sizes))
            rank_of_block = np.empty(len(sizes), dtype=np.int64)
            rank_of_block[blocks] = np.arange(len(sizes))
            # One sort key per sample: its block's place in the shuffled
            # order, then a random tie-breaker that shuffles within the block.
            key = np.repeat(rank_of_block << 32, sizes) | rng.integers(
                0, 1 << 32, size=n, dtype=np.int64
            )
            order = np.argsort(key, kind="stable").astype(np.int64, copy=False)
            if self._affine:
                group = np.repeat(home, sizes)[order]
                counts = np.bincount(group, minlength=self.homes)
                # Round robin over the groups' runs: every prefix of the
                # order holds each group's next samples evenly.
                within = np.arange(n, dtype=np.int64) - np.repeat(
                    np.cumsum(counts) - counts, counts
                )
                order = order[np.argsort(within * self.homes + group, kind="stable")]
        self._cached = (int(epoch), order)
        return order

    def _node_major(self, epoch: int, order: np.ndarray, start: int, g: int) -> np.ndarray:
        """``order`` with each global batch from ``start`` on sorted by group
        (stable): node ``n``'s ranks, node-major, read group ``n``'s part."""
        key = (int(epoch), self.homes, int(start), int(g))
        if self._node_cached is not None and self._node_cached[0] == key:
            return self._node_cached[1]
        home = np.repeat(self.epoch_homes(epoch), self.blocks)
        tail = order[start:]
        window = np.arange(len(tail), dtype=np.int64) // g
        sorted_ = np.concatenate(
            (order[:start], tail[np.argsort(window * self.homes + home[tail], kind="stable")])
        )
        self._node_cached = (key, sorted_)
        return sorted_

    @property
    def _affine(self) -> bool:
        return self.affinity == "node" and self.cross_node < 1.0 and self.homes > 1

    def epoch_homes(self, epoch: int) -> np.ndarray:
        """The group of every block in epoch ``epoch`` (``affinity="node"``;
        group ``h`` is read by node ``h`` when ``world_size`` is ``homes`` nodes'
        ranks)."""
        sizes, h, seed = self.blocks, self.homes, self.seed & _SEED_MASK
        if self._home_of_block is None:
            # Fixed for the run: a permutation cut by sample count into h groups.
            perm = np.random.default_rng([seed, _HOMES_STREAM]).permutation(len(sizes))
            start = np.cumsum(sizes[perm]) - sizes[perm]
            self._home_of_block = np.empty(len(sizes), dtype=np.int64)
            self._home_of_block[perm] = start * h // max(self.num_samples, 1)
        home = self._home_of_block.copy()
        if self.cross_node <= 0.0 or len(sizes) == 0:
            return home
        rng = np.random.default_rng([seed, int(epoch), 1])
        moving = rng.random(len(sizes)) < self.cross_node
        moved = rng.permutation(np.flatnonzero(moving))
        if len(moved) == 0:
            return home
        kept = np.bincount(home[~moving], weights=sizes[~moving], minlength=h)
        # Dealt by deficit: group g takes the moved samples that refill it to N / h.
        deficit = np.maximum(self.num_samples / h - kept, 0.0)
        moved_sizes = sizes[moved]
        cuts = np.cumsum(deficit) / deficit.sum() * float(moved_sizes.sum())
        starts = np.cumsum(moved_sizes) - moved_sizes
        home[moved] = np.minimum(np.searchsorted(cuts, starts, side="right"), h - 1)
        return home

    def deal(
        self,
        epoch: int,
        world_size: int,
        num_workers: int = 1,
        position: int | Progress | Sequence[Step] = 0,
        global_batch_size: int | None = None,
    ) -> Deal:
        """Epoch ``epoch``'s global order from ``position`` on (a :class:`Progress`
        of that epoch, or a count of samples read), dealt to ``world_size`` ranks
        in global batches of ``global_batch_size`` (default: :meth:`global_batch`).

        A ``position`` given as a history of :class:`Step` (the per-rank spans'
        form) is read when empty and refused otherwise.
        """
        g = self.global_batch(world_size) if global_batch_size is None else int(global_batch_size)
        start = self._position(position)
        order = self.epoch_order(epoch)
        if self._affine and 0 <= start <= len(order) and g >= 1:
            order = self._node_major(epoch, order, start, g)
        return Deal(
            order,
            start,
            int(world_size),
            max(int(num_workers), 1),
            g,
            self.policy,
            self.replication,
        )

    def remaining(self, epoch: int, position: int | Progress | Sequence[Step] = 0) -> np.ndarray:
        """The samples of epoch ``epoch`` from ``position`` on, in the global order."""
        return self.epoch_order(epoch)[self._position(position) :]

    @staticmethod
    def _position(position: int | Progress | Sequence[Step]) -> int:
        if isinstance(position, Progress):
            return position.position
        if isinstance(position, int):
            return int(position)
        if isinstance(position, Sequence):
            if any(s.steps for s in position):
                raise InvalidInputError(
                    "a history of runs (per-rank spans) cannot place a position in the "
                    "global order: give the position (a Progress or a sample count)"
                )
            return 0
        return int(position)

    def skip(self, progress: Progress, steps: int, global_batch_size: int) -> Progress:
        """``progress`` moved past ``steps`` more global batches, unread."""
        if int(steps) < 0:
            raise InvalidInputError(f"skip_steps {steps}: give a count >= 0")
        n = len(self.epoch_order(progress.epoch))
        end = min(progress.position + int(steps) * int(global_batch_size), n)
        return Progress(progress.epoch, end, int(global_batch_size))

    # --- state -------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What a state must agree on to resume with this plan."""
        return {
            "num_samples": self.num_samples,
            "layout": self.layout_digest,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "policy": self.policy,
        }

    def state(self, progress: Progress, step: Step | None = None) -> dict[str, Any]:
        """A state dict: the plan's identity and ``progress`` (moved on by
        ``step``'s global batches when given: ``steps`` of ``batch_size``
        times the data-parallel ranks of ``world_size``)."""
        if step is not None and step.steps:
            g = step.batch_size * data_parallel(step.world_size, self.replication)
            end = min(progress.position + step.steps * g, len(self.epoch_order(progress.epoch)))
            progress = Progress(progress.epoch, end, g)
        return {
            "format": STATE_FORMAT,
            **self.identity(),
            "affinity": self.affinity,
            "homes": self.homes,
            "cross_node": self.cross_node,
            "epoch": int(progress.epoch),
            "position": int(progress.position),
            "global_batch_size": int(progress.global_batch_size),
        }

    def progress_of(self, state: dict[str, Any]) -> Progress:
        """The :class:`Progress` a state dict holds, checked against this plan.

        A state of format ``cachex.sampling/1`` (per-rank spans) is read
        when it stopped at an epoch's start; one that stopped within an
        epoch is refused: what its ranks read is no prefix of the global order.
        """
        fmt = state.get("format") if isinstance(state, dict) else None
        if fmt not in (STATE_FORMAT, _OLD_FORMAT):
            raise InvalidInputError(f"not a sampling state of format {STATE_FORMAT!r}")
        mine = self.identity()
        for k, v in mine.items():
            if state.get(k) != v:
                raise InvalidInputError(
                    f"the state was taken on another plan: {k} {state.get(k)!r}, this plan's {v!r}"
                )
        try:
            epoch = int(state["epoch"])
            if fmt == _OLD_FORMAT:
                if any(int(s[3]) for s in state["history"]):
                    raise InvalidInputError(
                        f"a {_OLD_FORMAT} state stopped within epoch {epoch}: its ranks read "
                        "contiguous spans, which the global order cannot continue; resume "
                        "from a state taken at an epoch's start, or with cachex before the "
                        "global order"
                    )
                position, g = 0, 0
            else:
                position, g = int(state["position"]), int(state["global_batch_size"])
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise InvalidInputError(f"a sampling state with a bad epoch or position: {e}") from e
        if position < 0 or g < 0:
            raise InvalidInputError(f"a sampling state with a bad position {position} or {g}")
        self._check_affinity(state)
        return Progress(epoch, position, g)

    def _check_affinity(self, state: dict[str, Any]) -> None:
        """Refuses a state of another affinity; a defaulted ``homes`` takes the state's."""
        theirs = state.get("affinity", "global")  # a state from before affinity: global
        if theirs != self.affinity:
            raise InvalidInputError(
                f"the state was taken on another plan: affinity {theirs!r}, "
                f"this plan's {self.affinity!r}"
            )
        if self.affinity == "global":
            return
        try:
            homes, cross_node = int(state["homes"]), float(state["cross_node"])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInputError(f"a node-affine sampling state without homes: {e}") from e
        if cross_node != self.cross_node:
            raise InvalidInputError(
                f"the state was taken on another plan: cross_node {cross_node!r}, "
                f"this plan's {self.cross_node!r}"
            )
        if homes != self.homes and (self._homes_given or homes < 1):
            raise InvalidInputError(
                f"the state was taken on another plan: homes {homes!r}, this plan's {self.homes!r}"
            )
        # The epoch's order depends on the homes: the state's keeps it whole.
        self.adopt_homes(homes)

    def adopt_homes(self, homes: int) -> None:
        """Takes ``homes`` groups (a loaded state's), forgetting orders made with others."""
        if int(homes) != self.homes:
            self.homes = int(homes)
            self._cached = self._node_cached = self._home_of_block = None


def node_overlap(plan: SamplingPlan, epoch: int, nodes: int, ranks_per_node: int) -> np.ndarray:
    """Per node, the fraction of its samples of epoch ``epoch`` that it also
    read in epoch ``epoch - 1``, with ``nodes * ranks_per_node`` node-major
    ranks (one worker each, whole epochs)."""
    if epoch < 1 or nodes < 1 or ranks_per_node < 1:
        raise InvalidInputError(
            f"node_overlap(epoch {epoch}, nodes {nodes}, ranks_per_node {ranks_per_node}): "
            "give epoch >= 1 and at least one node and rank"
        )
    world = nodes * ranks_per_node

    def node_samples(e: int) -> list[np.ndarray]:
        deal = plan.deal(e, world)
        ranks = [deal.rank_order(r) for r in range(world)]
        return [
            np.unique(np.concatenate(ranks[k * ranks_per_node : (k + 1) * ranks_per_node]))
            for k in range(nodes)
        ]

    before, now = node_samples(int(epoch) - 1), node_samples(int(epoch))
    return np.array(
        [
            np.isin(cur, old).mean() if len(cur) else 1.0
            for cur, old in zip(now, before, strict=True)
        ]
    )


class SharedProgress:
    """A :class:`Progress` in shared memory, so that ``set_epoch`` and
    ``load_state_dict`` in the main process reach persistent DataLoader
    workers too, with the plan's :attr:`homes` (a loaded state's). It
    travels to workers as shared memory (fork, spawn, forkserver) and
    pickles as plain numbers anywhere else."""

    def __init__(self, progress: Progress | None = None, homes: int = 1) -> None:
        self.cells = multiprocessing.RawArray("q", 4)
        self.set(progress or Progress())
        self.homes = homes

    @property
    def homes(self) -> int:
        """The plan's ``homes`` (see :meth:`SamplingPlan.adopt_homes`)."""
        return int(self.cells[3])

    @homes.setter
    def homes(self, homes: int) -> None:
        self.cells[3] = int(homes)

    def get(self) -> Progress:
        return Progress(*(int(x) for x in self.cells[:3]))

    def set(self, progress: Progress) -> None:
        self.cells[:3] = [int(x) for x in astuple(progress)]

    def __reduce__(self) -> Any:
        if get_spawning_popen() is not None:
            return (_shared_progress, (self.cells,))
        return (SharedProgress, (self.get(), self.homes))


def _shared_progress(cells: Any) -> SharedProgress:
    shared = SharedProgress.__new__(SharedProgress)
    shared.cells = cells
    return shared
