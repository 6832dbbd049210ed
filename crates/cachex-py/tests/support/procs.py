"""The processes a test starts, found and ended by pid (Linux ``/proc``).

A launcher such as ``torchrun`` starts each rank in a session of its own,
so a signal to the test's process group (``killpg``) never reaches them:
a test that starts one walks its tree of descendants by parent pid while
the launcher is still there, kills each process by pid, and checks that
none is left. A process is named by its pid *and* its start time, so a
pid reused meanwhile is never taken for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import NamedTuple

#: How long a killed process may take to be gone before a test fails.
GONE_WITHIN = 60.0


class Proc(NamedTuple):
    """A process: its pid and its start time (clock ticks after boot)."""

    pid: int
    start: int


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, start time)`` of ``pid``, or None if there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the
    # fields after it start past the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


def proc(pid: int) -> Proc | None:
    """The process ``pid`` now, or None if there is none."""
    stat = _stat(pid)
    return None if stat is None else Proc(pid, stat[2])


def tree(pid: int) -> list[Proc]:
    """``pid`` and every process descended from it, parents before children."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if (named := proc(p)) is not None:
            found.append(named)
        todo.extend(children.get(p, []))
    return found


def alive(p: Proc) -> bool:
    """Whether ``p`` still runs (a zombie, dead and not yet reaped, does not)."""
    stat = _stat(p.pid)
    return stat is not None and stat[2] == p.start and stat[0] not in "ZXx"


def kill_all(procs: list[Proc]) -> None:
    """SIGKILLs each of ``procs`` still alive, in order, by pid."""
    for p in procs:
        if alive(p):
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def left_alive(procs: list[Proc], within: float = GONE_WITHIN) -> list[Proc]:
    """Those of ``procs`` still alive after waiting ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while (left := [p for p in procs if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def end(popen: subprocess.Popen, within: float = GONE_WITHIN) -> list[Proc]:
    """Kills ``popen`` and every process under it (the tree found first,
    the launcher killed first, as a preemption does), reaps it, and returns
    those still alive after ``within`` seconds (none, or the test fails)."""
    job = tree(popen.pid)
    kill_all(job)
    try:
        popen.wait(timeout=within)
    except subprocess.TimeoutExpired:
        pass
    return left_alive(job, within)


@contextmanager
def ended(*processes: BaseProcess, within: float = GONE_WITHIN) -> Iterator[None]:
    """On leaving (an assertion failed, a queue timed out), each of the
    ``multiprocessing`` children ``processes`` that was started is joined
    within ``within`` seconds, and one still alive then is killed and
    reaped: none outlives the test (a non-daemon child left running would
    also hang the interpreter's exit, which joins them)."""
    try:
        yield
    finally:
        deadline = time.monotonic() + within
        for p in processes:
            if p.pid is not None:
                p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in processes:
            if p.pid is not None and p.is_alive():
                p.kill()
                p.join(timeout=within)
