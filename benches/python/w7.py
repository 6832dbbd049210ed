"""W7 (``BENCHMARKS.md``): W5's page file read through the sampling plan under
``torchrun`` with 2 ranks, by each loader path -- 2 DataLoader workers a rank
(``ResumableDataLoader``), no workers, and ``ThreadedLoader``'s native
threads -- against one process reading the same bytes in the plan's order;
RSS over the epoch; MosaicML Streaming reading the same bytes under the same
launch (its own venv); the state's size and the time from a restart to its
first batch.

    python benches/python/w7.py [--n 50000] [--seed 0] [--dir DIR] [--batch 256]
                                [--workers 2] [--threads 2] [--output torch]
                                [--rounds 3]
                                [--streaming-python target/streaming-venv/bin/python]

Needs torch and the built ``cachex`` package; the peer line needs a Python
with ``mosaicml-streaming`` (``--streaming-python``; skipped, with a line
saying so, when it does not exist)::

    python3 -m venv target/streaming-venv
    target/streaming-venv/bin/pip install mosaicml-streaming==0.13.0

Prints one JSON line per figure: each path and the one-process read are
timed in each of ``--rounds`` rounds (an epoch lasts under a second here),
the ``ratio`` line is of the medians, with each round's ratios beside
them. Every byte each path delivered is checked
against W5's pattern after its clock (a second, untimed pass of the same
loader over the same epoch, on each rank). Standalone: the rank side is
this same file, started by torchrun with ``--rank-side`` (``--peer
streaming`` for Streaming's, run by its Python), and Streaming's MDS copy is
written by ``--write-mds``.
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
from typing import Any

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


def rss_of_tree(pid: int) -> dict[str, int]:
    """RSS of ``pid`` and every descendant (DataLoader workers), in bytes,
    by kind: ``anon`` (heap, batches), ``file`` (mapped files: the page
    cache the reads touched), ``shmem`` (shared-memory batches)."""
    total = {"anon": 0, "file": 0, "shmem": 0}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                kind = {"RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}.get(key)
                if kind:
                    total[kind] += int(value.split()[0]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def touch(batch: dict[str, Any]) -> tuple[int, int]:
    """Touches every byte of a batch's ``data`` (padded rows, or ragged
    values); its samples and payload bytes."""
    data = batch["data"]
    if "data_lengths" in batch:
        data.max()
        lengths = np.asarray(batch["data_lengths"])
        return len(lengths), int(lengths.sum())
    data.values.max()
    offsets = np.asarray(data.offsets)
    return len(offsets) - 1, int(offsets[-1] - offsets[0])


def check_bytes(seed: int, batch: dict[str, Any]) -> int:
    """Every byte of a batch against W5's pattern; the bytes checked."""
    ids, data = np.asarray(batch["id"]).tolist(), batch["data"]
    if "data_lengths" in batch:
        rows, lengths = np.asarray(data), np.asarray(batch["data_lengths"]).tolist()
        values = [rows[r, :n] for r, n in enumerate(lengths)]
    else:
        flat, offsets = np.asarray(data.values), np.asarray(data.offsets).tolist()
        values = [flat[offsets[r] : offsets[r + 1]] for r in range(len(ids))]
    for i, v in zip(ids, values, strict=True):
        if not np.array_equal(v, w5_pattern(seed, i, len(v))):
            raise SystemExit(f"w7: sample {i} differs from W5's bytes")
    return sum(len(v) for v in values)


# --- one rank (started by torchrun) ---------------------------------------------

#: The batch after which RSS is sampled first (the "first batches").
RSS_FIRST = 3


def rank_loader(args: argparse.Namespace) -> Any:
    from cachex.torch import PageDataset, ResumableDataLoader, ThreadedLoader

    pages = PageDataset(args.path, output=args.output, ragged=args.ragged)
    ds = pages.iterable(args.batch, seed=args.seed)
    if args.loader == "threaded":
        return ThreadedLoader(ds, threads=args.threads)
    ring = {"ring": True} if args.ring and args.workers else {}
    return ResumableDataLoader(ds, num_workers=args.workers, **ring)


