"""cachex.streams: each stream's share of every epoch, samples without
replacement across epochs, an even interleave, exact resume of a mixture on
another world size, worker count and replication (hypothesis); stream
weights as MosaicML Streaming's; MixedDataset over stores of different
kinds; a five-stream state under 1 KB."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cachex
from cachex.streams import MixturePlan, Stream, interleave_ranks, stream_counts
from cachex.torch import MixedDataset, PageDataset, PlanSampler
from cachex.torch import datasets as data

# One stream: its size, its block size and one weight of the mixture's kind.
sizes_st = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 9)), min_size=1, max_size=5)


@st.composite
def mixtures(draw):
    """(sizes, blocks, streams, epoch_size) of 1-5 streams weighted one way."""
    spec = draw(sizes_st)
    sizes = [n for n, _ in spec]
    blocks = [data.even_blocks(n, b) for n, b in spec]
    kind = draw(st.sampled_from(["none", "proportion", "repeat", "choose", "epoch_size"]))
    epoch_size = None
    if kind == "proportion":
        streams = [Stream(None, proportion=draw(st.floats(0.05, 1))) for _ in sizes]
        epoch_size = draw(st.none() | st.integers(1, 200))
    elif kind == "repeat":
        streams = [Stream(None, repeat=draw(st.floats(0, 2.5))) for _ in sizes]
    elif kind == "choose":
        streams = [Stream(None, choose=draw(st.integers(0, 130))) for _ in sizes]
    else:
        streams = [Stream(None) for _ in sizes]
        if kind == "epoch_size":
            epoch_size = draw(st.integers(1, 200))
    return sizes, blocks, streams, epoch_size


@settings(max_examples=100, deadline=None)
@given(mix=mixtures(), seed=st.integers(0, 2**32), shuffle=st.booleans())
def test_each_stream_gets_its_share_once_per_epoch_and_no_repeat_before_a_full_pass(
    mix, seed, shuffle
):
    sizes, blocks, streams, epoch_size = mix
    counts = stream_counts(sizes, streams, epoch_size, seed)
    total = int(counts.sum())
    if streams[0].proportion is not None or epoch_size is not None:
        weights = np.array(
            [
                s.proportion if s.proportion is not None else n
                for s, n in zip(streams, sizes, strict=True)
            ]
        )
        share = weights / weights.sum() * total
        assert np.all(np.abs(counts - share) < 1)  # within one sample of the share
    plan = MixturePlan(blocks, counts, 4, seed=seed, shuffle=shuffle)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    runs = [[] for _ in sizes]  # each stream's samples, epoch after epoch
    for epoch in range(4):
        order = plan.epoch_order(epoch)
        assert len(order) == total
        stream = plan.stream_of(order)
        for s, n in enumerate(sizes):
            mine = order[stream == s] - offsets[s]
            assert len(mine) == counts[s]
            assert mine.min(initial=0) >= 0 and mine.max(initial=0) < n
            if counts[s] <= n:  # not up-sampled: each sample at most once an epoch
                assert len(set(mine.tolist())) == len(mine)
            runs[s] += mine.tolist()
    for s, n in enumerate(sizes):
        # Down- or up-sampled, every sample comes before any repeats: the
        # stream's samples over the epochs are whole passes, each all of it.
        run = runs[s]
        for q in range(len(run) // n):
            assert sorted(run[q * n : (q + 1) * n]) == list(range(n))
        assert len(set(run[(len(run) // n) * n :])) == len(run) % n


@settings(max_examples=100, deadline=None)
@given(
    counts=st.lists(st.integers(0, 300), min_size=1, max_size=5),
    offsets=st.lists(st.integers(0, 1023), min_size=5, max_size=5),
    length=st.integers(1, 200),
    start=st.floats(0, 1),
)
def test_the_interleave_is_even_in_any_window(counts, offsets, length, start):
    places = interleave_ranks(counts, offsets[: len(counts)])
    total = sum(counts)
    label = np.full(total, -1)
    for s, place in enumerate(places):
        label[place] = s
    assert np.all(label >= 0)  # a permutation: every place taken once
    lo = int(start * max(total - length, 0))
    window = label[lo : lo + length]
    for s, c in enumerate(counts):
        share = c / total * len(window) if total else 0
        assert abs(np.count_nonzero(window == s) - share) <= 2


shape_st = st.tuples(st.integers(1, 3), st.integers(1, 2)).map(lambda t: (t[0] * t[1], t[1]))


def joined(batches_of_ranks, replication):
    world = len(batches_of_ranks)
    return [
        [i for d in range(world // replication) for i in batches_of_ranks[d * replication][k]]
        for k in range(len(batches_of_ranks[0]))
    ]


@settings(max_examples=60, deadline=None)
@given(
    mix=mixtures(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 3),
    before=shape_st,
    after=shape_st,
    workers=st.tuples(st.integers(0, 3), st.integers(0, 3)),
    stop=st.floats(0, 1),
)
def test_a_mixture_resumed_on_another_shape_reads_what_the_uninterrupted_job_would(
    mix, seed, epoch, before, after, workers, stop
):
    sizes, blocks, streams, epoch_size = mix
    g = 12
    counts = stream_counts(sizes, streams, epoch_size, seed)

    def sampler(rank, world, replication):
        plan = MixturePlan(
            blocks, counts, 1, seed=seed, global_batch_size=g, replication=replication
        )
        s = PlanSampler.of_plan(plan, rank=rank, world_size=world)
        s.set_epoch(epoch)
        return s

    (w0, r0), (w1, r1) = before, after
    whole = joined([list(sampler(r, w0, r0)) for r in range(w0)], r0)
    k = round(stop * len(whole))
    first = sampler(0, w0, r0)
    it = iter(first)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(first.state_dict(num_workers=workers[0])))
    rest = []
    for r in range(w1):
        s = sampler(r, w1, r1)
        s.load_state_dict(state)
        rest.append(list(s))
    total = int(counts.sum())

    def unpadded(batches):  # the last batch's padding depends on the ranks
        return [b[: total - (k + j) * g] for j, b in enumerate(batches)]

    assert unpadded(joined(rest, r1)) == unpadded(whole[k:])


def test_weights_follow_mosaicml_streaming():
    sizes = [100, 50, 10]
    assert stream_counts(sizes, [Stream(None)] * 3).tolist() == sizes
    rep = [Stream(None, repeat=0.5), Stream(None, choose=7), Stream(None, repeat=2)]
    assert stream_counts(sizes, rep).tolist() == [50, 7, 20]
    props = [Stream(None, proportion=p) for p in (2, 1, 1)]
    assert stream_counts(sizes, props, epoch_size=40).tolist() == [20, 10, 10]
    assert stream_counts(sizes, props).sum() == 160
    assert stream_counts(sizes, [Stream(None)] * 3, epoch_size=32).tolist() == [20, 10, 2]
    with pytest.raises(cachex.InvalidInputError, match="some streams have a proportion"):
        stream_counts(sizes, [Stream(None, proportion=1), Stream(None), Stream(None)])
    with pytest.raises(cachex.InvalidInputError, match="epoch_size goes with proportions"):
        stream_counts(sizes, rep, epoch_size=10)
    with pytest.raises(cachex.InvalidInputError, match="at most one"):
        Stream(None, proportion=1, repeat=2)
    with pytest.raises(cachex.InvalidInputError, match="repeat -1"):
        Stream(None, repeat=-1)
    with pytest.raises(cachex.InvalidInputError, match="which store"):
        Stream("/data/x.bin").dataset()
    with pytest.raises(cachex.InvalidInputError, match="affinity"):
        MixturePlan([[4]], [4], 2, affinity="node")


def test_a_five_stream_state_is_a_few_numbers():
    blocks = [data.even_blocks(n, 1000) for n in (400_000, 300_000, 200_000, 60_000, 40_000)]
    plan = MixturePlan(blocks, [300_000, 300_000, 200_000, 100_000, 100_000], 256, seed=1)
    sampler = PlanSampler.of_plan(plan, world_size=8, rank=3)
    state = sampler.state_dict(steps=17)
    assert state["position"] == 17 * 8 * 256
    assert len(json.dumps(state)) < 1024


def build_pages(path, n, base):
    w = cachex.PageWriter(path, {"i": "int"}, page_size=4096)
    w.write_many([{"i": base + i} for i in range(n)])
    w.finalize()
    return PageDataset(path)


def build_memmap(path, n, base):
    w = cachex.MemmapWriter(path, {"i": ("int64", (2,))})
    for i in range(n):
        w.write(f"s{i}", {"i": np.array([base + i, 0], np.int64)})
    w.finalize()
    return data.MemmapDataset(path)


def test_a_mixed_dataset_reads_stores_of_different_kinds(tmp_path):
    pages = build_pages(tmp_path / "a.pages", 70, 0)
    rows = build_memmap(tmp_path / "m", 30, 1000)
    mixed = MixedDataset(
        [Stream(pages, proportion=0.7), Stream(rows, proportion=0.3)], epoch_size=50
    )
    assert len(mixed) == 100 and mixed.counts().tolist() == [35, 15]
    it = mixed.iterable(None, global_batch_size=10, seed=2, world_size=1, rank=0)
    seen: Counter = Counter()
    for batch in it:
        assert set(batch) == {"stream", "parts"}  # int64 rows of () and (2,): one per stream
        stream = batch["stream"]
        assert len(stream) == 10
        for s, part in batch["parts"].items():
            seen.update((part["i"] if s == 0 else part["i"][:, 0]).tolist())
        assert all(len(p["i"]) == np.count_nonzero(stream == s) for s, p in batch["parts"].items())
    assert sum(1 for i in seen if i < 1000) == 35 and sum(1 for i in seen if i >= 1000) == 15
    assert max(seen.values()) == 1
    # Same fields, dtypes and shapes: one dict in the batch's order.
    same = MixedDataset([pages, build_pages(tmp_path / "b.pages", 20, 500)])
    batch = same.batch([0, 75, 1, 89])
    assert batch["i"].tolist() == [0, 505, 1, 519] and batch["stream"].tolist() == [0, 1, 0, 1]
    assert MixedDataset([Stream(str(tmp_path / "a.pages"))])[[3, 4]]["i"].tolist() == [3, 4]


def test_an_iterable_takes_a_list_of_streams(tmp_path):
    pages = build_pages(tmp_path / "a.pages", 30, 0)
    more = build_pages(tmp_path / "b.pages", 10, 100)
    it = data.IterableBatches([Stream(pages, choose=10), Stream(more)], 5, world_size=1, rank=0)
    assert isinstance(it.dataset, MixedDataset)
    got = [i for batch in it for i in batch["i"].tolist()]
    assert len(got) == 20 and sorted(i for i in got if i >= 100) == list(range(100, 110))


# --- a mixture's batch form: the mixture's, whatever the slice holds ----------


def build_segment(path, n, base):
    """A segment store of ``n`` records ``{"x": float32 (3,)}`` under keys
    ``k0..``: a dataset without declared fields (its batches are collated)."""
    keys = [f"k{i}" for i in range(n)]
    with cachex.SegmentStore(path, flush_every=8) as store:
        store.put_batch({k: {"x": np.full(3, base + i, np.float32)} for i, k in enumerate(keys)})
    return data.SegmentDataset(path, keys)


def specs_of(batch) -> dict:
    """Each field's dtype and row shape."""
    return {name: (str(v.dtype), tuple(v.shape[1:])) for name, v in batch.items()}


