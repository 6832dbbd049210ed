"""Shared fixtures: the peer tools' caches and their expected contents."""

from __future__ import annotations

import json
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
