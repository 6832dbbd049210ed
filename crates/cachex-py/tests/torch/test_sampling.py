"""cachex.sampling: the plan's properties for random sizes, block layouts,
seeds, world sizes, worker counts, resume points and node affinities
(hypothesis), the node-affine order against the global one, the rank
from the environment, and the plan-driven sampler and iterable datasets in
one process (their torchrun launches are in test_torchrun.py)."""

from __future__ import annotations

import copy
import json
import pickle
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cachex
from cachex import sampling
from cachex.sampling import (
    Progress,
    SamplingPlan,
    default_homes,
    distributed_rank,
    even_blocks,
    node_overlap,
    page_blocks,
)
from cachex.torch import datasets as data

blocks_st = st.lists(st.integers(1, 12), min_size=0, max_size=25)
run_st = st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 9))  # ranks, workers, batch
# The plan's affinity keywords: global, or node-affine with homes and cross_node.
affinity_st = st.one_of(
    st.just({}),
    st.builds(
        lambda h, f: {"affinity": "node", "homes": h, "cross_node": f},
        st.integers(1, 5),
        st.sampled_from([0.0, 0.1, 0.5, 1.0]) | st.floats(0, 1),
    ),
)


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
    affinity=affinity_st,
)
def test_one_epoch_is_every_sample_once_in_equal_batches(
    blocks, seed, epoch, run, policy, affinity
):
    world, workers, bs = run
    plan = SamplingPlan(blocks, bs, seed=seed, policy=policy, **affinity)
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
    affinity=affinity_st,
)
def test_restarts_with_any_world_size_read_the_epoch_exactly_once(
    blocks, seed, runs, last, policy, affinity
):
    """Runs stopped after some steps, then one that finishes, each with its
    own world size, workers and global batch: every sample read once (beyond
    the padding of a last batch), none lost but the last run's dropped tail."""
    plan = SamplingPlan(blocks, 4, seed=seed, policy=policy, **affinity)
    n = plan.num_samples
    progress = Progress(3)
    counts: Counter = Counter()
    padding = 0
    for (world, workers, bs), frac in [*runs, (last, 1.0)]:
        deal = plan.deal(3, world, workers, progress, global_batch_size=bs * world)
        steps = round(frac * deal.num_batches)
        for batches in reads_of(deal, steps).values():
            counts.update(int(i) for b in batches for i in b)
        padding += deal.padded if steps and steps == deal.num_batches else 0
        progress = Progress(3, deal.end(steps), bs * world)
        # A state is the position in the global order: a few numbers.
        state = plan.state(progress)
        assert plan.progress_of(json.loads(json.dumps(state))) == progress
    assert sum(counts.values()) - len(counts) <= padding
    if policy == "pad":
        assert set(counts) == set(range(n))
        assert progress.position == n
    else:
        assert max(counts.values(), default=1) == 1
        assert n - len(counts) == deal.dropped == n - progress.position


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
    deal = plan.deal(0, 8, 4, Progress(0, 2 * 1000 * 256, 512))
    assert deal.num_batches == -(-(2_000_000 - 2 * 1000 * 256) // 8 // 256)
    state = plan.state(Progress(0, deal.end(10), 8 * 256))
    assert len(json.dumps(state)) < 400


def test_a_state_of_another_plan_is_refused():
    state = SamplingPlan([4, 4], 2, seed=1).state(Progress(0, 2, 2))
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


# --- node-affine dealing ---------------------------------------------------------


def global_order(blocks, seed, epoch) -> np.ndarray:
    """The epoch's order as the plan computed it before node affinity existed
    (blocks shuffled, then samples within blocks): the reference it keeps."""
    sizes = np.asarray(blocks, dtype=np.int64)
    n = int(sizes.sum())
    if n == 0:
        return np.arange(0, dtype=np.int64)
    rng = np.random.default_rng([seed & 0xFFFFFFFFFFFFFFFF, epoch])
    rank_of_block = np.empty(len(sizes), dtype=np.int64)
    rank_of_block[rng.permutation(len(sizes))] = np.arange(len(sizes))
    key = np.repeat(rank_of_block << 32, sizes) | rng.integers(0, 1 << 32, size=n, dtype=np.int64)
    return np.argsort(key, kind="stable")


@settings(max_examples=60, deadline=None)
@given(blocks=blocks_st, seed=st.integers(0, 2**63), epoch=st.integers(0, 50))
def test_the_global_order_is_unchanged_and_cross_node_one_is_global(blocks, seed, epoch):
    expect = global_order(blocks, seed, epoch)
    for affinity in (
        {},
        {"affinity": "global", "homes": 3, "cross_node": 0.2},
        {"affinity": "node", "homes": 4, "cross_node": 1.0},
        {"affinity": "node", "homes": 1, "cross_node": 0.0},  # one home: nothing to keep apart
    ):
        plan = SamplingPlan(blocks, 4, seed=seed, **affinity)
        assert np.array_equal(plan.epoch_order(epoch), expect)


@settings(max_examples=60, deadline=None)
@given(
    size=st.integers(1, 5),
    per_rank=st.integers(1, 4),  # blocks per rank
    homes=st.integers(1, 4),
    ranks=st.integers(1, 3),  # per node
    seed=st.integers(0, 2**32),
)
def test_with_no_cross_node_each_node_reads_its_own_group_every_epoch(
    size, per_rank, homes, ranks, seed
):
    """Equal blocks that split evenly over homes * ranks: node n's ranks read
    exactly home group n, in every epoch."""
    blocks = [size] * (per_rank * ranks * homes)
    plan = SamplingPlan(blocks, 2, seed=seed, affinity="node", homes=homes, cross_node=0.0)
    block_of = np.repeat(np.arange(len(blocks)), blocks)
    world = homes * ranks
    for epoch in range(3):
        group = plan.epoch_homes(epoch)
        assert np.bincount(group, minlength=homes).tolist() == [per_rank * ranks] * homes
        deal = plan.deal(epoch, world)
        for node in range(homes):
            read = np.concatenate(
                [deal.rank_order(r) for r in range(node * ranks, (node + 1) * ranks)]
            )
            assert sorted(read.tolist()) == np.flatnonzero(group[block_of] == node).tolist()


def test_a_node_keeps_its_samples_in_a_new_order_every_epoch():
    plan = SamplingPlan(even_blocks(960, 8), 16, seed=3, affinity="node", homes=4)
    deals = [plan.deal(epoch, 8) for epoch in range(4)]
    for node in range(4):
        orders = [
            np.concatenate([d.rank_order(2 * node), d.rank_order(2 * node + 1)]) for d in deals
        ]
        assert all(sorted(o.tolist()) == sorted(orders[0].tolist()) for o in orders)
        assert len({tuple(o.tolist()) for o in orders}) == 4  # a new order each epoch
    assert node_overlap(plan, 3, 4, 2).tolist() == [1.0] * 4


def test_cross_node_moves_a_fraction_of_the_blocks_and_keeps_groups_balanced():
    blocks = np.random.default_rng(5).integers(1, 40, size=1000)
    n = int(blocks.sum())
    overlaps = []
    for f in (0.0, 0.25, 1.0):
        plan = SamplingPlan(blocks, 32, seed=1, affinity="node", homes=4, cross_node=f)
        for epoch in range(3):
            counts = np.bincount(plan.epoch_homes(epoch), weights=blocks, minlength=4)
            assert np.all(np.abs(counts - n / 4) <= blocks.max())  # within one block
        overlaps.append(float(node_overlap(plan, 2, 4, 2).mean()))
    # f = 0 keeps every sample on its node but for the spill of a block at each
    # edge of a node's span; a quarter moving keeps most; the global order
    # keeps about 1 / homes.
    assert 0.98 < overlaps[0] < 1 and 0.55 < overlaps[1] < 0.8 and 0.15 < overlaps[2] < 0.35
    with pytest.raises(cachex.InvalidInputError, match="epoch"):
        node_overlap(plan, 0, 4, 2)


def test_the_documented_overlap_table_is_what_node_overlap_measures():
    doc = sampling.__doc__ or ""
    table = doc[doc.index("cross_node f") :].split("\n\n")[0].splitlines()[1:]
    assert len(table) == 5
    for row in table:
        f, overlap, kept_homes, one_share = row.split()
        plan = SamplingPlan(
            even_blocks(32_000, 32), 32, seed=0, affinity="node", homes=4, cross_node=float(f)
        )
        measured = np.mean([node_overlap(plan, e, 4, 2) for e in range(1, 5)])
        assert f"{measured:.3f}" == overlap, row
        assert float(one_share) == round(1 - measured, 2), row
        if kept_homes != "-":
            assert abs(float(kept_homes) - float(f) * (1 - 1 / 4)) < 0.005, row


def test_an_affine_state_round_trips_and_another_affinity_is_refused():
    plan = SamplingPlan([4] * 12, 2, seed=1, affinity="node", homes=3, cross_node=0.2)
    state = json.loads(json.dumps(plan.state(Progress(2, 12, 12))))
    assert (state["affinity"], state["homes"], state["cross_node"]) == ("node", 3, 0.2)
    again = SamplingPlan([4] * 12, 2, seed=1, affinity="node", homes=3, cross_node=0.2)
    assert again.progress_of(state) == Progress(2, 12, 12)
    with pytest.raises(cachex.InvalidInputError, match="affinity 'node', this plan's 'global'"):
        SamplingPlan([4] * 12, 2, seed=1).progress_of(state)
    for other, what in (
        ({"homes": 2, "cross_node": 0.2}, "homes 3"),
        ({"homes": 3, "cross_node": 0.5}, "cross_node 0.2"),
    ):
        with pytest.raises(cachex.InvalidInputError, match=what):
            SamplingPlan([4] * 12, 2, seed=1, affinity="node", **other).progress_of(state)
    # A state from before affinity is a global one.
    old = SamplingPlan([4] * 12, 2, seed=1).state(Progress(0, 4, 4))
    for k in ("affinity", "homes", "cross_node"):
        del old[k]
    assert SamplingPlan([4] * 12, 2, seed=1).progress_of(old) == Progress(0, 4, 4)
    with pytest.raises(cachex.InvalidInputError, match="affinity 'global', this plan's 'node'"):
        SamplingPlan([4] * 12, 2, seed=1, affinity="node", homes=3).progress_of(old)
    for bad in ({"affinity": "rack"}, {"homes": 0}, {"cross_node": 1.5}):
        with pytest.raises(cachex.InvalidInputError):
            SamplingPlan([4], 2, **bad)


def test_defaulted_homes_come_from_torchrun_and_adopt_a_loaded_state(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_homes() == 4
    assert SamplingPlan([4] * 12, 2, affinity="node").homes == 4
    # Three nodes of two ranks read a step, then a job of two nodes of four resumes.
    blocks = [3, 5, 4, 6] * 6
    first = SamplingPlan(blocks, 2, seed=9, affinity="node", homes=3, cross_node=0.1)
    deal = first.deal(1, 6)
    read = [i for r in range(6) for i in deal.batch(r, 0).tolist()]
    state = first.state(Progress(1, deal.end(1), 12))
    resumed = SamplingPlan(blocks, 2, seed=9, affinity="node", cross_node=0.1)
    assert resumed.homes == 4
    progress = resumed.progress_of(state)
    assert resumed.homes == 3 and np.array_equal(resumed.epoch_order(1), first.epoch_order(1))
    rest = resumed.deal(1, 8, position=progress)
    read += [i for r in range(8) for i in rest.rank_order(r).tolist()]
    assert sorted(set(read)) == list(range(sum(blocks)))
    assert len(read) - sum(blocks) == rest.padded
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert default_homes() == 1


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
    assert state == first[1].state_dict() and state["position"] == 2 * 2 * 16
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
    assert (state["position"], state["global_batch_size"]) == (40, 40)
    sampler.load_state_dict(state)
    assert len(sampler) == len(samplers[1]) - 1


def test_the_datasets_pass_the_affinity_to_their_plan(tmp_path):
    build_page(tmp_path / "a.pages")
    ds = data.PageDataset(tmp_path / "a.pages")
    node = {"affinity": "node", "homes": 2, "cross_node": 0.25}
    for planned in (ds.iterable(16, rank=0, world_size=4, **node), ds.sampler(16, **node)):
        plan = planned.plan
        assert (plan.affinity, plan.homes, plan.cross_node) == ("node", 2, 0.25)
    got = [ids_of(ds.iterable(16, seed=2, rank=r, world_size=4, **node)) for r in range(4)]
    flat = Counter(i for g in got for b in g for i in b)
    assert set(flat) == set(range(N)) and len({len(g) for g in got}) == 1


def test_a_state_loaded_after_workers_started_reaches_their_homes(tmp_path, monkeypatch):
    """A persistent DataLoader worker holds its own copy of the plan and shares
    the progress: the homes a loaded state brings reach its copy too."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    build_page(tmp_path / "a.pages")
    ds = data.PageDataset(tmp_path / "a.pages")
    node = {"affinity": "node", "cross_node": 0.1, "blocks": even_blocks(N, 5)}
    taken = ds.iterable(4, seed=5, homes=3, rank=0, world_size=6, **node)
    state = taken.state_dict(steps=2)
    main = ds.iterable(4, seed=5, rank=0, world_size=2, **node)
    worker = copy.copy(main)  # the worker's progress is the main process's shared one
    worker.plan = pickle.loads(pickle.dumps(main.plan))
    assert worker.plan.homes == main.plan.homes == 2
    stale = pickle.loads(pickle.dumps(main.plan))  # 2 homes: not the state's order
    main.load_state_dict(state)
    assert main.plan.homes == 3
    assert not np.array_equal(stale.epoch_order(0), main.plan.epoch_order(0))
    assert worker.order() == main.order()
    assert worker.plan.homes == 3
    assert pickle.loads(pickle.dumps(main._progress)).homes == 3


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