def rows_of(batch, s) -> list[int]:
    """Stream ``s``'s row values in a parts-form batch (the streams of
    ``three_streams``: ``i``, ``i[:, 0]``, ``x[:, 0]``)."""
    part = batch["parts"][s]
    values = part["i"] if s == 0 else part["i"][:, 0] if s == 1 else part["x"][:, 0]
    return np.asarray(values).astype(np.int64).tolist()


def three_streams(tmp_path):
    """Pages ``{"i"}`` (int64 rows of ()), a memmap array ``{"i"}`` (int64
    rows of (2,)) and a segment store ``{"x"}`` (float32 rows of (3,))."""
    return [
        build_pages(tmp_path / "a.pages", 20, 0),
        build_memmap(tmp_path / "m", 10, 1000),
        build_segment(tmp_path / "seg", 12, 2000),
    ]


def test_streams_of_the_same_fields_merge_on_every_slice(tmp_path):
    mixed = MixedDataset(
        [build_pages(tmp_path / "a.pages", 20, 0), build_pages(tmp_path / "b.pages", 10, 500)]
    )
    assert mixed.merged
    for indices, stream, values in [
        ([3, 1], [0, 0], [3, 1]),  # stream 0 only
        ([25, 20], [1, 1], [505, 500]),  # stream 1 only
        ([2, 27, 4], [0, 1, 0], [2, 507, 4]),  # both
        ([], [], []),
    ]:
        batch = mixed.batch(indices)
        assert set(batch) == {"i", "stream"}
        assert specs_of(batch) == {"i": ("int64", ()), "stream": ("int64", ())}
        assert batch["i"].tolist() == values and batch["stream"].tolist() == stream


