"""Real ``torchrun --standalone`` launches (gloo, CPU, 2 ranks x 2 DataLoader
workers; needs torch): the plan over a page file, a memmap array, a
segment store and an FFCV ``.beton``; a job killed with SIGKILL and restarted from its saved state
with the same and with a different world size and worker count; the
decorator with every rank writing into one cache. Each rank runs
tests/torch/torchrun_job.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import cachex

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/test installs it)")

import procs  # noqa: E402
from conftest import REPO  # noqa: E402

JOB = Path(__file__).with_name("torchrun_job.py")
CLI = REPO / "target" / "debug" / "cachex"
N = 96
TIMEOUT = 240  # seconds a launch may take before the test gives up on it


def torchrun(nproc: int, *args: str) -> list[str]:
    launcher = Path(sys.executable).with_name("torchrun")
    head = [str(launcher)] if launcher.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*head, "--standalone", "--nproc_per_node", str(nproc), str(JOB), *args]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run(nproc: int, *args: str) -> None:
    run_argv(torchrun(nproc, *args))


def run_argv(argv: list[str], cwd: Path | None = None) -> None:
    """Runs a job to its end; one that outlives ``TIMEOUT`` is killed, ranks and
    workers included (each by pid: torchrun starts ranks in sessions of their own)."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        left = procs.end(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the job outlived {TIMEOUT} s (left alive: {left}): {stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]


