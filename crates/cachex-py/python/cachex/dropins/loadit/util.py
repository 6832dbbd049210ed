"""loadit's sequence utilities, over anything with ``len`` and ``[]``.

``SequenceView``, ``ConcatableSequence``, ``InterleaveSequences``,
``RepeatSequence``, ``chunk_shuffle`` and ``chunk_shuffle_idx`` keep
loadit 0.0.8's names and arguments. The index arithmetic (which part and
offset an index lands on, the shuffle permutation) is shard-store's
(``crates/shard-store/src/seq.rs``), called through ``cachex._cachex``:
Rust and Python place every index alike, and a seed gives the same
shuffle in both. These classes only index the Python sequences.

Differences from loadit
-----------------------
- ``InterleaveSequences`` returns the round-robin order loadit documents
  (``a0, b0, c0, a1, ...``, the longer parts continuing when the shorter
  run out); loadit 0.0.8 raised or returned wrong items past index 0.
- ``ConcatableSequence(a) + ConcatableSequence(b)`` works (loadit 0.0.8
  raised ``TypeError``: tuple + list) and concatenates the parts, and
  negative indices count from the end (loadit returned an item of the
  first part).
- ``len(RepeatSequence(a, repeats=3))`` is ``3 * len(a)``, the number of
  items iteration yields (loadit said ``len(a)``); an endless repeat has
  no length (``TypeError``) but iterates forever, as before.
- A view over an index function (``SequenceView(a, f, length=n)``) ends
  at ``n`` items: ``view[n]`` raises ``IndexError`` and iteration stops
  (loadit kept indexing ``a`` past ``n``). Slicing any of these objects
  returns a view (``view[::-1]`` reversed, too).
- ``chunk_shuffle_idx`` draws its permutation from shard-store's
  SplitMix64 instead of numpy's ``default_rng``: the same seed gives a
  different order than loadit did (the same in Rust and Python, on every
  platform). ``seed=None`` still means a fresh random order.
"""

from __future__ import annotations

import operator
import secrets
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from cachex import _cachex

__all__ = [
    "ConcatableSequence",
    "InterleaveSequences",
    "RepeatSequence",
    "SequenceView",
    "chunk_shuffle",
    "chunk_shuffle_idx",
    "is_sequence",
]


def is_sequence(s: Any) -> bool:
    """Whether ``s`` has ``__getitem__``, ``__len__`` and ``__iter__`` (loadit's test)."""
    return all(hasattr(s, at) for at in ("__getitem__", "__len__", "__iter__"))


def _position(index: Any, length: Callable[[], int]) -> int:
    """``index`` as a position in ``[0, length())``; negative counts from the end."""
    i = operator.index(index)
    if i < 0:
        n = length()
        i += n
        if i < 0:
            raise IndexError(f"index {index} out of range for length {n}")
    return i


class _Indexable(Sequence[Any]):
    """``[]`` with a slice or a sequence of indices gives a lazy view."""

    def _item(self, index: Any) -> Any:
        raise NotImplementedError

    def __getitem__(self, *idx: Any) -> Any:
        key = idx[0] if len(idx) == 1 else idx
        if isinstance(key, slice):
            return SequenceView(self, range(*key.indices(len(self))))
        if is_sequence(key):
            return SequenceView(self, key)
        return self._item(key)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self._item(i)


#: The indices of a view: a list, ``range`` or numpy array of ints.
Indices = Sequence[int] | npt.NDArray[np.integer[Any]]


class SequenceView(_Indexable):
    """A lazy view of ``seq``: item ``i`` is ``seq[indices[i]]``.

    Parameters
    ----------
    seq : sequence
        Anything with ``len`` and ``[]`` (a list, a ``LoadIt``, another view).
    indices : sequence of int or callable, optional
        The index list (a list, ``range`` or numpy array; negative entries
        count from the end of ``seq``), or a function ``i -> index`` (then
        ``length`` is required). ``None`` views all of ``seq``.
    length : int, optional
        The view's length when ``indices`` is a function.
    """

    def __init__(
        self,
        seq: Sequence[Any] | npt.NDArray[Any],
        indices: Indices | Callable[[int], int] | None = None,
        length: int | None = None,
    ) -> None:
        self.seq = seq
        self.indices = indices
        self.length: int | None = None
        self.index_map: Callable[[int], int] | None
        if indices is None or is_sequence(indices):
            self.index_map = None
        elif callable(indices):
            if length is None:
                raise ValueError(
                    "cannot specify a callable indices argument without manually "
                    "providing the length!"
                )
            self.index_map = indices
            self.length = operator.index(length)
        else:
            raise TypeError(f"indices must be a sequence or a callable, not {type(indices)}")

    def _item(self, index: Any) -> Any:
        indices = self.indices
        if indices is None:
            return self.seq[index]
        if self.index_map is None:
            return self.seq[cast(Indices, indices)[index]]
        i = _position(index, self.__len__)
        if i >= len(self):
            raise IndexError(f"index {index} out of range for length {self.length}")
        return self.seq[self.index_map(i)]

    def __len__(self) -> int:
        if self.length is None:
            indices = cast(Indices | None, self.indices)  # a callable has a length
            self.length = len(self.seq) if indices is None else len(indices)
        return self.length


