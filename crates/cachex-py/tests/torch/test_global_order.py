"""cachex.sampling's global order: global batch k is the same samples,
position by position, whatever the world size, worker count and
replication; a state taken at any step and loaded by a job of another
shape reads exactly the uninterrupted job's global batches from that step
on (hypothesis); skip_steps, a changed global batch size, old states."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import cachex
from cachex.sampling import Progress, SamplingPlan, Step, data_parallel, even_blocks
from cachex.torch import datasets as data

blocks_st = st.lists(st.integers(1, 12), min_size=1, max_size=25)
# (world size, replication): the data-parallel ranks divide the global batch.
shape_st = st.tuples(st.integers(1, 4), st.integers(1, 2)).map(lambda t: (t[0] * t[1], t[1]))


def global_batches(sampler_of, world: int, replication: int) -> list[list[int]]:
    """Every global batch of one iteration of ``world`` ranks' samplers: the
    data-parallel ranks' batches joined; the replicas' batches checked equal."""
    ranks = [list(sampler_of(r, world)) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1  # every rank the same number of batches
    for r in range(world):
        assert ranks[r] == ranks[r - r % replication]  # a group reads one batch
    return [
        [i for d in range(world // replication) for i in ranks[d * replication][k]]
        for k in range(len(ranks[0]))
    ]


@settings(max_examples=80, deadline=None)
@given(
    blocks=blocks_st,
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 5),
    per_rank=st.integers(1, 4),
    shapes=st.lists(shape_st, min_size=2, max_size=3),
    workers=st.integers(1, 3),
    policy=st.sampled_from(["pad", "drop_last"]),
)
def test_global_batch_k_is_the_same_whatever_the_world(
    blocks, seed, epoch, per_rank, shapes, workers, policy
):
    g = per_rank * 24  # 1..4 data-parallel ranks divide it
    plan = SamplingPlan(blocks, 1, seed=seed, policy=policy, global_batch_size=g)
    order = plan.epoch_order(epoch)
    n = len(order)
    seen = []
    for world, replication in shapes:
        replicated = SamplingPlan(
            blocks, 1, seed=seed, policy=policy, global_batch_size=g, replication=replication
        )
        deal = replicated.deal(epoch, world, workers)
        got = [deal.global_batch(k).tolist() for k in range(deal.num_batches)]
        full = n // g
        # The full global batches are the order's consecutive runs of g.
        assert got[:full] == [order[k * g : (k + 1) * g].tolist() for k in range(full)]
        if policy == "drop_last":
            assert len(got) == full and deal.dropped == n - full * g
        else:
            assert len(got) == -(-n // g)
            assert deal.padded < data_parallel(world, replication)
            if n % g:  # the last is the rest of the order, padded from its start
                size = len(got[-1])
                assert size - (n - full * g) == deal.padded
                assert got[-1] == order[(full * g + np.arange(size)) % n].tolist()
        # Worker w makes the rank's batches w, w + W, ... (the DataLoader's turns).
        for w in range(workers):
            mine = [b.tolist() for b in deal.worker_batches(world - 1, w)]
            assert mine == [
                deal.batch(world - 1, j).tolist() for j in range(w, deal.num_batches, workers)
            ]
        seen.append(got[:full])
    assert all(s == seen[0] for s in seen)


@settings(max_examples=100, deadline=None)
@example(blocks=[13], seed=1, before=(1, 1), after=(2, 1), stop=0.0, skip=0, policy="pad")
@given(
    blocks=blocks_st,
    seed=st.integers(0, 2**32),
    before=shape_st,
    after=shape_st,
    stop=st.floats(0, 1),
    skip=st.integers(0, 2),
    policy=st.sampled_from(["pad", "drop_last"]),
)
def test_a_resumed_job_of_another_shape_reads_the_uninterrupted_global_batches(
    blocks, seed, before, after, stop, skip, policy
):
    g = 24

    def sampler_of(replication):
        def make(rank, world):
            return data.PlanSampler(
                blocks,
                1,
                seed=seed,
                policy=policy,
                rank=rank,
                world_size=world,
                global_batch_size=g,
                replication=replication,
            )

        return make

    (w0, r0), (w1, r1) = before, after
    whole = global_batches(sampler_of(r0), w0, r0)
    k = round(stop * len(whole))
    # Every rank of the first job reads k batches; rank 0's state is every rank's.
    first = [sampler_of(r0)(r, w0) for r in range(w0)]
    states = []
    for s in first:
        it = iter(s)
        for _ in range(k):
            next(it)
        states.append(json.loads(json.dumps(s.state_dict())))
    assert all(st_ == states[0] for st_ in states) and len(json.dumps(states[0])) < 1024

    def resumed(rank, world):
        s = sampler_of(r1)(rank, world)
        s.load_state_dict(states[0], skip_steps=skip)
        return s

    # The last global batch may be padded, and the padding depends on the
    # data-parallel ranks: its samples from the order are compared.
    n = sum(blocks)

    def unpadded(batches, first):
        return [b[: n - (first + j) * g] for j, b in enumerate(batches)]

    after_resume = global_batches(resumed, w1, r1)
    assert unpadded(after_resume, k + skip) == unpadded(whole[k + skip :], k + skip)


@settings(max_examples=60, deadline=None)
@given(
    blocks=blocks_st,
    seed=st.integers(0, 2**32),
    sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 9)), min_size=1, max_size=3),
)
def test_a_changed_global_batch_size_keeps_the_position(blocks, seed, sizes):
    """Runs of other global batch sizes: no sample read twice or skipped; the
    batches after a change start at the position the last run reached."""
    plan = SamplingPlan(blocks, 1, seed=seed)
    order = plan.epoch_order(0)
    n = len(order)
    progress = Progress(0)
    read: list[int] = []
    for i, (world, per_rank) in enumerate(sizes):
        g = world * per_rank
        deal = plan.deal(0, world, 1, progress, global_batch_size=g)
        steps = deal.num_batches if i == len(sizes) - 1 else deal.num_batches // 2
        for k in range(steps):
            batch = deal.global_batch(k).tolist()
            lo = progress.position + k * g
            assert batch[: n - lo] == order[lo : lo + g].tolist()
            read += batch
        progress = Progress(0, deal.end(steps), g)
    counts = Counter(read)
    assert set(counts) == set(range(plan.num_samples))
    assert sum(counts.values()) - len(counts) == deal.padded


def test_skip_steps_moves_past_global_batches_unread(tmp_path):
    sampler = data.PlanSampler(100, 1, seed=3, world_size=2, rank=1, global_batch_size=10)
    batches = list(sampler)
    state = sampler.state_dict(steps=2)
    assert state["position"] == 20
    sampler.load_state_dict(state, skip_steps=3)
    assert list(sampler) == batches[5:]
    sampler.load_state_dict(state, skip_steps=50)  # past the end: an empty epoch
    assert list(sampler) == []
    with pytest.raises(cachex.InvalidInputError, match="skip_steps"):
        sampler.load_state_dict(state, skip_steps=-1)


def test_replication_and_the_global_batch_must_divide_the_world():
    with pytest.raises(cachex.InvalidInputError, match="replication 2"):
        data.PlanSampler(100, 4, world_size=3, rank=0, replication=2)
    with pytest.raises(cachex.InvalidInputError, match="global_batch_size 10"):
        data.PlanSampler(100, 1, world_size=3, rank=0, global_batch_size=10)
    with pytest.raises(cachex.InvalidInputError, match="batch_size 4 is not"):
        data.IterableBatches([0] * 24, 4, blocks=24, world_size=2, rank=0, global_batch_size=12)


def test_an_old_state_is_read_at_an_epochs_start_and_refused_within_one():
    plan = SamplingPlan([4, 4], 2, seed=1)
    old = {
        "format": "cachex.sampling/1",
        **plan.identity(),
        "epoch": 3,
        "history": [],
    }
    assert plan.progress_of(old) == Progress(3, 0, 0)
    old["history"] = [[2, 1, 2, 1]]
    with pytest.raises(cachex.InvalidInputError, match=r"cachex\.sampling/1 state stopped within"):
        plan.progress_of(old)


def test_the_older_calls_still_work_or_say_what_to_give():
    plan = SamplingPlan(even_blocks(40, 4), 2, seed=5)
    deal = plan.deal(0, 4, 1, global_batch_size=12)
    assert deal.global_batch_size == 12 and deal.batch_size == 3
    # A run of 2 steps of 4 ranks x 3 is the position 24 of the global order.
    state = plan.state(Progress(0), Step(4, 2, 3, 2))
    assert (state["position"], state["global_batch_size"]) == (24, 12)
    assert plan.remaining(0, Progress(0, 24)).tolist() == plan.epoch_order(0)[24:].tolist()
    assert plan.deal(0, 2, 1, []).start == 0  # an empty history is an epoch's start
    with pytest.raises(cachex.InvalidInputError, match="history of runs"):
        plan.remaining(0, [Step(2, 1, 2, 1)])
