"""``python -m cachex.workload`` runs every workload at a small size and
prints the Rust runner's JSON lines with ``"api": "python"``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_every_workload_runs_and_checks_its_values(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "cachex.workload", "all", "--n", "300", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
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
    cmd = [sys.executable, "-m", "cachex.workload", "w3", "--api", api, "--n", "300"]
    out = subprocess.run(
        [*cmd, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert {line["phase"] for line in lines} == {
        "first_pass",
        "read_sequential",
        "read_random",
        "read_random_view",
        "read_random_budget",
    }
    assert all(line["api"] == label for line in lines)
