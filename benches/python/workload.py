"""The workloads of ``BENCHMARKS.md`` through the Python API: the runner.

From the repository root, with ``cachex`` installed in the interpreter:
``python benches/python/workload.py <w1|w3|w4|w5|all> [--n N] [--seed S] [--dir D] [--api A]``
(``--api torchcachex`` / ``torchcachex-original``: W1 through
``w1_torchcachex.py``; ``--api loadit`` / ``loadit-original``: W3 through
``w3_loadit.py``). One file per workload (``w1.py`` .. ``w5.py``), as in the
Rust runner; ``report.py`` holds the line they print.
It prints one JSON object per line, as the Rust runner (``benches/``) does,
with ``"api": "python"``: ``workload``, ``phase``, ``n``, ``items_per_s``,
``mb_per_s``, ``peak_rss_bytes``. The machine limits (``limit``,
``fraction_of_limit``) are the Rust runner's job and are not repeated here.

Every value read is checked (a wrong value exits non-zero). Reads are batch
calls returning numpy views; as in the Rust runner, W1 checks a sample of
its batches outside the timed region, and the other workloads check every
value.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from report import WrongValueError
from w1 import w1
from w3 import w3
from w4 import w4
from w5 import w5

WORKLOADS: dict[str, tuple[Callable[[Path, int, int], None], int]] = {
    "w1": (w1, 200_000),
    "w3": (w3, 1_000_000),
    "w4": (w4, 20_000),
    "w5": (w5, 50_000),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benches/python/workload.py", description=__doc__)
    parser.add_argument("which", choices=[*WORKLOADS, "all"])
    parser.add_argument("--n", type=int, default=0, help="item count (default: each workload's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument(
        "--api",
        choices=["python", "torchcachex", "torchcachex-original", "loadit", "loadit-original"],
        default="python",
        help="python: cachex's own API; torchcachex / torchcachex-original: W1 through "
        "cachex.torchcachex / the real torchcachex (see w1_torchcachex.py); "
        "loadit / loadit-original: W3 through cachex.loadit / the real loadit "
        "(see w3_loadit.py)",
    )
    args = parser.parse_args(argv)
    workloads = dict(WORKLOADS)
    if args.api in ("torchcachex", "torchcachex-original"):
        if args.which != "w1":
            parser.error(f"--api {args.api} drives w1 only")
        from w1_torchcachex import w1_torchcachex

        def run_w1(root: Path, n: int, seed: int) -> None:
            w1_torchcachex(root, n, seed, args.api)

        workloads["w1"] = (run_w1, WORKLOADS["w1"][1])
    elif args.api in ("loadit", "loadit-original"):
        if args.which != "w3":
            parser.error(f"--api {args.api} drives w3 only")
        import w3_loadit

        workloads["w3"] = (
            functools.partial(w3_loadit.w3, api=args.api),
            WORKLOADS["w3"][1],
        )
    base = args.dir or Path(tempfile.mkdtemp(prefix="cachex-workload-py-"))
    names = list(WORKLOADS) if args.which == "all" else [args.which]
    try:
        for name in names:
            run, default_n = workloads[name]
            root = base / name
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            run(root, args.n or default_n, args.seed)
            shutil.rmtree(root, ignore_errors=True)
    except WrongValueError as e:
        print(f"wrong value: {e}", file=sys.stderr)
        return 1
    finally:
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