def rank_side(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = rank_loader(args)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    state = loader.state_dict()
    dist.barrier()
    t0 = time.perf_counter()
    samples = nbytes = 0
    first = None
    rss_first = rss_end = rss_of_tree(os.getpid())
    last = len(loader)
    for steps, batch in enumerate(loader, 1):
        if first is None:
            first = time.perf_counter()
        n, b = touch(batch)
        samples, nbytes = samples + n, nbytes + b
        if steps == RSS_FIRST:
            rss_first = rss_of_tree(os.getpid())
        if steps == last:  # the workers are still there
            rss_end = rss_of_tree(os.getpid())
        if args.stop_after and steps == args.stop_after:
            Path(args.out, "state.json").write_text(json.dumps(loader.state_dict()))
            break
    elapsed = time.perf_counter() - t0
    checked = 0
    if not args.stop_after:
        # The same epoch again, untimed: every byte against W5's pattern.
        loader.load_state_dict(state)
        for batch in loader:
            checked += check_bytes(args.seed, batch)
    if hasattr(loader, "close"):
        loader.close()
    figures = [samples, nbytes, checked, *rss_first.values(), *rss_end.values()]
    n_t = torch.tensor(figures, dtype=torch.float64)
    dist.all_reduce(n_t)
    e_t = torch.tensor([elapsed])
    dist.all_reduce(e_t, op=dist.ReduceOp.MAX)
    if rank == 0:
        keys = [f"rss_{when}_{k}" for when in ("first", "end") for k in rss_first]
        Path(args.out, "rank0.json").write_text(
            json.dumps(
                {
                    "samples": n_t[0].item(),
                    "bytes": n_t[1].item(),
                    "checked_bytes": n_t[2].item(),
                    "secs": e_t.item(),
                    **{k: int(v) for k, v in zip(keys, n_t[3:].tolist(), strict=True)},
                    "first_batch_from_start": (first or t0) - started,
                    "first_batch_from_barrier": (first or t0) - t0,
                    "state_bytes": len(json.dumps(loader.state_dict())),
                }
            )
        )
    dist.destroy_process_group()


# --- MosaicML Streaming: the same bytes, the same launch (its own venv) ----------


def write_mds(args: argparse.Namespace) -> None:
    """W5's samples (the same bytes as the page file) as Streaming's MDS shards."""
    from streaming import MDSWriter

    sizes = np.random.default_rng(args.seed).integers(1024, 65537, args.n)
    done = Path(args.path, "index.json")
    if done.exists():
        return
    with MDSWriter(out=args.path, columns={"id": "int", "data": "bytes"}) as out:
        for i in range(args.n):
            out.write({"id": i, "data": w5_pattern(args.seed, i, int(sizes[i])).tobytes()})


def as_list(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Streaming's batch as is: its samples (bytes do not stack)."""
    return samples


def file_barrier(out: str, name: str, rank: int, world: int) -> None:
    """Waits until every rank reached ``name`` (Streaming's side has no
    process group: gloo's connections did not survive its start here)."""
    Path(out, f"{name}-{rank}").touch()
    while not all(Path(out, f"{name}-{r}").exists() for r in range(world)):
        time.sleep(0.01)


def streaming_side(args: argparse.Namespace) -> None:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = StreamingDataset(
        local=args.path, shuffle=True, shuffle_seed=args.seed, batch_size=args.batch
    )
    loader = DataLoader(
        ds,
        batch_size=args.batch,
        num_workers=args.workers,
        collate_fn=as_list,
        persistent_workers=args.workers > 0,
    )
    file_barrier(args.out, "ready", rank, world)
    t0 = time.perf_counter()
    samples = nbytes = 0
    rss_first = rss_of_tree(os.getpid())
    rss_end = rss_first
    last = len(loader)
    for steps, batch in enumerate(loader, 1):
        for s in batch:
            data = np.frombuffer(s["data"], dtype=np.uint8)
            data.max()  # touches every byte, as the cachex side does
            nbytes += len(data)
        samples += len(batch)
        if steps == RSS_FIRST:
            rss_first = rss_of_tree(os.getpid())
        if steps == last:  # the workers are still there
            rss_end = rss_of_tree(os.getpid())
    elapsed = time.perf_counter() - t0
    checked = 0
    for batch in loader:  # the same bytes again (its next epoch), untimed: every byte
        for s in batch:
            data = np.frombuffer(s["data"], dtype=np.uint8)
            if not np.array_equal(data, w5_pattern(args.seed, int(s["id"]), len(data))):
                raise SystemExit(f"w7: Streaming's sample {s['id']} differs from W5's bytes")
            checked += len(data)
    Path(args.out, f"streaming-rank{rank}.json").write_text(
        json.dumps(
            {
                "samples": samples,
                "bytes": nbytes,
                "checked_bytes": checked,
                "secs": elapsed,
                **{f"rss_first_{k}": v for k, v in rss_first.items()},
                **{f"rss_end_{k}": v for k, v in rss_end.items()},
            }
        )
    )
    file_barrier(args.out, "done", rank, world)


def streaming_ranks(out: Path) -> dict[str, Any]:
    """The ranks' figures as rank 0 of the cachex side sums them (the
    slowest rank's time)."""
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("streaming-rank*.json"))]
    total = {k: sum(r[k] for r in ranks) for k in ranks[0]}
    total["secs"] = max(r["secs"] for r in ranks)
    return total


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