def test_streams_whose_fields_differ_give_every_part_on_every_slice(tmp_path):
    datasets = three_streams(tmp_path)
    mixed = MixedDataset(datasets)
    assert not mixed.merged
    # What a read of one row of each stream gives: the zero-row parts' fields.
    read = [specs_of(d.batch([0])) for d in datasets]
    assert read == [
        {"i": ("int64", ())},
        {"i": ("int64", (2,))},
        {"x": ("float32", (3,))},
    ]
    for indices, stream in [
        ([4, 0], [0, 0]),  # pages only
        ([21, 29], [1, 1]),  # memmap only
        ([35, 30, 41], [2, 2, 2]),  # segment store only
        ([21, 5, 33], [1, 0, 2]),  # all three
        ([], []),
    ]:
        batch = mixed.batch(indices)
        assert set(batch) == {"stream", "parts"}
        assert batch["stream"].tolist() == stream
        assert set(batch["parts"]) == {0, 1, 2}
        for s in range(3):
            part = batch["parts"][s]
            assert specs_of(part) == read[s]
            pairs = zip(indices, stream, strict=True)
            mine = [i - int(mixed.offsets[s]) for i, t in pairs if t == s]
            base = [0, 1000, 2000][s]
            assert rows_of(batch, s) == [base + i for i in mine]  # [] where none is s


