"""W6's peer line: W5's samples read cold from moto by MosaicML Streaming.

    python benches/python/w6_streaming.py [--n N] [--seed S] [--reps R]

Run it with a Python that has ``mosaicml-streaming`` (not in the test
venv: it pins its own torch), e.g.::

    python3 -m venv target/streaming-venv
    target/streaming-venv/bin/pip install mosaicml-streaming==0.13.0
    target/streaming-venv/bin/python benches/python/w6_streaming.py

W5's shape as ``workload w6`` publishes it (``N`` samples of 1 to 64 KiB,
about 167 MB for the default 5,000; sizes drawn here by Python's own
generator, so the bytes are not W6's but their count and spread are),
written with ``MDSWriter`` in 64 MB shards (Streaming's default size
limit) and uploaded to a bucket of a moto server started here
(``moto_server`` of ``CACHEX_VENV``, else ``target/py-venv``;
``CACHEX_S3_ENDPOINT`` names one already running instead). Each repetition
reads every sample once, in Streaming's shuffled order, through a fresh
``StreamingDataset`` (remote on moto, an empty local directory): the clock
covers construction and the whole pass, as W6's ``read_cold`` covers its
open and its read. Every sample's length is checked after the clock.

Prints one JSON line per repetition and a last one with the median
(``phase`` ``streaming_read_cold``, ``mb_per_s``): what W6's W5
``read_cold`` line on moto is compared with.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_moto() -> tuple[str, subprocess.Popen | None]:
    """The endpoint of a moto server, started here unless one is named."""
    if endpoint := os.environ.get("CACHEX_S3_ENDPOINT"):
        return endpoint, None
    venv = Path(os.environ.get("CACHEX_VENV", ROOT / "target" / "py-venv"))
    port = free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return f"http://127.0.0.1:{port}", proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto did not start")


def sample(i: int, size: int) -> bytes:
    return ((i * 31 + np.arange(size, dtype=np.uint64) * 7) % 256).astype(np.uint8).tobytes()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    import boto3
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    rng = np.random.default_rng(args.seed)
    sizes = rng.integers(1024, 65_536, size=args.n, endpoint=True).tolist()
    total = sum(sizes)
    endpoint, moto = start_moto()
    os.environ.update(
        S3_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1",
    )
    scratch = Path(tempfile.mkdtemp(prefix="w6-streaming-", dir=ROOT / "target"))
    try:
        out = scratch / "mds"
        with MDSWriter(out=str(out), columns={"blob": "bytes"}, size_limit="64mb") as w:
            for i, size in enumerate(sizes):
                w.write({"blob": sample(i, size)})
        bucket = f"cachex-w6-streaming-{os.getpid()}"
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket=bucket)
        shards = sorted(p for p in out.iterdir() if p.is_file())
        for p in shards:
            s3.upload_file(str(p), bucket, f"w5/{p.name}")
        remote = f"s3://{bucket}/w5"
        runs = []
        for rep in range(args.reps):
            clean_stale_shared_memory()
            local = scratch / f"local-{rep}"
            start = time.perf_counter()
            ds = StreamingDataset(
                remote=remote,
                local=str(local),
                shuffle=True,
                shuffle_seed=args.seed + rep,
                batch_size=1,
            )
            opened = time.perf_counter() - start
            got, count, first = 0, 0, None
            for s in ds:
                got += len(s["blob"])
                count += 1
                if first is None:
                    first = time.perf_counter() - start
            secs = time.perf_counter() - start
            if count != args.n or got != total:
                raise SystemExit(f"read {count} samples, {got} bytes; wrote {args.n}, {total}")
            del ds
            shutil.rmtree(local, ignore_errors=True)
            line = {
                "workload": "w6",
                "phase": "streaming_read_cold",
                "cache": "w5",
                "server": "moto",
                "rep": rep,
                "n": args.n,
                "bytes": total,
                "shards": len([p for p in shards if p.suffix == ".mds"]),
                "secs": secs,
                "open_s": opened,
                "first_sample_s": first,
                "mb_per_s": total / secs / 1e6,
            }
            runs.append(line)
            print(json.dumps(line), flush=True)
        med = statistics.median(r["secs"] for r in runs)
        print(
            json.dumps(
                {
                    "workload": "w6",
                    "phase": "streaming_read_cold",
                    "cache": "w5",
                    "server": "moto",
                    "n": args.n,
                    "bytes": total,
                    "median_secs": med,
                    "mb_per_s": total / med / 1e6,
                    "streaming": __import__("streaming").__version__,
                }
            ),
            flush=True,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if moto is not None:
            moto.kill()
            moto.wait()


if __name__ == "__main__":
    sys.exit(main())
