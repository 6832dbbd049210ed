"""cachex.sampling: the plan's properties for random sizes, block layouts,
seeds, world sizes, worker counts and resume points (hypothesis), the rank
from the environment, and the plan-driven sampler and iterable datasets in
one process (their torchrun launches are in test_torchrun.py)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cachex
from cachex.sampling import (
    Progress,
    SamplingPlan,
    Step,
    distributed_rank,
    even_blocks,
    page_blocks,
)
from cachex.torch import datasets as data

blocks_st = st.lists(st.integers(1, 12), min_size=0, max_size=25)
run_st = st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 9))  # ranks, workers, batch


def reads_of(deal, steps=None):
    """Every rank's batches (the first ``steps`` of each): rank -> list of arrays."""
    n = deal.num_batches if steps is None else min(steps, deal.num_batches)
    return {r: [deal.batch(r, j) for j in range(n)] for r in range(deal.world_size)}


@settings(max_examples=150, deadline=None)
@given(
    blocks=blocks_st,
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 50),
    run=run_st,
    policy=st.sampled_from(["pad", "drop_last"]),
)
def test_one_epoch_is_every_sample_once_in_equal_batches(blocks, seed, epoch, run, policy):
    world, workers, bs = run
    plan = SamplingPlan(blocks, bs, seed=seed, policy=policy)
    n = plan.num_samples
    deal = plan.deal(epoch, world, workers)
    per_rank = reads_of(deal)
    sizes = {r: [len(b) for b in bs_] for r, bs_ in per_rank.items()}
    assert len({tuple(s) for s in sizes.values()}) == 1  # same batches, same sizes
    assert all(len(s) == deal.num_batches for s in sizes.values())
    counts = Counter(int(i) for b in per_rank.values() for x in b for i in x)
    if policy == "pad":
        assert set(counts) == set(range(n))
        assert sum(counts.values()) == n + deal.padded and deal.padded < world
        assert all(s[:-1] == [bs] * (len(s) - 1) for s in sizes.values())
    else:
        assert all(c == 1 for c in counts.values()) and set(counts) <= set(range(n))
        assert all(size == bs for s in sizes.values() for size in s)
        assert n - len(counts) == deal.dropped < world * bs
    # Worker w makes batches j = w, w + W, ...: the DataLoader's turn order.
    for r in range(world):
        for w in range(workers):
            got = [b.tolist() for b in deal.worker_batches(r, w)]
            assert got == [per_rank[r][j].tolist() for j in range(w, deal.num_batches, workers)]


@settings(max_examples=150, deadline=None)
@given(
    blocks=blocks_st,
    seed=st.integers(0, 2**32),
    runs=st.lists(st.tuples(run_st, st.floats(0, 1)), min_size=1, max_size=4),
    last=run_st,
    policy=st.sampled_from(["pad", "drop_last"]),
)
def test_restarts_with_any_world_size_read_the_epoch_exactly_once(blocks, seed, runs, last, policy):
    """Runs stopped after some steps, then one that finishes: every sample
    read once (beyond the padding of each run), none lost but the last run's
    dropped tail."""
    plan = SamplingPlan(blocks, 4, seed=seed, policy=policy)
    n = plan.num_samples
    history: list[Step] = []
    counts: Counter = Counter()
    padding = 0
    for (world, workers, bs), frac in [*runs, (last, 1.0)]:
        deal = plan.deal(3, world, workers, history, batch_size=bs)
        steps = round(frac * deal.num_batches)
        for batches in reads_of(deal, steps).values():
            counts.update(int(i) for b in batches for i in b)
        padding += deal.padded if steps else 0
        history.append(Step(world, workers, bs, steps))
        # A state names the runs, not the samples: a few numbers.
        state = plan.state(Progress(3, history[:-1]), history[-1])
        assert plan.progress_of(json.loads(json.dumps(state))).history == [
            s for s in history if s.steps
        ]
    assert sum(counts.values()) - len(counts) <= padding
    if policy == "pad":
        assert set(counts) == set(range(n))
    else:
        assert max(counts.values(), default=1) == 1
        assert n - len(counts) == deal.dropped
    assert len(plan.remaining(3, history)) == (0 if policy == "pad" else deal.dropped)


@settings(max_examples=60, deadline=None)
@given(blocks=st.lists(st.integers(1, 30), min_size=1, max_size=40), seed=st.integers(0, 999))
def test_the_order_keeps_each_block_together_and_changes_with_the_epoch(blocks, seed):
    plan = SamplingPlan(blocks, 8, seed=seed)
    block_of = np.repeat(np.arange(len(blocks)), blocks)
    for epoch in (0, 1):
        order = plan.epoch_order(epoch)
        assert sorted(order.tolist()) == list(range(plan.num_samples))
        runs = np.count_nonzero(np.diff(block_of[order])) + 1
        assert runs == len(blocks)  # each block's samples are consecutive
        again = SamplingPlan(blocks, 8, seed=seed).epoch_order(epoch)
        assert np.array_equal(order, again)  # a pure function of its inputs
    unshuffled = SamplingPlan(blocks, 8, seed=seed, shuffle=False).epoch_order(5)
    assert unshuffled.tolist() == list(range(plan.num_samples))