def test_three_ranks_of_one_worker_each_get_every_part_in_every_batch(tmp_path):
    """3 ranks x 1 worker over three streams whose fields differ: with one
    row a rank's slice, each slice holds one stream. The iterable read
    outside a DataLoader deals to one worker, as the sampler does."""
    mixed = MixedDataset(three_streams(tmp_path))
    seen: Counter = Counter()
    for global_batch_size in (3, 6):
        plan = {"global_batch_size": global_batch_size, "seed": 5, "world_size": 3}
        for rank in range(3):
            it = mixed.iterable(None, rank=rank, **plan)
            assert it.deal(0).num_workers == 1
            sampler = mixed.sampler(global_batch_size // 3, rank=rank, **plan)
            batches = list(it)
            sampled = [mixed[indices] for indices in sampler]
            assert len(batches) == len(sampled) == len(mixed) // global_batch_size
            for batch, other in zip(batches, sampled, strict=True):
                assert set(batch) == set(other) == {"stream", "parts"}
                assert set(batch["parts"]) == set(other["parts"]) == {0, 1, 2}
                assert batch["stream"].tolist() == other["stream"].tolist()
                for s in range(3):
                    rows = rows_of(batch, s)
                    assert rows == rows_of(other, s)
                    assert len(rows) == np.count_nonzero(batch["stream"] == s)
                    if global_batch_size == 3:
                        seen.update(rows)
    # The three ranks together read every sample once an epoch.
    assert sorted(seen) == [*range(20), *range(1000, 1010), *range(2000, 2012)]
    assert set(seen.values()) == {1}
