"""The Python workload drivers (``benches/python/workload.py``, run from the
repository root as ``BENCHMARKS.md`` says) run every workload at a small size
against the installed package and print the Rust runner's JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

WORKLOAD = REPO / "benches" / "python" / "workload.py"


def run_workload(*args: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, str(WORKLOAD), *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_every_workload_runs_and_checks_its_values(tmp_path):
    lines = run_workload("all", "--n", "300", "--dir", str(tmp_path))
    phases = {(line["workload"], line["phase"]) for line in lines}
    assert {("w1", "read_random"), ("w3", "read_random_budget"), ("w4", "read_random")} <= phases
    assert ("w5", "read_batches") in phases
    for line in lines:
        assert line["api"] == "python"
        assert line["items_per_s"] > 0 and line["mb_per_s"] > 0 and line["peak_rss_bytes"] > 0


@pytest.mark.parametrize(
    ("api", "label"), [("loadit", "cachex.loadit"), ("loadit-original", "loadit")]
)
def test_w3_runs_through_cachex_loadit_and_the_real_loadit(tmp_path, api, label):
    if api == "loadit-original":
        pytest.importorskip("loadit", reason="the real loadit 0.0.8 is not installed")
    lines = run_workload("w3", "--api", api, "--n", "300", "--dir", str(tmp_path))
    assert {line["phase"] for line in lines} == {
        "first_pass",
        "read_sequential",
        "read_random",
        "read_random_view",
        "read_random_budget",
    }
    assert all(line["api"] == label for line in lines)


def test_w1_runs_through_cachex_torchcachex(tmp_path):
    lines = run_workload("w1", "--api", "torchcachex", "--n", "300", "--dir", str(tmp_path))
    assert {line["phase"] for line in lines} == {
        "write",
        "read_random",
        "write_dict",
        "read_random_dict",
    }
    assert all(line["api"] == "cachex.torchcachex" for line in lines)


def test_the_package_does_not_ship_the_drivers():
    import cachex

    package = Path(cachex.__file__).parent
    assert not list(package.rglob("*workload*"))
