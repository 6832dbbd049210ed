"""W7 (``BENCHMARKS.md``): W5's page file read through the sampling plan under
``torchrun`` with 2 ranks x 2 DataLoader workers, against one process
reading the same bytes in the plan's order; the state's size and the time
from a restart to its first batch.

    python benches/python/w7.py [--n 50000] [--seed 0] [--dir DIR] [--batch 256]
                                [--workers 2] [--output torch]

Needs torch and the built ``cachex`` package. Prints one JSON line per
figure. Standalone: the rank side is this same file, started by torchrun
with ``--rank-side``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def w5_pattern(seed: int, i: int, size: int) -> np.ndarray:
    """W5's bytes of sample ``i`` (as benches/python/w5.py writes them)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) ^ (np.uint64(i) * np.uint64(0xBF58476D1CE4E5B9))
        z = (z ^ (z >> np.uint64(31))) * np.uint64(0x94D049BB133111EB)
        base = z ^ (z >> np.uint64(29))
        w = base + np.arange((size + 7) // 8, dtype=np.uint64) * GOLDEN
    return w.view(np.uint8)[:size]


def build(path: Path, n: int, seed: int) -> int:
    """W5's page file: ``n`` samples of 1 to 64 KiB; returns its payload bytes."""
    import cachex

    sizes = np.random.default_rng(seed).integers(1024, 65537, n)
    if not path.exists():
        writer = cachex.PageWriter(path, {"id": "int", "data": "bytes"})
        for k in range(0, n, 4096):
            writer.write_many(
                [
                    {"id": i, "data": w5_pattern(seed, i, int(sizes[i]))}
                    for i in range(k, min(n, k + 4096))
                ],
                threads=2,
            )
        writer.finalize()
    return int(sizes.sum())


def emit(**fields: object) -> None:
    print(json.dumps({"workload": "w7", **fields}), flush=True)


# --- one rank (started by torchrun) ---------------------------------------------


def rank_side(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    import torch
    import torch.distributed as dist

    from cachex.torch import PageDataset, ResumableDataLoader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = PageDataset(args.path, output=args.output).iterable(args.batch, seed=args.seed)
    loader = ResumableDataLoader(ds, num_workers=args.workers)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    dist.barrier()
    t0 = time.perf_counter()
    samples = nbytes = 0
    first = None
    for steps, batch in enumerate(loader, 1):
        if first is None:
            first = time.perf_counter()
        lengths = batch["data_lengths"]
        batch["data"].max()  # touches every byte of the batch
        samples += len(lengths)
        nbytes += int(np.asarray(lengths).sum())
        if args.stop_after and steps == args.stop_after:
            Path(args.out, "state.json").write_text(json.dumps(loader.state_dict()))
            break
    elapsed = time.perf_counter() - t0
    n_t = torch.tensor([samples, nbytes], dtype=torch.float64)
    dist.all_reduce(n_t)
    e_t = torch.tensor([elapsed])
    dist.all_reduce(e_t, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(args.out, "rank0.json").write_text(
            json.dumps(
                {
                    "samples": n_t[0].item(),
                    "bytes": n_t[1].item(),
                    "secs": e_t.item(),
                    "first_batch_from_start": (first or t0) - started,
                    "first_batch_from_barrier": (first or t0) - t0,
                    "state_bytes": len(json.dumps(loader.state_dict())),
                }
            )
        )
    dist.destroy_process_group()


# --- the driver --------------------------------------------------------------------


def one_process(path: Path, batch: int, seed: int) -> tuple[int, int, float]:
    """The same bytes, one process, in the plan's order (rank 0 then rank 1, as dealt)."""
    from cachex.torch import PageDataset

    ds = PageDataset(path)
    plan = ds.iterable(batch, seed=seed, rank=0, world_size=1).plan
    deal = plan.deal(0, 2, 2)
    out = ds.empty_batch(batch)
    samples = nbytes = 0
    t = time.perf_counter()
    for r in range(2):
        for w in range(2):
            for idx in deal.worker_batches(r, w):
                got = ds.batch(idx.tolist(), out=out)
                got["data"].max()
                samples += len(idx)
                nbytes += int(got["data_lengths"].sum())
    return samples, nbytes, time.perf_counter() - t


def launch(script_args: list[str], nproc: int) -> float:
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(nproc), __file__, "--rank-side", *script_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--output", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--dir", default="")
    ap.add_argument("--rank-side", action="store_true")
    ap.add_argument("--path", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--resume", default="")
    ap.add_argument("--stop-after", type=int, default=0)
    args = ap.parse_args()
    if args.rank_side:
        rank_side(args)
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="w7-"))
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"w5-{args.n}-{args.seed}.pages"
    total = build(path, args.n, args.seed)
    emit(
        what="setup",
        n=args.n,
        bytes=total,
        batch=args.batch,
        ranks=2,
        workers=args.workers,
        output=args.output,
    )
    common = ["--path", str(path), "--seed", str(args.seed), "--batch", str(args.batch)]
    common += [
        "--workers",
        str(args.workers),
        "--out",
        str(root),
        "--output",
        args.output,
    ]
    one_process(path, args.batch, args.seed)  # warms the page cache for both sides alike
    launch_secs = launch(common, 2)
    ranks = json.loads((root / "rank0.json").read_text())
    samples, nbytes, secs = one_process(path, args.batch, args.seed)
    if nbytes != total or ranks["bytes"] != total:
        raise SystemExit(f"w7: read {nbytes} / {ranks['bytes']} bytes, the file holds {total}")
    agg, single = ranks["samples"] / ranks["secs"], samples / secs
    emit(
        what=f"read_2x{args.workers}",
        samples=ranks["samples"],
        secs=ranks["secs"],
        samples_per_s=agg,
        gb_per_s=ranks["bytes"] / ranks["secs"] / 1e9,
        launch_secs=launch_secs,
    )
    emit(
        what="read_one_process",
        samples=samples,
        secs=secs,
        samples_per_s=single,
        gb_per_s=nbytes / secs / 1e9,
    )
    emit(what="ratio", torchrun_over_one_process=agg / single)
    # A job stopped after 20 steps, then restarted from its state.
    launch([*common, "--stop-after", "20"], 2)
    state = root / "state.json"
    emit(what="state", bytes=state.stat().st_size)
    launch([*common, "--resume", str(state)], 2)
    again = json.loads((root / "rank0.json").read_text())
    emit(
        what="restart",
        first_batch_from_rank_start=again["first_batch_from_start"],
        first_batch_after_load=again["first_batch_from_barrier"],
        samples=again["samples"],
    )


if __name__ == "__main__":
    main()
