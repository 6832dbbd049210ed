"""cachex.loadit's sequence utilities: loadit's README examples, edge
cases, and each loadit 0.0.8 bug we fix (named in the test)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from cachex.loadit import (
    ConcatableSequence,
    InterleaveSequences,
    RepeatSequence,
    SequenceView,
    chunk_shuffle,
    chunk_shuffle_idx,
)
from cachex.loadit.util import is_sequence


class Counted(list):
    """A list that counts ``len`` calls (laziness checks)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.len_calls = 0

    def __len__(self) -> int:
        self.len_calls += 1
        return super().__len__()


A = list(range(100, 120))


def test_loadit_readme_views():
    view = SequenceView(A, [2, 3, 1, 2, 3, 5, 7, 8, 9, 10, 1])
    assert view[1] == A[3]
    new_view = SequenceView(view, lambda idx: -2 * idx, length=len(view) // 2)
    assert new_view[1] == A[10]
    newer_view = new_view[0, 3, 4]
    assert newer_view[1] == A[5]
    assert list(newer_view) == [new_view[0], new_view[3], new_view[4]]


def test_views_negative_indices_slices_and_numpy_indices():
    view = SequenceView(A, np.array([5, -1, 0]))
    assert list(view) == [A[5], A[-1], A[0]] and view[-1] == A[0]
    whole = SequenceView(A)
    assert len(whole) == len(A) and whole[-2] == A[-2]
    assert list(whole[::-1]) == A[::-1] and list(whole[3:15:4]) == A[3:15:4]
    assert list(whole[5:1:-2]) == A[5:1:-2] and list(whole[:0]) == []
    with pytest.raises(IndexError):
        view[3]


def test_function_view_ends_at_its_length():
    # loadit 0.0.8 kept indexing past `length` (iteration yielded 6 items here).
    v = SequenceView(list(range(11)), lambda i: -2 * i, length=3)
    assert list(v) == [0, 9, 7] and v[-1] == 7
    with pytest.raises(IndexError):
        v[3]
    with pytest.raises(ValueError, match="length"):
        SequenceView(A, lambda i: i)


def test_concat_readme_example_and_add():
    # loadit 0.0.8: ConcatableSequence(a, b) + ConcatableSequence(c) raised TypeError.
    a, b, c = [1, 2], [3], [4, 5, 6]
    a_b_c = ConcatableSequence(a, b) + ConcatableSequence(c)
    assert list(a_b_c) == a + b + c and len(a_b_c) == 6
    assert list(ConcatableSequence(a) + b) == a + b


def test_concat_is_lazy_and_indexes_like_a_list():
    parts = [Counted([0, 1, 2]), Counted([]), Counted([3]), Counted([4, 5])]
    cat = ConcatableSequence(*parts)
    assert cat[1] == 1
    assert all(p.len_calls == 0 for p in parts)  # no length asked for
    assert cat[4] == 4 and parts[3].len_calls == 0
    assert [cat[i] for i in range(6)] == [0, 1, 2, 3, 4, 5]
    assert cat[-1] == 5 and cat[-6] == 0  # loadit 0.0.8 returned part 0's items
    for bad in (6, -7):
        with pytest.raises(IndexError):
            cat[bad]
    assert list(ConcatableSequence()) == [] and len(ConcatableSequence([], [])) == 0


def test_interleave_round_robin():
    # loadit 0.0.8 raised IndexError past the first items.
    a, b, c = [0, 1], [10, 11, 12, 13], [20]
    il = InterleaveSequences(a, b, c)
    assert list(il) == [0, 10, 20, 1, 11, 12, 13] and len(il) == 7
    assert il[-1] == 13
    with pytest.raises(IndexError):
        il[7]
    assert list(InterleaveSequences([], [1, 2], [])) == [1, 2]
    assert list(InterleaveSequences()) == []


def test_repeat():
    # loadit 0.0.8: len(RepeatSequence(a, 3)) == len(a).
    r = RepeatSequence([1, 2, 3], repeats=3)
    assert len(r) == 9 and list(r) == [1, 2, 3] * 3 and r[-1] == 3
    with pytest.raises(IndexError):
        r[9]
    forever = RepeatSequence([1, 2], repeats=None)
    assert list(itertools.islice(forever, 5)) == [1, 2, 1, 2, 1]
    assert forever[1001] == 2
    with pytest.raises(TypeError, match="no length"):
        len(forever)
    assert list(RepeatSequence([], 4)) == []


def test_chunk_shuffle_idx_is_pinned_and_shared_with_rust():
    # crates/shard-store/tests/sequence.rs pins the same order for Rust.
    assert chunk_shuffle_idx(4, 10, 42).tolist() == [2, 0, 3, 1, 6, 7, 5, 4, 8, 9]


@pytest.mark.parametrize(("chunk", "length"), [(1, 5), (4, 10), (7, 7), (10, 3), (3, 0)])
def test_chunk_shuffle_idx_permutes_within_chunks(chunk, length):
    for seed in (0, 1, 2**64 - 1, None):
        idx = chunk_shuffle_idx(chunk, length, seed)
        assert idx.dtype == np.int64 and sorted(idx.tolist()) == list(range(length))
        for k in range(0, length, chunk):
            assert sorted(idx[k : k + chunk].tolist()) == list(range(k, min(k + chunk, length)))
    assert (chunk_shuffle_idx(chunk, length, 5) == chunk_shuffle_idx(chunk, length, 5)).all()


def test_chunk_shuffle_idx_rejects_bad_arguments():
    for args in ((0, 10, 1), (4, -1, 1), (4, 10, -1), (4, 10, 2**64)):
        with pytest.raises(ValueError):
            chunk_shuffle_idx(*args)


def test_chunk_shuffle_views():
    seq = list(range(50))
    s = chunk_shuffle(seq, chunk_size=10, length=30, seed=3)
    assert isinstance(s, SequenceView) and len(s) == 30
    assert sorted(s) == list(range(30)) and sorted(s[:10]) == list(range(10))
    whole = chunk_shuffle(seq, None, seed=3)
    assert sorted(whole) == seq
    of_view = chunk_shuffle(SequenceView(seq, range(10, 20)), 5, seed=1)
    assert sorted(of_view) == list(range(10, 20))


def test_loadit_import_paths():
    import cachex.loadit.loadit
    import cachex.loadit.util

    assert cachex.loadit.util.SequenceView is SequenceView
    assert cachex.loadit.loadit.LoadIt is cachex.loadit.LoadIt
    assert is_sequence([]) and not is_sequence(3)
