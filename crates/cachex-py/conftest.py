"""Shared fixtures of every test folder under tests/: the peer tools'
caches and their expected contents, the S3 test server, torch's CI rule.

It sits beside pyproject.toml, not in tests/: pytest puts the folder of a
rootdir conftest on sys.path, and tests/ there would let tests/torch/ and
tests/ray/ pass for the packages where they are not installed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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


# --- the S3 test server (moto) that scripts/test starts --------------------------

#: Credentials the test server takes (it accepts any): set in the environment,
#: where real ones belong, never passed in `storage_options`.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "cachex-test",
    "AWS_SECRET_ACCESS_KEY": "cachex-test",
    "AWS_REGION": "us-east-1",
}


class S3:
    """A fresh bucket on the test server, and what a store needs to reach it."""

    def __init__(self, endpoint: str, bucket: str, tmp: Path) -> None:
        self.endpoint = endpoint
        self.bucket = bucket
        self.tmp = tmp
        #: The object store's options: where the server is, no credentials.
        self.options = {"aws_endpoint": endpoint, "aws_allow_http": True}

    def url(self, prefix: str) -> str:
        """``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket}/{prefix}"

    def tier(self, name: str) -> dict:
        """The keywords of a store on its own local tier ``name`` (a fresh
        tier stands for another machine)."""
        return {
            "tier_dir": str(self.tmp / f"tier-{name}"),
            "tier_budget": "1G",
            "storage_options": dict(self.options),
        }


_BUCKETS = iter(range(1 << 30))

# Set for the whole session, before any worker pool starts: a forkserver
# (started by the first DataLoader that asks for one) hands its children
# the environment it started with, not the one of the process asking.
if os.environ.get("CACHEX_S3_ENDPOINT"):
    for _key, _value in S3_ENV.items():
        os.environ.setdefault(_key, _value)


def s3_endpoint() -> str:
    """The test server's endpoint; a test without one skips, with the reason,
    except under ``CI=true``, where it fails."""
    endpoint = os.environ.get("CACHEX_S3_ENDPOINT")
    if endpoint:
        return endpoint
    reason = "CACHEX_S3_ENDPOINT not set: run scripts/test, which starts the S3 test server"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


@pytest.fixture
def s3(tmp_path: Path, monkeypatch) -> S3:
    """A fresh bucket on the S3 test server, with its credentials in the environment."""
    import urllib.request

    endpoint = s3_endpoint()
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    bucket = f"cachex-py-{os.getpid()}-{next(_BUCKETS)}-{os.urandom(3).hex()}"
    request = urllib.request.Request(f"{endpoint.rstrip('/')}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, f"create bucket {bucket}: {answer.status}"
    return S3(endpoint, bucket, tmp_path)
