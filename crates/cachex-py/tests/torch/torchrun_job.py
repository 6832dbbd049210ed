"""One rank of the jobs test_torchrun.py launches with ``torchrun`` (gloo, CPU).

``read``: each store in ``--stores`` read for one epoch through a
``ResumableDataLoader`` with ``--workers`` workers; every step all-reduces
the batch size (a rank with fewer batches would hang the others). Each
rank appends ``{"store", "step", "ids", "total"}`` lines to
``<out>/<store>.rank<r>.jsonl`` and writes the loader's state after every
step to ``<out>/<store>.state.rank<r>.json``. With ``--stop-after K`` the
ranks stop after K steps, record their pids and their workers' in
``<out>/stopped.rank<r>.pids``, say so in ``<out>/stopped.rank<r>``, and wait
to be killed. ``--resume FILE`` loads a state first.

``mix``: a mixture (:class:`cachex.torch.MixedDataset`) of the page file
``--page`` (stream 0, proportion 0.7) and the memmap array ``--memmap``
(stream 1, 0.3), ``--epoch-size`` samples an epoch, read in global batches
of ``--global-batch`` through a ``ResumableDataLoader``; each rank appends
``{"step", "rows"}`` lines (``rows``: ``[stream, i]`` of each row of its
batch, in order) to ``<out>/mix.rank<r>.jsonl``; ``--stop-after`` and
``--resume`` as for ``read``.

``cache``: the decorator (:func:`cachex.torch.rank_backend`): every rank computes its share
of the keys into one cache (writer id = rank), flushes, meets the others at
a barrier, refreshes, and reads the whole epoch again, recording how many
computations that needed (0: every key hit).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from cachex.torch import ResumableDataLoader
from cachex.torch import datasets as data


def dataset_of(spec: str, batch_size: int, seed: int) -> data.IterableBatches:
    kind, path = spec.split(":", 1)
    if kind == "page":
        return data.PageDataset(path).iterable(batch_size, seed=seed)
    if kind == "memmap":
        return data.MemmapDataset(path).iterable(batch_size, seed=seed)
    if kind == "beton":
        return data.BetonDataset(path, fields=["i"]).iterable(batch_size, seed=seed)
    if kind == "segment":
        keys = json.loads(Path(path, "keys.json").read_text())
        ds = data.SegmentDataset(path, keys)
        return ds.iterable(batch_size, seed=seed, blocks=ds.blocks(16))
    raise SystemExit(f"unknown store {kind!r}")


def mixture(args: argparse.Namespace) -> data.IterableBatches:
    from cachex import Stream
    from cachex.torch import MixedDataset

    mixed = MixedDataset(
        [
            Stream(args.page, proportion=0.7),
            Stream(data.MemmapDataset(args.memmap, arrays=["i"]), proportion=0.3),
        ],
        epoch_size=args.epoch_size,
    )
    return mixed.iterable(None, global_batch_size=args.global_batch, seed=args.seed)


def rows_of(batch: dict) -> list[list[int]]:
    """``[stream, i]`` of every row of a mixture's batch, in the batch's order."""
    stream = np.asarray(batch["stream"]).reshape(-1).tolist()
    ids = {s: iter(np.asarray(p["i"]).reshape(-1).tolist()) for s, p in batch["parts"].items()}
    return [[s, next(ids[s])] for s in stream]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def own_pids() -> list[int]:
    """This process and its children (the DataLoader's workers), from ``/proc``."""
    children = []
    for task in Path("/proc/self/task").iterdir():
        children += (task / "children").read_text().split()
    return [os.getpid(), *map(int, children)]


def read(args: argparse.Namespace, rank: int) -> None:
    out = Path(args.out)
    specs = ["mix:"] if args.job == "mix" else args.stores.split(",")
    for spec in specs:
        name = spec.split(":", 1)[0]
        planned = mixture(args) if name == "mix" else dataset_of(spec, args.batch_size, args.seed)
        loader = ResumableDataLoader(planned, num_workers=args.workers)
        if args.resume:
            loader.load_state_dict(json.loads(Path(args.resume).read_text()))
        loader.set_epoch(loader.epoch)
        log = (out / f"{name}.rank{rank}.jsonl").open("a")
        state_file = out / f"{name}.state.rank{rank}.json"
        steps = 0
        for batch in loader:
            if name == "mix":
                rows = rows_of(batch)
                ids = [i for _, i in rows]
            else:
                ids = np.asarray(batch["i"]).reshape(-1).tolist()
            total = torch.tensor([len(ids)])
            dist.all_reduce(total)
            steps += 1
            line = {"store": name, "step": steps, "ids": ids, "total": int(total)}
            if name == "mix":
                line["rows"] = rows
            log.write(json.dumps(line))
            log.write("\n")
            log.flush()
            write_atomic(state_file, json.dumps(loader.state_dict()))
            if args.stop_after and steps == args.stop_after:
                # Who to kill, for the test to check it found them all.
                write_atomic(out / f"stopped.rank{rank}.pids", " ".join(map(str, own_pids())))
                (out / f"stopped.rank{rank}").write_text(str(steps))
                while True:  # a preempted job: killed from outside
                    time.sleep(1)
        log.close()
        (out / f"{name}.done.rank{rank}").write_text(json.dumps({"len": len(loader)}))
        dist.barrier()


class Embed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += len(x)
        return x * 2 + 1


def cache(args: argparse.Namespace, rank: int) -> None:
    from cachex.torch import rank_backend, refresh_backend
    from cachex.torchcachex import CacheModuleDecorator

    n = args.samples
    backend = rank_backend(args.out, "embed", flush_every=16)
    model = Embed()
    cached = CacheModuleDecorator(model, backend)
    sampler = data.PlanSampler(n, args.batch_size, seed=args.seed)
    calls = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        before = model.calls
        for idx in sampler:
            x = torch.tensor(idx, dtype=torch.float32)[:, None].repeat(1, 4)
            y = cached(x, cache_ids=[f"k{i}" for i in idx])
            assert torch.equal(y, x * 2 + 1)
            ones = torch.ones(1)
            dist.all_reduce(ones)
        calls.append(model.calls - before)
        backend.flush()
        dist.barrier()
        refresh_backend(backend)
    backend.close()

    # The same through cachex.cached: multi_writer makes RANK the writer id.
    # Rank 0 creates the cache directory before the others open it.
    import cachex

    config = {
        "backend": "segment-store",
        "root": str(Path(args.out, "facade")),
        "name": "embed",
        "options": {"multi_writer": True, "flush_every": 16},
        "create_root": True,
    }
    if rank != 0:
        dist.barrier()

    @cachex.cached(config, id_of=lambda i: f"k{i}")
    def embed(ids: list[int]) -> list[np.ndarray]:
        return [np.full(4, 2 * i + 1, np.float32) for i in ids]

    if rank == 0:
        dist.barrier()
    facade_calls = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        before = embed.stats()["computed"]
        for idx in sampler:
            want = [np.full(4, 2 * i + 1, np.float32) for i in idx]
            assert all(map(np.array_equal, embed(idx), want))
        facade_calls.append(embed.stats()["computed"] - before)
        embed.flush()
        dist.barrier()
        embed.refresh()
    result = {"calls": calls, "facade_calls": facade_calls, "facade_dir": str(embed.cache.path)}
    Path(args.out, f"cache.rank{rank}.json").write_text(json.dumps(result))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=["read", "cache", "mix"])
    ap.add_argument("--stores", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=0)
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--resume", default="")
    ap.add_argument("--page", default="")
    ap.add_argument("--memmap", default="")
    ap.add_argument("--epoch-size", type=int, default=0)
    ap.add_argument("--global-batch", type=int, default=12)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        cache(args, rank) if args.job == "cache" else read(args, rank)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
