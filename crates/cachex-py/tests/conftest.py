"""Shared fixtures: the peer tools' caches and their expected contents."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "crates" / "test-support" / "fixtures"


@pytest.fixture(scope="session")
def expected() -> dict:
    """``expected.json``: what a correct reader returns for every fixture item."""
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.fixture
def fixture_copy(tmp_path: Path):
    """Copies a fixture folder or file (relative to the fixtures root) into tmp.

    The fixtures are read-only: anything that may write opens a copy.
    """

    def copy(rel: str) -> Path:
        src = FIXTURES / rel
        dst = tmp_path / "fixture" / rel
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        return dst

    return copy


# --- torch: skipped where it is not installed, except under CI -----------------

#: The reason every torch test skips with when torch is missing.
TORCH_MISSING = "torch is not installed"


def _torch_skip_fails(report) -> bool:
    """Under ``CI=true`` a torch test must run: its skip for a missing torch is a failure."""
    return (
        os.environ.get("CI") == "true" and report.skipped and TORCH_MISSING in str(report.longrepr)
    )


def _fail(report) -> None:
    report.outcome = "failed"
    report.longrepr = (
        f"CI=true and {TORCH_MISSING}: install it (scripts/test does) ({report.longrepr})"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    if _torch_skip_fails(report):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    report = (yield).get_result()
    if _torch_skip_fails(report):
        _fail(report)