def run_until_stopped(nproc: int, out: Path, *args: str) -> None:
    """Launches, waits until every rank stopped after its steps, then SIGKILLs
    the launcher (as a preemption does) and every process of the job, each by
    pid, and checks that none is left: torchrun starts each rank in a session
    of its own, where no ``killpg`` of the launcher's group reaches it."""
    proc = subprocess.Popen(
        torchrun(nproc, *args),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + TIMEOUT
        while not all((out / f"stopped.rank{r}").exists() for r in range(nproc)):
            assert proc.poll() is None, f"the job ended early ({proc.returncode})"
            assert time.monotonic() < deadline, "the job never reached its stop"
            time.sleep(0.2)
        job = procs.tree(proc.pid)
    finally:
        left = procs.end(proc)
    # Each rank recorded itself and its DataLoader workers at its stop: the
    # walk of the launcher's tree found them all, and none outlived the kill.
    recorded = {
        int(pid)
        for r in range(nproc)
        for pid in (out / f"stopped.rank{r}.pids").read_text().split()
    }
    assert len(recorded) >= nproc * 2  # every rank, and at least one worker each
    assert recorded <= {p.pid for p in job}
    assert proc.returncode == -signal.SIGKILL
    assert not left, f"processes of the killed job still alive: {left}"


def batches(out: Path, store: str, nproc: int) -> dict[int, list[list[int]]]:
    """rank -> the ids of each batch it logged."""
    got = {}
    for r in range(nproc):
        lines = (out / f"{store}.rank{r}.jsonl").read_text().splitlines()
        got[r] = [json.loads(line)["ids"] for line in lines]
    return got


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    w = cachex.PageWriter(root / "a.pages", {"i": "int", "x": ("float32", (64,))}, page_size=4096)
    w.write_many([{"i": i, "x": np.full(64, i, np.float32)} for i in range(N)])
    w.finalize()
    m = cachex.MemmapWriter(root / "memmap", {"i": ("int64", (1,)), "x": ("float32", (4096,))})
    for i in range(N):
        m.write(f"s{i}", {"i": np.array([i]), "x": np.full(4096, i, np.float32)})
    m.finalize()
    keys = [f"k{i}" for i in range(N)]
    with cachex.SegmentStore(root / "segment", flush_every=16) as s:
        s.put_batch({k: {"i": np.array([i])} for i, k in enumerate(keys)})
    (root / "segment" / "keys.json").write_text(json.dumps(keys))
    # 32 KiB a sample: the .beton spans two 2 MiB pages (two plan blocks).
    beton = [{"i": i, "x": np.full(8192, i, np.float32)} for i in range(N)]
    cachex.write_beton(
        root / "a.beton", {"i": "int", "x": ("float32", (8192,))}, beton, page_size=1 << 21
    )
    return {
        "page": root / "a.pages",
        "memmap": root / "memmap",
        "segment": root / "segment",
        "beton": root / "a.beton",
    }


def test_two_ranks_with_two_workers_each_read_every_sample_once(stores, tmp_path):
    specs = ",".join(f"{k}:{p}" for k, p in stores.items())
    run(2, "read", "--stores", specs, "--out", str(tmp_path), "--batch-size", "8")
    for store in stores:
        got = batches(tmp_path, store, 2)
        ids = [set(i for b in got[r] for i in b) for r in range(2)]
        assert not ids[0] & ids[1], store  # disjoint
        assert sorted(ids[0] | ids[1]) == list(range(N)), store  # together, the whole set
        assert sum(len(b) for r in range(2) for b in got[r]) == N, store  # each once
        assert len(got[0]) == len(got[1]) == 6, store  # the same batches on every rank
        done = json.loads((tmp_path / f"{store}.done.rank0").read_text())
        assert done["len"] == 6
        totals = [json.loads(x)["total"] for x in (tmp_path / f"{store}.rank0.jsonl").open()]
        assert totals == [16] * 6  # the all-reduce of every step met both ranks


def test_a_killed_job_resumes_with_the_same_and_another_world_size(stores, tmp_path):
    page = f"page:{stores['page']}"
    # 2 ranks x 2 workers, killed after 3 steps; again after 3 more; then
    # 3 ranks x 1 worker finish the epoch (96 - 2*2*3*4 = 48 = 3 * 16).
    runs = [(2, 2, 3), (2, 2, 3), (3, 1, 0)]
    read: Counter = Counter()
    state = ""
    for k, (nproc, workers, stop) in enumerate(runs):
        out = tmp_path / f"run{k}"
        out.mkdir()
        args = ["read", "--stores", page, "--out", str(out), "--batch-size", "4"]
        args += ["--workers", str(workers), "--seed", "5"]
        args += ["--resume", state] if state else []
        if stop:
            run_until_stopped(nproc, out, *args, "--stop-after", str(stop))
        else:
            run(nproc, *args)
        got = batches(out, "page", nproc)
        assert {len(g) for g in got.values()} == {stop or 4}
        read.update(i for g in got.values() for b in g for i in b)
        saved = [json.loads((out / f"page.state.rank{r}.json").read_text()) for r in range(nproc)]
        assert all(s == saved[0] for s in saved)  # every rank holds the same state
        assert len(json.dumps(saved[0])) < 400  # a few numbers, not the samples
        state = str(out / "page.state.rank0.json")
    assert sorted(read) == list(range(N)) and set(read.values()) == {1}  # exactly once
    # The position in the global order: 2 runs of 3 global batches of 8, then 4 of 12.
    assert (saved[0]["epoch"], saved[0]["position"], saved[0]["global_batch_size"]) == (0, N, 12)


def global_batches(out: Path, nproc: int) -> list[list[list[int]]]:
    """The mixture's global batches a job logged: its ranks' batches joined, rank by rank."""
    ranks = [
        [json.loads(line)["rows"] for line in (out / f"mix.rank{r}.jsonl").read_text().splitlines()]
        for r in range(nproc)
    ]
    assert len({len(r) for r in ranks}) == 1
    return [[row for r in ranks for row in r[k]] for k in range(len(ranks[0]))]


def test_a_two_stream_mixture_resumed_on_another_world_size_reads_the_same_global_batches(
    stores, tmp_path
):
    """A page file (0.7) and a memmap array (0.3), 120 samples an epoch in
    global batches of 12: 2 ranks x 2 workers killed after 4 steps, resumed
    on 3 ranks x 1 worker, read what an uninterrupted job reads."""
    common = ["mix", "--page", str(stores["page"]), "--memmap", str(stores["memmap"])]
    common += ["--epoch-size", "120", "--global-batch", "12", "--seed", "3"]
    whole, stopped, resumed = (tmp_path / d for d in ("whole", "stopped", "resumed"))
    for d in (whole, stopped, resumed):
        d.mkdir()
    run(2, *common, "--out", str(whole), "--workers", "2")
    run_until_stopped(
        2, stopped, *common, "--out", str(stopped), "--workers", "2", "--stop-after", "4"
    )
    state = stopped / "mix.state.rank0.json"
    assert json.loads(state.read_text())["position"] == 48
    run(3, *common, "--out", str(resumed), "--workers", "1", "--resume", str(state))
    expect = global_batches(whole, 2)
    assert len(expect) == 10 and global_batches(stopped, 2) == expect[:4]
    assert global_batches(resumed, 3) == expect[4:]
    rows = [tuple(r) for b in expect for r in b]
    assert Counter(s for s, _ in rows) == {0: 84, 1: 36}  # 0.7 and 0.3 of 120
    assert len(set(rows)) == 120  # down-sampled: no sample twice in the epoch


def test_ranks_cache_into_one_store_and_hit_on_each_others_keys(tmp_path):
    run(2, "cache", "--out", str(tmp_path), "--samples", "64", "--batch-size", "8")
    results = [json.loads((tmp_path / f"cache.rank{r}.json").read_text()) for r in range(2)]
    if not CLI.exists():
        assert os.environ.get("CI") != "true", f"{CLI} missing: cargo build -p cachex-cli"
        pytest.skip(f"{CLI} is not built (cargo build -p cachex-cli)")
    pa = pytest.importorskip("pyarrow.ipc", reason="counting segment rows needs pyarrow")
    facade_dir = Path(results[0]["facade_dir"])
    for what, store_dir in (("calls", tmp_path / "embed"), ("facade_calls", facade_dir)):
        calls = [r[what] for r in results]
        assert sum(c[0] for c in calls) == 64, what  # epoch 0: each key computed by one rank
        assert [c[1] for c in calls] == [0, 0], what  # epoch 1: every key hit, whoever wrote it
        assert len(list((store_dir / "writers").iterdir())) >= 2, what  # one log per writer
        verify = subprocess.run([CLI, "verify", store_dir], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        keys: Counter = Counter()
        for seg in (store_dir / "segments").glob("*.arrow"):
            with pa.open_file(seg) as f:
                keys.update(f.read_all().column("key").to_pylist())
        assert sorted(keys) == sorted(f"k{i}" for i in range(64)), what
        assert set(keys.values()) == {1}, what  # every key present once
        shutil.rmtree(store_dir)


def test_readme_torchrun_example_resumes(tmp_path):
    text = (REPO / "crates" / "cachex-py" / "README.md").read_text()
    script = [b for b in re.findall(r"```py\n(.*?)```", text, flags=re.DOTALL) if "train.py" in b]
    commands = [
        line.split("#")[0].split()
        for b in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
        for line in b.splitlines()
        if line.startswith("torchrun ") and "train.py" in line
    ]
    assert len(script) == 1 and len(commands) == 2, "the Python guide lost its torchrun example"
    (tmp_path / "train.py").write_text(script[0])
    w = cachex.PageWriter(tmp_path / "train.pages", {"label": "int", "image": ("uint8", (8, 8))})
    w.write_many([{"label": i % 10, "image": np.full((8, 8), i, np.uint8)} for i in range(100)])
    w.finalize()
    m = cachex.MemmapWriter(tmp_path / "extra", {"tokens": ("int32", (16,))})
    for i in range(50):
        m.write(f"e{i}", {"tokens": np.full(16, i, np.int32)})
    m.finalize()
    states = []
    for cmd in commands:
        nproc = int(cmd[cmd.index("--nproc_per_node") + 1])
        rest = cmd[cmd.index("train.py") :]
        argv = torchrun(nproc)[:-1]  # the launcher and its options, without the job
        argv[argv.index("--nproc_per_node") + 1] = str(nproc)
        run_argv([*argv, *rest], cwd=tmp_path)
        states.append(json.loads((tmp_path / "state.json").read_text()))
    # 150 samples an epoch (105 pages, 45 rows), global batches of 12: 2 ranks
    # x 2 workers ran 3 of epoch 0; 3 ranks read its other 10, then epoch 1.
    assert (states[0]["epoch"], states[0]["position"]) == (0, 36)
    assert (states[1]["epoch"], states[1]["position"]) == (1, 150)
    assert states[1]["counts"] == [105, 45]