class InterleaveSequences(_Indexable):
    """Round-robin over ``seqs``: ``a0, b0, c0, a1, b1, c1, ...``; when the
    shorter ones run out the longer ones continue in turn."""

    def __init__(self, *seqs: Sequence[Any]) -> None:
        self.seqs = seqs
        self.lengths = [len(s) for s in seqs]
        self._index = _cachex.InterleaveIndex(self.lengths)

    def _item(self, index: Any) -> Any:
        part, offset = self._index.locate(_position(index, self.__len__))
        return self.seqs[part][offset]

    def __len__(self) -> int:
        return len(self._index)


class ConcatableSequence(_Indexable):
    """``seqs`` one after another, like ``itertools.chain`` with random access.

    A part's length is asked for only when an index runs past it (the
    length of a ``LoadIt`` may mean iterating its source to the end).
    ``a + b`` concatenates further.
    """

    def __init__(self, *seqs: Sequence[Any]) -> None:
        self.seqs = seqs
        self._lengths: list[int | None] = [None] * len(seqs)

    def _item(self, index: Any) -> Any:
        i = _position(index, self.__len__)
        while True:
            at = _cachex.concat_locate(self._lengths, i)
            if at is None:
                raise IndexError(f"index {index} out of range for length {len(self)}")
            part, offset, probe = at
            try:
                return self.seqs[part][offset]
            except IndexError:
                if not probe:
                    raise
                self._lengths[part] = len(self.seqs[part])

    def __len__(self) -> int:
        lengths = [len(s) for s in self.seqs]
        self._lengths = [*lengths]
        return sum(lengths)

    def __add__(self, other: Sequence[Any]) -> ConcatableSequence:
        more = other.seqs if isinstance(other, ConcatableSequence) else (other,)
        return ConcatableSequence(*self.seqs, *more)


class RepeatSequence(_Indexable):
    """``seq`` repeated ``repeats`` times, or forever when ``None``."""

    def __init__(self, seq: Sequence[Any], repeats: int | None = None) -> None:
        self.seq = seq
        self.repeats = repeats

    def _item(self, index: Any) -> Any:
        i = _position(index, self.__len__)
        j = _cachex.repeat_index(i, len(self.seq), self.repeats)
        if j is None:
            raise IndexError(f"index {index} out of range for length {len(self)}")
        return self.seq[j]

    def __len__(self) -> int:
        if self.repeats is None:
            raise TypeError("an endless RepeatSequence (repeats=None) has no length")
        return len(self.seq) * self.repeats

    def __iter__(self) -> Iterator[Any]:
        if self.repeats is not None:
            yield from super().__iter__()
            return
        while len(self.seq) > 0:
            yield from self.seq


def chunk_shuffle_idx(chunk_size: int, length: int, seed: int | None = None) -> np.ndarray:
    """A permutation of ``range(length)`` shuffled within consecutive chunks.

    Each chunk ``[k * chunk_size, (k + 1) * chunk_size)`` (and the shorter
    last one) is permuted in place; ``seed`` (an int in ``[0, 2**64)``)
    makes it reproducible, in Rust (``shard_store::chunk_shuffle_indices``)
    and Python alike. Returns an int64 numpy array, as loadit did.
    """
    chunk_size, length = operator.index(chunk_size), operator.index(length)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if length < 0:
        raise ValueError(f"length must be non-negative, got {length}")
    if seed is None:
        seed = secrets.randbits(64)
    seed = operator.index(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return _cachex.chunk_shuffle_indices(chunk_size, length, seed)


def chunk_shuffle(
    seq: Sequence[Any],
    chunk_size: int | None,
    length: int | None = None,
    seed: int | None = None,
) -> SequenceView:
    """A view of the first ``length`` items of ``seq`` (all by default),
    shuffled within chunks of ``chunk_size`` (the whole view by default)."""
    if length is None:
        length = len(seq)
    if chunk_size is None:
        chunk_size = max(length, 1)
    idx = chunk_shuffle_idx(chunk_size, length, seed)
    view: SequenceView = seq[idx] if isinstance(seq, SequenceView) else SequenceView(seq, idx)
    return view
