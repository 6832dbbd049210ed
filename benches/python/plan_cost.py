"""The sampling plan's cost (``BENCHMARKS.md``, "Plan cost"): numpy only, no store.

    python benches/python/plan_cost.py [--n N] [--streams S] [--epochs E]

For ``N`` samples (default 10 million) in ``S`` streams (default 5) of
unequal sizes, blocks of 1,000 samples, proportions 0.3 / 0.25 / 0.2 /
0.15 / 0.1 (a down-sampled and an up-sampled stream among them), it
prints one JSON line per measured phase (:func:`report.emit`'s form, with
``secs`` and ``cpu_secs``):

``mixture_epoch``
    One epoch's order of the mixture (:meth:`cachex.streams.MixturePlan.epoch_order`),
    a fresh plan per epoch so nothing is cached; one line per epoch.
``single_epoch``
    One epoch's order of one store of ``N`` samples (``SamplingPlan``).
``rank_order``
    Every sample one rank of 64 reads in an epoch of the mixture, in global
    batches of 4,096 (the epoch's order cached).
``state``
    The JSON bytes of a state dict of the mixture (``state_bytes``).

A measured value out of place (an order that is not a permutation, a
stream short of its count) prints ``{"wrong_value": ...}`` and exits 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from cachex.sampling import Progress, SamplingPlan, even_blocks
from cachex.streams import MixturePlan, Stream, stream_counts
from report import WrongValueError, emit, progress

WEIGHTS = (0.3, 0.25, 0.2, 0.15, 0.1)


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--streams", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    s = max(1, min(args.streams, len(WEIGHTS)))
    # Stream sizes unlike their proportions: stream 0 up-sampled, the last down-sampled.
    raw = np.array([1.0, 2.0, 1.5, 1.0, 2.5][:s])
    sizes = (raw / raw.sum() * args.n).astype(np.int64)
    sizes[-1] += args.n - int(sizes.sum())
    streams = [Stream(None, proportion=w) for w in WEIGHTS[:s]]
    counts = stream_counts(sizes, streams, seed=1)
    blocks = [even_blocks(int(n), 1000) for n in sizes]
    progress(f"plan_cost: {args.n} samples in {s} streams, per epoch {counts.tolist()}")
    for epoch in range(args.epochs):
        plan = MixturePlan(blocks, counts, 64, seed=7, global_batch_size=4096)
        order, secs, cpu = timed(lambda plan=plan, epoch=epoch: plan.epoch_order(epoch))
        if len(order) != int(counts.sum()):
            raise WrongValueError(f"epoch {epoch}: {len(order)} samples, not {counts.sum()}")
        got = np.bincount(plan.stream_of(order), minlength=s)
        if not np.array_equal(got, counts):
            raise WrongValueError(f"epoch {epoch}: streams {got.tolist()}, not {counts.tolist()}")
        emit("plan", "mixture_epoch", len(order), 8 * len(order), secs, cpu_secs=cpu, epoch=epoch)
    single = SamplingPlan(even_blocks(args.n, 1000), 64, seed=7)
    order, secs, cpu = timed(lambda: single.epoch_order(0))
    emit("plan", "single_epoch", len(order), 8 * len(order), secs, cpu_secs=cpu)
    deal = plan.deal(args.epochs - 1, 64, 4)
    mine, secs, cpu = timed(lambda: deal.rank_order(5))
    emit("plan", "rank_order", len(mine), 8 * len(mine), secs, cpu_secs=cpu)
    state = plan.state(Progress(args.epochs - 1, deal.end(100), 4096))
    size = len(json.dumps(state))
    emit("plan", "state", 1, size, 1.0, state_bytes=size)


if __name__ == "__main__":
    try:
        main()
    except WrongValueError as e:
        print(json.dumps({"wrong_value": str(e)}), flush=True)
        sys.exit(1)
