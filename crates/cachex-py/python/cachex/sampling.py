"""One sampling plan for every store: partitioned, deterministic, resumable.

A :class:`SamplingPlan` is a pure function of the dataset's size and block
layout (the pages of a page file or an FFCV ``.beton``, the shards of a
shard store, row blocks of a memmap array, key blocks of a segment store),
the seed, the epoch, the world size, the DataLoader worker count and how
far the epoch has got. No
store is touched; numpy does the work (a 10M-sample epoch costs one
``argsort``, no Python loop per sample).

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
to the groups short of ``N / homes``; the epoch's order is the groups
concatenated, group 0 first, each group's blocks shuffled and the samples
within each block shuffled every epoch. ``torchrun``'s ranks are node-major
(``rank = node * ranks_per_node + local``), so with ``world_size = homes *
ranks_per_node`` node ``n`` reads group ``n`` (give or take one block at
each edge): the same blocks every epoch, which its local tier keeps, in a
new order. Dealing is unchanged, so every guarantee below holds as it does
for the global order; ``cross_node=1`` (or one home) *is* the global order.

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
    1              0.241     -                                          0.76

``cross_node=1`` is the global order, where a node overlaps by about
``1 / homes``.

Dealing it out
--------------
The samples not yet read (all of them at the start of an epoch) are cut
into ``world_size`` contiguous spans, one per rank, of equal length, so
that **every rank yields the same number of batches** (a rank with fewer
would leave the collective and hang the others). The ``policy`` says how:

``"pad"`` (default; ``DistributedSampler``'s ``drop_last=False``)
    Every rank gets ``ceil(M / world_size)`` samples; the order is extended
    by repeating its first samples, fewer than ``world_size`` of them
    (:attr:`Deal.padded` counts them). Every rank's last batch may be short,
    of the same size on every rank.
``"drop_last"``
    Every rank gets only full batches: ``M // (world_size * batch_size)``
    of them; the rest of the order, fewer than ``world_size * batch_size``
    samples, is not read this epoch (:attr:`Deal.dropped`).

Otherwise every sample is read exactly once per epoch.

A rank's span is cut into batches; batch ``j`` is produced by DataLoader
worker ``j % num_workers`` (the order in which torch's DataLoader takes
batches from its workers), and each worker's batches are a contiguous run of
the span, so each worker reads its own blocks.

Resumption
----------
The DataLoader yields a rank's batches in order ``0, 1, 2, ...``, so after
``k`` steps each rank has read the first ``k`` batches of its span: how far
an epoch got is ``(world_size, num_workers, batch_size, k)``. A restart,
with any world size, worker count or batch size, re-deals the samples not
yet read (in their order). Each restart within an epoch appends one such
entry to :attr:`Progress.history`; a state is a few numbers, never a list
of samples.

Rank
----
:func:`distributed_rank` takes the rank and world size from explicit
arguments, else from an initialised ``torch.distributed`` (when the caller
imported it), else from ``RANK``/``WORLD_SIZE``, else ``(0, 1)``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from cachex.errors import CorruptError, InvalidInputError

__all__ = [
    "Affinity",
    "Deal",
    "Policy",
    "Progress",
    "SamplingPlan",
    "SharedProgress",
    "Step",
    "distributed_rank",
    "even_blocks",
    "node_overlap",
    "page_blocks",
]

Policy = Literal["pad", "drop_last"]
Affinity = Literal["global", "node"]

#: The ``format`` of a plan state; a state of another format is refused.
STATE_FORMAT = "cachex.sampling/1"

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


_PAGE_MAGIC = b"CXPAGES\0"
_RUN_LEN = 72


def page_blocks(path: str | os.PathLike[str]) -> np.ndarray:
    """The samples per page (per run of pages) of a page file, in file order.

    Read from the file's run table (see ``page-alloc``'s ``format.rs``): run
    ``k`` holds the samples that follow run ``k - 1``'s. Open the file with
    :class:`cachex.PageReader` first: it checks the tables' hashes; this
    checks the counts it uses.
    """
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(128)
            if len(head) < 128 or head[:8] != _PAGE_MAGIC:
                raise CorruptError(f"{p}: not a page file (bad magic or short header)")
            num_samples, num_runs = (int(np.frombuffer(head, "<u8", 1, o)[0]) for o in (32, 48))
            runs_offset = int(np.frombuffer(head, "<u8", 1, 72)[0])
            size = p.stat().st_size
            if num_runs > size // _RUN_LEN or runs_offset + num_runs * _RUN_LEN > size:
                raise CorruptError(f"{p}: run table of {num_runs} runs beyond the file's end")
            f.seek(runs_offset)
            raw = f.read(num_runs * _RUN_LEN)
    except OSError as e:
        from cachex.errors import CacheIOError

        raise CacheIOError(f"{p}: cannot read the run table: {e}") from e
    table = np.frombuffer(raw, "<u8").reshape(num_runs, _RUN_LEN // 8)
    first, counts = table[:, 3].astype(np.int64), table[:, 4].astype(np.int64)
    expect_first = np.concatenate(([0], np.cumsum(counts)[:-1])) if num_runs else first
    if not np.array_equal(first, expect_first) or int(counts.sum()) != num_samples:
        raise CorruptError(f"{p}: the run table does not cover samples 0..{num_samples} in order")
    return counts[counts > 0]


def default_homes() -> int:
    """The nodes of a ``torchrun`` job: ``WORLD_SIZE // LOCAL_WORLD_SIZE``, else 1."""
    try:
        world = int(os.environ["WORLD_SIZE"])
        local = int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 1
    return max(world // local, 1) if local >= 1 else 1


def _as_blocks(blocks: int | Sequence[int] | np.ndarray) -> np.ndarray:
    if isinstance(blocks, (int, np.integer)):
        return even_blocks(int(blocks), 1)
    sizes = np.asarray(blocks, dtype=np.int64).reshape(-1)
    if sizes.size and int(sizes.min()) < 1:
        raise InvalidInputError("every block must hold at least one sample")
    return sizes


# --- the plan ----------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """How far one run of an epoch got: ``steps`` batches on every rank."""

    world_size: int
    num_workers: int
    batch_size: int
    steps: int


@dataclass
class Progress:
    """An epoch and how far it got: one :class:`Step` per run that stopped in it."""

    epoch: int = 0
    history: list[Step] = field(default_factory=list)


class Deal:
    """The samples of an epoch not yet read, dealt to ranks and workers.

    Attributes
    ----------
    remaining : numpy.ndarray
        The sample indices still to read, in the epoch's order.
    per_rank : int
        Samples each rank reads (padding included).
    num_batches : int
        Batches each rank yields (the same on every rank).
    padded : int
        Samples read twice to even out the ranks (policy ``"pad"``).
    dropped : int
        Samples not read this epoch (policy ``"drop_last"``).
    """

    def __init__(
        self,
        remaining: np.ndarray,
        world_size: int,
        num_workers: int,
        batch_size: int,
        policy: Policy,
    ) -> None:
        if world_size < 1 or num_workers < 1 or batch_size < 1:
            raise InvalidInputError(
                f"world_size {world_size}, num_workers {num_workers}, batch_size {batch_size}: "
                "give at least 1 each"
            )
        m = len(remaining)
        self.remaining = remaining
        self.world_size = world_size
        self.num_workers = num_workers
        self.batch_size = batch_size
        if policy == "pad":
            per_rank = -(-m // world_size)
            nb = -(-per_rank // batch_size)
        elif policy == "drop_last":
            nb = m // (world_size * batch_size)
            per_rank = nb * batch_size
        else:
            raise InvalidInputError(f"policy {policy!r}: give 'pad' or 'drop_last'")
        self.per_rank = per_rank
        self.num_batches = nb
        self.padded = max(world_size * per_rank - m, 0)
        self.dropped = max(m - world_size * per_rank, 0)
        sizes = np.full(nb, batch_size, dtype=np.int64)
        if nb:
            sizes[-1] = per_rank - (nb - 1) * batch_size
        # Worker-major layout: worker w's batches (j = w, w + W, ...) are
        # consecutive in the span, so a worker reads its own blocks.
        j = np.arange(nb)
        order = np.lexsort((j // num_workers, j % num_workers))
        offsets = np.empty(nb, dtype=np.int64)
        offsets[order] = np.cumsum(sizes[order]) - sizes[order]
        self.sizes = sizes
        self.offsets = offsets

    def _span_start(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise InvalidInputError(f"rank {rank} of world_size {self.world_size}")
        return rank * self.per_rank

    def batch(self, rank: int, j: int) -> np.ndarray:
        """The sample indices of rank ``rank``'s batch ``j``."""
        lo = self._span_start(rank) + int(self.offsets[j])
        pos = np.arange(lo, lo + int(self.sizes[j]))
        return self.remaining[pos % len(self.remaining)]

    def rank_order(self, rank: int) -> np.ndarray:
        """Every sample rank ``rank`` reads, its batches ``0, 1, ...`` in turn
        (the order its loop receives them; padding included)."""
        lo = self._span_start(rank)
        m = len(self.remaining)
        if m == 0 or self.num_batches == 0:
            return np.empty(0, dtype=np.int64)
        starts = self.offsets - (np.cumsum(self.sizes) - self.sizes)
        within = np.repeat(starts, self.sizes) + np.arange(int(self.sizes.sum()))
        return self.remaining[(lo + within) % m]

    def worker_batches(self, rank: int, worker: int = 0, start: int = 0) -> Iterator[np.ndarray]:
        """Batches ``j >= start`` of rank ``rank`` that worker ``worker`` produces, in order."""
        if not 0 <= worker < self.num_workers:
            raise InvalidInputError(f"worker {worker} of {self.num_workers}")
        first = start + (worker - start) % self.num_workers
        for j in range(first, self.num_batches, self.num_workers):
            yield self.batch(rank, j)

    def read_positions(self, steps: int) -> np.ndarray:
        """Positions in :attr:`remaining` that every rank's first ``steps`` batches read."""
        steps = min(max(int(steps), 0), self.num_batches)
        m = len(self.remaining)
        if steps == 0 or m == 0:
            return np.empty(0, dtype=np.int64)
        offs, sizes = self.offsets[:steps], self.sizes[:steps]
        within = np.repeat(offs - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        starts = np.arange(self.world_size, dtype=np.int64) * self.per_rank
        pos = (starts[:, None] + within[None, :]).reshape(-1)
        return pos[pos < m]  # a padded position repeats a sample; it reads nothing new


class SamplingPlan:
    """The order of every epoch of a dataset, dealt to ranks and workers.

    Parameters
    ----------
    blocks : int or sequence of int
        The block sizes in file order (samples ``0..b0`` are block 0, the
        next ``b1`` block 1, ...), or a sample count (blocks of one sample:
        a plain permutation).
    batch_size : int
        Samples per batch.
    seed : int
        The seed of every epoch's order.
    shuffle : bool
        Shuffle blocks and samples within blocks (else file order).
    policy : {"pad", "drop_last"}
        How ranks are evened out (see the module docs).
    affinity : {"global", "node"}
        ``"node"``: the blocks a node reads stay mostly the same across
        epochs (see the module docs); ``"global"``: one shuffle of all.
    homes : int, optional
        The node count of ``affinity="node"`` (default: ``WORLD_SIZE //
        LOCAL_WORLD_SIZE``, else 1; a defaulted count takes a loaded
        state's).
    cross_node : float
        The fraction of blocks, 0 to 1, that moves between nodes each epoch.
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
    ) -> None:
        if batch_size < 1:
            raise InvalidInputError(f"batch_size {batch_size}: give at least 1")
        if policy not in ("pad", "drop_last"):
            raise InvalidInputError(f"policy {policy!r}: give 'pad' or 'drop_last'")
        if affinity not in ("global", "node"):
            raise InvalidInputError(f"affinity {affinity!r}: give 'global' or 'node'")
        if homes is not None and int(homes) < 1:
            raise InvalidInputError(f"homes {homes}: give at least 1")
        if not 0.0 <= float(cross_node) <= 1.0:
            raise InvalidInputError(f"cross_node {cross_node}: give a fraction from 0 to 1")
        self.blocks = _as_blocks(blocks)
        self.num_samples = int(self.blocks.sum())
        self.batch_size = int(batch_size)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.policy: Policy = policy
        self.affinity: Affinity = affinity
        self.homes = default_homes() if homes is None else int(homes)
        self.cross_node = float(cross_node)
        self._homes_given = homes is not None
        self._cached: tuple[int, np.ndarray] | None = None
        self._home_of_block: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A worker recomputes the epoch's order rather than unpickling it.
        return {**self.__dict__, "_cached": None, "_home_of_block": None}

    @property
    def layout_digest(self) -> str:
        """A short hash of the block layout (a state names the layout it was taken on)."""
        return hashlib.blake2b(self.blocks.tobytes(), digest_size=8).hexdigest()

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Every sample index once, in epoch ``epoch``'s order (int64)."""
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
                blocks = rng.permutation(len(sizes))
                blocks = blocks[np.argsort(self.epoch_homes(epoch)[blocks], kind="stable")]
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
        self._cached = (int(epoch), order)
        return order

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

    def remaining(self, epoch: int, history: Sequence[Step] = ()) -> np.ndarray:
        """The samples of epoch ``epoch`` that the runs in ``history`` did not read."""
        rest = self.epoch_order(epoch)
        for step in history:
            deal = Deal(rest, step.world_size, step.num_workers, step.batch_size, self.policy)
            keep = np.ones(len(rest), dtype=bool)
            keep[deal.read_positions(step.steps)] = False
            rest = rest[keep]
        return rest

    def deal(
        self,
        epoch: int,
        world_size: int,
        num_workers: int = 1,
        history: Sequence[Step] = (),
        batch_size: int | None = None,
    ) -> Deal:
        """What is left of epoch ``epoch`` after ``history``, dealt to ``world_size`` ranks."""
        return Deal(
            self.remaining(epoch, history),
            world_size,
            max(int(num_workers), 1),
            self.batch_size if batch_size is None else int(batch_size),
            self.policy,
        )

    # --- state -------------------------------------------------------------

    def state(self, progress: Progress, step: Step | None = None) -> dict[str, Any]:
        """A state dict: the plan's identity and ``progress`` (plus ``step``, this run's)."""
        # A run that read nothing changes nothing: it is left out.
        history = [s for s in [*progress.history, step] if s is not None and s.steps]
        return {
            "format": STATE_FORMAT,
            "num_samples": self.num_samples,
            "layout": self.layout_digest,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "policy": self.policy,
            "affinity": self.affinity,
            "homes": self.homes,
            "cross_node": self.cross_node,
            "epoch": int(progress.epoch),
            "history": [[s.world_size, s.num_workers, s.batch_size, s.steps] for s in history],
        }

    def progress_of(self, state: dict[str, Any]) -> Progress:
        """The :class:`Progress` a state dict holds, checked against this plan."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidInputError(f"not a sampling state of format {STATE_FORMAT!r}")
        mine = self.state(Progress())
        for k in ("num_samples", "layout", "seed", "shuffle", "policy"):
            if state.get(k) != mine[k]:
                raise InvalidInputError(
                    f"the state was taken on another plan: {k} {state.get(k)!r}, "
                    f"this plan's {mine[k]!r}"
                )
        try:
            history = [Step(*(int(x) for x in s)) for s in state["history"]]
            epoch = int(state["epoch"])
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidInputError(f"a sampling state with a bad epoch or history: {e}") from e
        for s in history:
            if min(s.world_size, s.num_workers, s.batch_size) < 1 or s.steps < 0:
                raise InvalidInputError(f"a sampling state with a bad step {s}")
        self._check_affinity(state)
        return Progress(epoch, history)

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
            self._cached = self._home_of_block = None


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


#: Restarts within one epoch that a shared progress holds.
MAX_RESTARTS = 64


class SharedProgress:
    """A :class:`Progress` in shared memory, so that ``set_epoch`` and
    ``load_state_dict`` in the main process reach persistent DataLoader
    workers too, with the plan's :attr:`homes` (a loaded state's). It
    travels to workers as shared memory (fork, spawn, forkserver) and
    pickles as plain numbers anywhere else."""

    def __init__(self, progress: Progress | None = None, homes: int = 1) -> None:
        import multiprocessing

        self.cells = multiprocessing.RawArray("q", 3 + 4 * MAX_RESTARTS)
        self.set(progress or Progress())
        self.homes = homes

    @property
    def homes(self) -> int:
        """The plan's ``homes`` (see :meth:`SamplingPlan.adopt_homes`)."""
        return int(self.cells[2 + 4 * MAX_RESTARTS])

    @homes.setter
    def homes(self, homes: int) -> None:
        self.cells[2 + 4 * MAX_RESTARTS] = int(homes)

    def get(self) -> Progress:
        cells = self.cells
        n = int(cells[1])
        return Progress(
            int(cells[0]), [Step(*(int(x) for x in cells[2 + 4 * k : 6 + 4 * k])) for k in range(n)]
        )

    def set(self, progress: Progress) -> None:
        if len(progress.history) > MAX_RESTARTS:
            raise InvalidInputError(
                f"{len(progress.history)} restarts within epoch {progress.epoch}: "
                f"at most {MAX_RESTARTS} are kept"
            )
        flat = [x for s in progress.history for x in astuple(s)]
        self.cells[2 : 2 + len(flat)] = flat
        self.cells[1] = len(progress.history)
        self.cells[0] = int(progress.epoch)

    def __reduce__(self) -> Any:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:
            return (_shared_progress, (self.cells,))
        return (SharedProgress, (self.get(), self.homes))


def _shared_progress(cells: Any) -> SharedProgress:
    shared = SharedProgress.__new__(SharedProgress)
    shared.cells = cells
    return shared
