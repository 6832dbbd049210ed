"""What every Python workload prints and how it fails: one JSON object per
measured phase on stdout (the Rust runner's line, with ``"api"``), progress
on stderr, and :class:`WrongValueError` for a value read back wrong."""

from __future__ import annotations

import json
import resource
import sys


class WrongValueError(Exception):
    """A read returned something other than what was written."""


def emit(workload: str, phase: str, n: int, nbytes: int, secs: float, **extra: object) -> None:
    secs = max(secs, 1e-9)
    line = {
        "workload": workload,
        "phase": phase,
        "n": n,
        "items_per_s": n / secs,
        "mb_per_s": nbytes / secs / 1e6,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "api": "python",
        **extra,
    }
    print(json.dumps(line), flush=True)


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
