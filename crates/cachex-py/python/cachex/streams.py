"""Training mixtures: several caches read as one, in set proportions.

A :class:`Stream` is one cache (a dataset of :mod:`cachex.torch`, or the
path or URL of a page file or ``.beton``) and how much of every epoch it
makes up, with MosaicML Streaming's meanings:

``proportion``
    The stream's share of every epoch's samples. Every stream of a mixture
    gives one (they are normalised); the epoch holds ``epoch_size`` samples
    (default: all streams' samples together), ``floor(epoch_size * p)`` of
    this stream, the few left over dealt to streams drawn by the seed.
``repeat``
    Epochs' worth of this stream per epoch: ``int(repeat * len(stream))``.
``choose``
    Samples of this stream per epoch.
none of them
    Every sample once per epoch (or, with ``epoch_size`` and no stream
    weighted, streams in proportion to their sizes).

``proportion`` is relative and ``repeat`` / ``choose`` absolute: a mixture
takes one kind or the other, as Streaming does. (Streaming deals the
samples left over by flooring the shares to streams drawn at random; here
they go to the largest remainders, so each stream is within one sample of
its share.)

The mixture's order
-------------------
Each stream reads an endless run of **passes**, each pass every sample of
the stream once in a block-shuffled order (a :class:`~cachex.sampling.SamplingPlan`
of the stream's blocks, seeded per stream and pass), and epoch ``e`` takes
the run's samples ``[e c, (e + 1) c)`` (``c``: the stream's samples per
epoch). So a down-sampled stream (``c < len``) goes through all its samples
before any repeats, across epochs; an up-sampled one reads whole passes and
a remainder. An epoch of a stream that is not up-sampled that reads the end
of pass ``q`` and the start of pass ``q + 1`` would see some samples twice:
pass ``q + 1`` puts the end's samples last (a stable partition of its
order), so such a stream reads each sample at most once per epoch. Pass
``q + 1`` then depends on pass ``q``'s end, so a plan computes the passes in
turn and keeps the last few: a resume in epoch ``e`` of a down-sampled
stream computes about ``e c / len`` passes once. An up-sampled stream's
passes are independent (each epoch reads its samples about ``c / len``
times, whole passes and a part).

The streams are interleaved evenly and deterministically: sample ``i`` of
stream ``s`` gets the key ``(i + u_s) / c_s`` (``u_s``: a seeded offset per
epoch and stream, ties broken by stream) and the epoch's order is the keys
in turn, so any window of ``L`` samples holds each stream's share of ``L``
give or take about one. The keys are compared in integers and each
sample's place counted stream by stream: no sort of the epoch.

A sample's id in the mixture is its stream's offset plus its index in the
stream (the streams' samples one after another), so the rest of the plan
(global batches, ranks, workers, resumption, skipping) works on one array
of ids as for one store.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cachex._cachex import block_shuffle_indices
from cachex.errors import InvalidInputError
from cachex.protocols import PlanDataset
from cachex.sampling import Affinity, Policy, SamplingPlan, as_blocks

__all__ = ["DATASET_KINDS", "MixturePlan", "Stream", "stream_counts"]

#: The dataset class of each store kind a stream's path may name
#: (``"pages"``, ``"beton"``, ``"memmap"``), called with the path and the
#: stream's ``options``. :mod:`cachex.torch` registers its classes here as
#: it is imported: a stream is configuration, and this module, a layer
#: below the datasets, never imports them.
DATASET_KINDS: dict[str, Callable[..., PlanDataset]] = {}

#: The store kind of a path by its suffix.
_SUFFIX_KINDS = {".pages": "pages", ".beton": "beton"}

#: Passes a stream keeps computed (the current epoch's, the next's, one before).
_KEPT_PASSES = 4


class Stream:
    """One cache of a mixture and its weight (see the module docs).

    Parameters
    ----------
    source
        A dataset of :mod:`cachex.torch` (``PageDataset``, ``MemmapDataset``,
        ``BetonDataset``, ``SegmentDataset``, ``ShardDataset``; local or on a
        URL), or the path or URL of a page file (``.pages``) or an FFCV
        ``.beton``, opened with ``options``.
    proportion, repeat, choose
        At most one: the stream's share of an epoch, its epochs' worth per
        epoch, or its samples per epoch.
    kind
        ``"pages"``, ``"beton"`` or ``"memmap"`` for a path whose suffix
        does not say.
    options
        Keywords of the dataset a path opens (``fields=``, ``tier_dir=``, ...).
    """

    def __init__(
        self,
        source: PlanDataset | str | os.PathLike[str] | None,
        *,
        proportion: float | None = None,
        repeat: float | None = None,
        choose: int | None = None,
        kind: str | None = None,
        **options: Any,
    ) -> None:
        weights = {"proportion": proportion, "repeat": repeat, "choose": choose}
        given = {k: float(v) for k, v in weights.items() if v is not None}
        if len(given) > 1:
            raise InvalidInputError(f"a stream with {' and '.join(given)}: give at most one")
        for name, value in given.items():
            if not value >= 0:  # NaN too
                raise InvalidInputError(f"{name} {value:g}: give a number >= 0")
        self.source = source
        self.proportion = None if proportion is None else float(proportion)
        self.repeat = None if repeat is None else float(repeat)
        self.choose = None if choose is None else int(choose)
        self.kind = kind
        self.options = options
        self._dataset: PlanDataset | None = None

    def __repr__(self) -> str:
        weights = {"proportion": self.proportion, "repeat": self.repeat, "choose": self.choose}
        shown = "".join(f", {k}={v}" for k, v in weights.items() if v is not None)
        return f"Stream({self.source!r}{shown})"

    def dataset(self) -> PlanDataset:
        """The stream's dataset: the one it was given, or the one its path
        opens as (on first use; the class its store kind has in
        :data:`DATASET_KINDS`, registered by :mod:`cachex.torch`)."""
        if self._dataset is None:
            self._dataset = self._open()
        return self._dataset

    def store_kind(self) -> str:
        """The store kind of the stream's path: ``kind``, else the one its
        suffix names (``.pages``, ``.beton``)."""
        if not isinstance(self.source, (str, os.PathLike)):
            raise InvalidInputError(f"a stream of {type(self.source).__name__} has no path")
        text = os.fspath(self.source)
        kind = self.kind or _SUFFIX_KINDS.get(Path(text.rstrip("/")).suffix)
        if kind not in ("pages", "beton", "memmap"):
            raise InvalidInputError(
                f"{text}: which store? give kind='pages', 'beton' or 'memmap' "
                "(or a cachex.torch dataset)"
            )
        return kind

    def _open(self) -> PlanDataset:
        source = self.source
        if not isinstance(source, (str, os.PathLike)):
            if not isinstance(source, PlanDataset):
                raise InvalidInputError(
                    f"a stream of {type(source).__name__}: give a cachex.torch dataset, "
                    "or the path or URL of a page file or .beton"
                )
            return source
        kind = self.store_kind()
        opener = DATASET_KINDS.get(kind)
        if opener is None:
            raise InvalidInputError(
                f"{os.fspath(source)}: a stream's path opens as a cachex.torch dataset: "
                "import cachex.torch first (or give the dataset)"
            )
        return opener(source, **self.options)


def stream_counts(
    sizes: Sequence[int] | npt.NDArray[np.int64],
    streams: Sequence[Stream],
    epoch_size: int | None = None,
    seed: int = 0,
) -> npt.NDArray[np.int64]:
    """Each stream's samples per epoch (MosaicML Streaming's ``apply_weights``)."""
    sizes_ = np.asarray(sizes, dtype=np.int64)
    if len(sizes_) != len(streams) or not len(streams):
        raise InvalidInputError(f"{len(streams)} streams and {len(sizes_)} sizes: give one each")
    if epoch_size is not None and int(epoch_size) < 0:
        raise InvalidInputError(f"epoch_size {epoch_size}: give a count >= 0")
    relative = [s.proportion is not None for s in streams]
    absolute = [s.repeat is not None or s.choose is not None for s in streams]
    if any(relative) and not all(relative):
        raise InvalidInputError(
            "some streams have a proportion and some not: give every stream one, or use "
            "repeat / choose"
        )
    if any(relative) or (epoch_size is not None and not any(absolute)):
        if any(relative):
            weights = np.array([s.proportion for s in streams], dtype=np.float64)
        else:
            weights = sizes_.astype(np.float64)
        if weights.sum() <= 0:
            raise InvalidInputError("the streams' proportions add up to 0")
        total = int(sizes_.sum()) if epoch_size is None else int(epoch_size)
        exact = total * (weights / weights.sum())
        counts = exact.astype(np.int64)
        shortfall = total - int(counts.sum())
        # The few left over go to the largest remainders (ties drawn by the
        # seed), so that every stream is within one sample of its share.
        ties = np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF).random(len(streams))
        counts[np.lexsort((ties, counts - exact))[:shortfall]] += 1
    else:
        if epoch_size is not None:
            raise InvalidInputError("epoch_size goes with proportions, not repeat / choose")
        counts = np.array(
            [
                int(s.repeat * n)
                if s.repeat is not None
                else s.choose
                if s.choose is not None
                else n
                for s, n in zip(streams, sizes_.tolist(), strict=True)
            ],
            dtype=np.int64,
        )
    empty = [i for i in range(len(streams)) if counts[i] and not sizes_[i]]
    if empty:
        raise InvalidInputError(f"streams {empty} are empty but asked for samples")
    result: npt.NDArray[np.int64] = counts
    return result


def _stream_seed(seed: int, stream: int) -> int:
    digest = hashlib.blake2b(f"{seed}/{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def block_shuffle(blocks: np.ndarray, seed: int) -> np.ndarray:
    """Every sample once: the blocks in a random order, the samples within
    each shuffled (the order of a :class:`~cachex.sampling.SamplingPlan`),
    drawn natively (one Fisher-Yates pass over the blocks and one over each
    block's samples; ``_cachex.block_shuffle_indices``), the same for a seed
    on every platform."""
    return block_shuffle_indices(np.ascontiguousarray(blocks, dtype=np.int64), seed)


class _Passes:
    """A stream's endless run of passes, epoch by epoch (see the module docs)."""

    def __init__(self, blocks: np.ndarray, seed: int, shuffle: bool, per_epoch: int) -> None:
        self.blocks = blocks
        self.seed = seed
        self.shuffle = shuffle
        self.n = int(blocks.sum())
        self.per_epoch = per_epoch
        self.kept: dict[int, np.ndarray] = {}

    def raw(self, q: int) -> np.ndarray:
        """Pass ``q``'s block-shuffled order, before the deferral."""
        if not self.shuffle:
            return np.arange(self.n, dtype=np.int64)
        return block_shuffle(self.blocks, _stream_seed(self.seed, int(q)))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "kept": {}}

    def pass_order(self, q: int) -> np.ndarray:
        if q in self.kept:
            return self.kept[q]
        if self.per_epoch > self.n:
            # Up-sampled: an epoch reads whole passes anyway, none deferred.
            self.kept[q] = self.raw(q)
            for old in sorted(self.kept)[:-_KEPT_PASSES]:
                del self.kept[old]
            return self.kept[q]
        below = [k for k in self.kept if k < q]
        k = max(below) if below else 0
        order = self.kept[k] if below else self.raw(0)
        while k < q:
            k += 1
            order = self._next(k, order)
            self.kept[k] = order
        self.kept[q] = order
        for old in sorted(self.kept)[:-_KEPT_PASSES]:
            del self.kept[old]
        return order

    def _next(self, q: int, before: np.ndarray) -> np.ndarray:
        """Pass ``q``'s order, given pass ``q - 1``'s: the samples that the
        epoch reading pass ``q``'s start read of pass ``q - 1`` go last."""
        raw = self.raw(q)
        c, n = self.per_epoch, self.n
        start = (q * n // c) * c  # the first sample of the epoch holding pass q's start
        if start == q * n:
            return raw
        tail = before[max(start - (q - 1) * n, 0) :]
        late = np.zeros(n, dtype=bool)
        late[tail] = True
        late_of = late[raw]
        return np.concatenate((raw[~late_of], raw[late_of]))

    def epoch(self, e: int) -> np.ndarray:
        """The stream's samples of epoch ``e``, in order."""
        c, n = self.per_epoch, self.n
        if c == 0 or n == 0:
            return np.empty(0, dtype=np.int64)
        lo, hi = e * c, (e + 1) * c
        parts = []
        for q in range(lo // n, (hi - 1) // n + 1):
            order = self.pass_order(q)
            parts.append(order[max(lo - q * n, 0) : min(hi - q * n, n)])
        return np.concatenate(parts)


def interleave_ranks(
    counts: Sequence[int] | np.ndarray, offsets: Sequence[int] | np.ndarray
) -> list[np.ndarray]:
    """Each stream's samples' places in the interleaved order: sample ``i`` of
    stream ``s`` has the key ``(i K + offsets[s]) / counts[s]`` (``K``: the
    offsets' scale), ties going to the lower stream; its place is ``i`` plus
    the samples of the other streams with smaller keys, counted in integers."""
    c = [int(x) for x in counts]
    k = _OFFSET_SCALE
    places = []
    for s, cs in enumerate(c):
        i = np.arange(cs, dtype=np.int64)
        place = i.copy()
        below = np.empty_like(i)
        for t, ct in enumerate(c):
            if t == s or ct == 0 or cs == 0:
                continue
            # Samples j of t with (j K + o_t) c_s < (i K + o_s) c_t, or <=
            # for a lower stream t: j < num / den, or j <= num / den.
            den = k * cs
            const = int(offsets[s]) * ct - int(offsets[t]) * cs - (1 if t > s else 0)
            np.multiply(i, k * ct, out=below)
            below += const
            np.floor_divide(below, den, out=below)
            below += 1
            np.clip(below, 0, ct, out=below)
            place += below
        places.append(place)
    return places


#: The scale of the streams' offsets ``u_s`` (keys compare in int64: the
#: epoch's counts stay below ``sqrt(2**62 / _OFFSET_SCALE)``, 2**26).
_OFFSET_SCALE = 1 << 10


class MixturePlan(SamplingPlan):
    """A :class:`~cachex.sampling.SamplingPlan` over several streams: each
    epoch's order is the streams' samples of the epoch, interleaved (see the
    module docs); sample ids are stream offset plus index.

    Parameters
    ----------
    blocks
        Each stream's block sizes (``dataset.blocks()``).
    counts
        Each stream's samples per epoch (:func:`stream_counts`).
    batch_size, seed, shuffle, policy, global_batch_size, replication
        As :class:`~cachex.sampling.SamplingPlan` (the global order only).
    """

    def __init__(
        self,
        blocks: Sequence[Any],
        counts: Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        policy: Policy = "pad",
        global_batch_size: int | None = None,
        replication: int = 1,
        affinity: Affinity = "global",
        homes: int | None = None,
        cross_node: float = 0.0,
    ) -> None:
        if affinity != "global":
            raise InvalidInputError(
                f"affinity {affinity!r}: a mixture of streams reads the global order only"
            )
        per_stream = [as_blocks(b) for b in blocks]
        if len(per_stream) != len(counts) or not per_stream:
            raise InvalidInputError(f"{len(per_stream)} streams and {len(counts)} counts")
        joined = np.concatenate(per_stream)
        super().__init__(
            joined,
            batch_size,
            seed=seed,
            shuffle=shuffle,
            policy=policy,
            global_batch_size=global_batch_size,
            replication=replication,
            homes=1,
        )
        self.counts = np.asarray(counts, dtype=np.int64)
        sizes = np.array([int(b.sum()) for b in per_stream], dtype=np.int64)
        self.stream_sizes = sizes
        self.offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        if int(self.counts.max()) >= 1 << 26:
            raise InvalidInputError(
                f"a stream of {int(self.counts.max())} samples per epoch: at most 2**26 - 1"
            )
        self._passes = [
            _Passes(b, _stream_seed(self.seed, s), self.shuffle, int(c))
            for s, (b, c) in enumerate(zip(per_stream, self.counts.tolist(), strict=True))
        ]

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s samples of every stream, interleaved, as mixture ids."""
        if self._cached is not None and self._cached[0] == epoch:
            return self._cached[1]
        rng = np.random.default_rng([self.seed & 0xFFFFFFFFFFFFFFFF, int(epoch), 4])
        offsets = rng.integers(0, _OFFSET_SCALE, size=len(self.counts))
        order = np.empty(int(self.counts.sum()), dtype=np.int64)
        places = interleave_ranks(self.counts, offsets)
        for s, place in enumerate(places):
            order[place] = self._passes[s].epoch(int(epoch)) + self.offsets[s]
        self._cached = (int(epoch), order)
        return order

    def stream_of(self, ids: np.ndarray) -> np.ndarray:
        """The stream of each mixture id."""
        return np.searchsorted(self.offsets, ids, side="right") - 1

    def identity(self) -> dict[str, Any]:
        return {
            **super().identity(),
            "stream_sizes": self.stream_sizes.tolist(),
            "counts": self.counts.tolist(),
        }