def launch(script_args: list[str], nproc: int, python: str = sys.executable) -> float:
    t = time.perf_counter()
    cmd = [python, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc_per_node", str(nproc), __file__, "--rank-side", *script_args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def read_line(what: str, ranks: dict[str, Any], total: int, **extra: object) -> float:
    """Emits one path's line (every byte checked); its aggregate samples/s."""
    if ranks["bytes"] != total or ranks["checked_bytes"] != total:
        raise SystemExit(
            f"w7 {what}: read {ranks['bytes']}, checked {ranks['checked_bytes']} bytes, "
            f"the file holds {total}"
        )
    agg = ranks["samples"] / ranks["secs"]
    rss = {k: v for k, v in ranks.items() if k.startswith("rss_")}
    emit(
        what=what,
        samples=ranks["samples"],
        secs=ranks["secs"],
        samples_per_s=agg,
        gb_per_s=ranks["bytes"] / ranks["secs"] / 1e9,
        **rss,
        **extra,
    )
    return agg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", choices=["torch", "numpy"], default="torch")
    ap.add_argument("--ragged", action="store_true", help="bytes as cachex.Ragged, not padded")
    ap.add_argument("--ring", action="store_true", help="the workers' batch ring (ring=True)")
    ap.add_argument("--dir", default="")
    ap.add_argument(
        "--streaming-python",
        default=str(Path(__file__).resolve().parents[2] / "target/streaming-venv/bin/python"),
    )
    ap.add_argument("--rank-side", action="store_true")
    ap.add_argument("--peer", choices=["cachex", "streaming"], default="cachex")
    ap.add_argument("--write-mds", action="store_true")
    ap.add_argument("--loader", choices=["workers", "threaded"], default="workers")
    ap.add_argument("--path", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--resume", default="")
    ap.add_argument("--stop-after", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="timings of each path (medians)")
    args = ap.parse_args()
    if args.write_mds:
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # of earlier, killed runs
        write_mds(args)
        return
    if args.rank_side:
        (streaming_side if args.peer == "streaming" else rank_side)(args)
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
        threads=args.threads,
        output=args.output,
        ragged=args.ragged,
        ring=args.ring,
        load_average=os.getloadavg()[0],
    )
    common = ["--path", str(path), "--seed", str(args.seed), "--batch", str(args.batch)]
    common += ["--out", str(root), "--output", args.output, "--threads", str(args.threads)]
    common += [flag for flag, on in (("--ragged", args.ragged), ("--ring", args.ring)) if on]
    with_workers = [*common, "--workers", str(args.workers)]
    one_process(path, args.batch, args.seed)  # warms the page cache for every side alike
    # An epoch here lasts well under a second, so one timing is noisy: every
    # path and the one-process read are timed in each of --rounds rounds
    # (each round all of them, back to back), and the ratios are of medians.
    paths = (
        (f"read_2x{args.workers}", with_workers),
        ("read_2x0", [*common, "--workers", "0"]),
        ("read_threaded", [*common, "--loader", "threaded"]),
    )
    runs: dict[str, list[float]] = {what: [] for what, _ in paths}
    singles: list[float] = []
    for round_ in range(args.rounds):
        for what, extra in paths:
            launch_secs = launch(extra, 2)
            ranks = json.loads((root / "rank0.json").read_text())
            runs[what].append(read_line(what, ranks, total, launch_secs=launch_secs, round=round_))
        samples, nbytes, secs = one_process(path, args.batch, args.seed)
        if nbytes != total:
            raise SystemExit(f"w7: one process read {nbytes} bytes, the file holds {total}")
        singles.append(samples / secs)
        emit(
            what="read_one_process",
            samples=samples,
            secs=secs,
            samples_per_s=singles[-1],
            gb_per_s=nbytes / secs / 1e9,
            round=round_,
        )
    rates = {what: float(np.median(r)) for what, r in runs.items()}
    single = float(np.median(singles))
    peer = Path(args.streaming_python)
    streaming = None
    if peer.exists():
        mds = root / f"mds-{args.n}-{args.seed}"
        write = [str(peer), __file__, "--write-mds", "--path", str(mds)]
        subprocess.run([*write, "--n", str(args.n), "--seed", str(args.seed)], check=True)
        peer_args = ["--peer", "streaming", "--path", str(mds), "--seed", str(args.seed)]
        peer_args += ["--batch", str(args.batch), "--workers", str(args.workers)]
        for stale in [
            *root.glob("streaming-rank*.json"),
            *root.glob("ready-*"),
            *root.glob("done-*"),
        ]:
            stale.unlink()
        launch_secs = launch([*peer_args, "--out", str(root)], 2, python=str(peer))
        ranks = streaming_ranks(root)
        streaming = read_line(f"streaming_2x{args.workers}", ranks, total, launch_secs=launch_secs)
    else:
        emit(what=f"streaming_2x{args.workers}", skipped=f"no {peer}")
    emit(
        what="ratio",
        rounds=args.rounds,
        median_samples_per_s={**rates, "read_one_process": single},
        **{f"{k}_over_one_process": v / single for k, v in rates.items()},
        **{
            f"{k}_over_one_process_by_round": [a / b for a, b in zip(r, singles, strict=True)]
            for k, r in runs.items()
        },
        **({f"{k}_over_streaming": v / streaming for k, v in rates.items()} if streaming else {}),
    )
    # A job stopped after 20 steps (fewer on a small N), then restarted from its state.
    stop = max(1, min(20, args.n // (2 * args.batch) // 2))
    launch([*with_workers, "--stop-after", str(stop)], 2)
    state = root / "state.json"
    emit(what="state", bytes=state.stat().st_size)
    launch([*with_workers, "--resume", str(state), "--stop-after", "1"], 2)
    again = json.loads((root / "rank0.json").read_text())
    emit(
        what="restart",
        first_batch_from_rank_start=again["first_batch_from_start"],
        first_batch_after_load=again["first_batch_from_barrier"],
    )


if __name__ == "__main__":
    main()