def test_a_large_plan_is_numpy_work_and_its_state_is_small():
    plan = SamplingPlan(even_blocks(2_000_000, 1000), 256, seed=7)
    deal = plan.deal(0, 8, 4, [Step(2, 2, 256, 1000)])
    assert deal.num_batches == -(-(2_000_000 - 2 * 1000 * 256) // 8 // 256)
    state = plan.state(Progress(0, [Step(2, 2, 256, 1000)]), Step(8, 4, 256, 10))
    assert len(json.dumps(state)) < 400


def test_a_state_of_another_plan_is_refused():
    state = SamplingPlan([4, 4], 2, seed=1).state(Progress(0), Step(1, 1, 2, 1))
    for other in (
        SamplingPlan([4, 4], 2, seed=2),
        SamplingPlan([8], 2, seed=1),
        SamplingPlan([4, 4], 2, seed=1, policy="drop_last"),
    ):
        with pytest.raises(cachex.InvalidInputError, match="another plan"):
            other.progress_of(state)
    with pytest.raises(cachex.InvalidInputError, match="format"):
        SamplingPlan([4, 4], 2, seed=1).progress_of({"epoch": 0})
    with pytest.raises(cachex.InvalidInputError):
        SamplingPlan([4, 4], 0)
    with pytest.raises(cachex.InvalidInputError):
        SamplingPlan([4, 0], 2)


def test_rank_comes_from_arguments_then_the_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed_rank() == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert distributed_rank() == (2, 4)
    assert distributed_rank(1, 2) == (1, 2)
    assert distributed_rank(world_size=8) == (2, 8)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(cachex.InvalidInputError, match="rank 4 of world_size 4"):
        distributed_rank()


# --- the datasets in one process ---------------------------------------------------

N = 150


def build_page(path, page_size=4096) -> list[int]:
    w = cachex.PageWriter(path, {"i": "int", "x": ("float32", (8,))}, page_size=page_size)
    w.write_many([{"i": i, "x": np.full(8, i, np.float32)} for i in range(N)])
    return w.finalize()


def test_page_blocks_are_the_files_pages(tmp_path):
    summary = build_page(tmp_path / "a.pages")
    blocks = page_blocks(tmp_path / "a.pages")
    assert blocks.sum() == N and len(blocks) == summary["num_pages"] > 1
    ds = data.PageDataset(tmp_path / "a.pages")
    assert np.array_equal(ds.blocks(), blocks)
    (tmp_path / "bad.pages").write_bytes(b"nope" * 40)
    with pytest.raises(cachex.CorruptError, match=r"bad\.pages"):
        page_blocks(tmp_path / "bad.pages")


def ids_of(batches) -> list[list[int]]:
    return [np.asarray(b["i"]).tolist() for b in batches]


def test_page_iterable_ranks_are_disjoint_equal_and_resume(tmp_path):
    build_page(tmp_path / "a.pages")
    path = tmp_path / "a.pages"
    ranks = [data.PageDataset(path).iterable(16, seed=4, rank=r, world_size=3) for r in range(3)]
    got = [ids_of(ds) for ds in ranks]
    assert len({len(g) for g in got}) == 1 and len(got[0]) == len(ranks[0])
    flat = Counter(i for g in got for b in g for i in b)
    assert set(flat) == set(range(N)) and sum(flat.values()) == N  # 150 = 3 * 50: no padding

    # Two ranks read 2 batches each and stop; one process finishes the epoch.
    first = [data.PageDataset(path).iterable(16, seed=4, rank=r, world_size=2) for r in range(2)]
    read = []
    for ds in first:
        it = iter(ds)
        read += [i for _ in range(2) for i in next(it)["i"].tolist()]
    state = first[0].state_dict()
    assert state == first[1].state_dict() and state["history"] == [[2, 1, 16, 2]]
    rest = data.PageDataset(path).iterable(16, seed=4, world_size=1, rank=0)
    rest.set_epoch(0)  # the loaded epoch's own set_epoch keeps the state
    rest.load_state_dict(state)
    rest.set_epoch(0)
    read += [i for b in ids_of(rest) for i in b]
    assert sorted(read) == list(range(N))
    rest.set_epoch(1)  # another epoch starts from the top
    assert sorted(i for b in ids_of(rest) for i in b) == list(range(N))


def test_drop_last_yields_full_batches_on_every_rank(tmp_path):
    build_page(tmp_path / "a.pages")
    per_rank = [
        ids_of(
            data.PageDataset(tmp_path / "a.pages").iterable(
                16, policy="drop_last", rank=r, world_size=4
            )
        )
        for r in range(4)
    ]
    assert {len(b) for g in per_rank for b in g} == {16}
    assert len({len(g) for g in per_rank}) == 1 and len(per_rank[0]) == N // (4 * 16)


def test_map_style_sampler_deals_the_plan(tmp_path):
    build_page(tmp_path / "a.pages")
    ds = data.PageDataset(tmp_path / "a.pages")
    samplers = [ds.sampler(10, seed=1, rank=r, world_size=4) for r in range(4)]
    got = [[ds[idx]["i"].tolist() for idx in s] for s in samplers]
    assert len({len(g) for g in got}) == 1
    flat = Counter(i for g in got for b in g for i in b)
    assert set(flat) == set(range(N)) and sum(flat.values()) - N == samplers[0].deal().padded == 2
    sampler = samplers[0]
    it = iter(sampler)
    next(it)
    state = sampler.state_dict()
    assert state["history"] == [[4, 1, 10, 1]]
    sampler.load_state_dict(state)
    assert len(sampler) == len(samplers[1]) - 1


def test_every_store_gives_its_blocks(tmp_path):
    w = cachex.MemmapWriter(tmp_path / "m", {"x": ("float32", (1024,))})
    for i in range(600):
        w.write(f"s{i}", {"x": np.zeros(1024, np.float32)})
    w.finalize()
    assert data.MemmapDataset(tmp_path / "m").blocks().tolist() == [256, 256, 88]
    shard = data.ShardDataset(tmp_path / "sh", lambda: iter(range(50)), max_shard_length=16)
    assert shard.blocks().tolist() == [16, 16, 16, 2]
    it = shard.iterable(8, seed=2)
    assert sorted(i for b in it for i in np.asarray(b).tolist()) == list(range(50))
