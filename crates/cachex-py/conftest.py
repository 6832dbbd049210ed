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


# --- the object-store test servers that scripts/test starts (scripts/test-servers) ---

#: Credentials the test servers take: set in the environment, where real ones
#: belong, never passed in `storage_options`. moto takes any; Azurite takes its
#: one account with the key Microsoft publishes for the emulator.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "cachex-test",
    "AWS_SECRET_ACCESS_KEY": "cachex-test",
    "AWS_REGION": "us-east-1",
}
AZURE_ENV = {
    "AZURE_STORAGE_ACCOUNT_NAME": "devstoreaccount1",
    "AZURE_STORAGE_ACCOUNT_KEY": (
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
    ),
}
#: The Azure container scripts/test-servers creates, where each test takes a
#: fresh prefix.
AZURE_CONTAINER = "cachex"
#: fake-gcs-server takes any bearer token.
GCS_ENV = {"GOOGLE_BEARER_TOKEN": "cachex-test"}


class Remote:
    """A fresh root on one object-store test server, and what a store needs
    to reach it."""

    def __init__(self, root: str, options: dict, tmp: Path) -> None:
        #: ``s3://<bucket>``, ``az://cachex/<prefix>``: no other test writes there.
        self.root = root
        self.tmp = tmp
        #: The object store's options: where the server is, no credentials.
        self.options = options

    def url(self, prefix: str) -> str:
        """``<root>/<prefix>``."""
        return f"{self.root}/{prefix}"

    def tier(self, name: str) -> dict:
        """The keywords of a store on its own local tier ``name`` (a fresh
        tier stands for another machine)."""
        return {
            "tier_dir": str(self.tmp / f"tier-{name}"),
            "tier_budget": "1G",
            "storage_options": dict(self.options),
        }


class S3(Remote):
    """A fresh bucket on the S3 test server."""

    def __init__(self, endpoint: str, bucket: str, tmp: Path) -> None:
        super().__init__(f"s3://{bucket}", {"aws_endpoint": endpoint, "aws_allow_http": True}, tmp)
        self.endpoint = endpoint
        self.bucket = bucket


_BUCKETS = iter(range(1 << 30))

# Set for the whole session, before any worker pool starts: a forkserver
# (started by the first DataLoader that asks for one) hands its children
# the environment it started with, not the one of the process asking.
for _var, _env in (
    ("CACHEX_S3_ENDPOINT", S3_ENV),
    ("CACHEX_AZURE_ENDPOINT", AZURE_ENV),
    ("CACHEX_GCS_ENDPOINT", GCS_ENV),
):
    if os.environ.get(_var):
        for _key, _value in _env.items():
            os.environ.setdefault(_key, _value)


def server_endpoint(var: str, name: str) -> str:
    """The endpoint of the test server in ``var``; a test without one skips,
    with the reason, except under ``CI=true``, where it fails."""
    endpoint = os.environ.get(var)
    if endpoint:
        return endpoint
    reason = f"{var} not set: run scripts/test, which starts the {name} test server"
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {reason}")
    pytest.skip(reason)


def s3_endpoint() -> str:
    """The S3 test server's endpoint (see :func:`server_endpoint`)."""
    return server_endpoint("CACHEX_S3_ENDPOINT", "S3")


def _fresh_name() -> str:
    return f"cachex-py-{os.getpid()}-{next(_BUCKETS)}-{os.urandom(3).hex()}"


@pytest.fixture
def s3(tmp_path: Path, monkeypatch) -> S3:
    """A fresh bucket on the S3 test server, with its credentials in the environment."""
    import urllib.request

    endpoint = s3_endpoint()
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    bucket = _fresh_name()
    request = urllib.request.Request(f"{endpoint.rstrip('/')}/{bucket}", method="PUT")
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, f"create bucket {bucket}: {answer.status}"
    return S3(endpoint, bucket, tmp_path)


@pytest.fixture
def azure(tmp_path: Path, monkeypatch) -> Remote:
    """A fresh prefix in the container ``cachex`` on Azurite, with its
    credentials in the environment."""
    endpoint = server_endpoint("CACHEX_AZURE_ENDPOINT", "Azure")
    for k, v in AZURE_ENV.items():
        monkeypatch.setenv(k, v)
    options = {"azure_storage_endpoint": endpoint, "azure_allow_http": True}
    return Remote(f"az://{AZURE_CONTAINER}/{_fresh_name()}", options, tmp_path)


class Gcs(Remote):
    """A fresh bucket on the GCS emulator, which serves object_store's reads
    but takes none of its uploads (the XML API's ``PUT``): objects get there
    through :meth:`upload`, its JSON API."""

    def __init__(self, endpoint: str, bucket: str, tmp: Path) -> None:
        options = {"google_base_url": endpoint, "google_allow_http": True}
        super().__init__(f"gs://{bucket}", options, tmp)
        self.endpoint = endpoint
        self.bucket = bucket

    def upload(self, name: str, data: bytes) -> None:
        """Puts ``data`` as the object ``name`` (``uploadType=media``)."""
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        url = f"{self.endpoint}/upload/storage/v1/b/{self.bucket}/o?{query}"
        request = urllib.request.Request(url, data=data, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200, f"upload {name}: {answer.status}"

    def upload_tree(self, root: Path) -> None:
        """Puts every file under ``root``, named by its path under it."""
        for path in sorted(root.rglob("*")):
            if path.is_file():
                self.upload(path.relative_to(root).as_posix(), path.read_bytes())


@pytest.fixture
def gcs(tmp_path: Path, monkeypatch) -> Gcs:
    """A fresh bucket on the GCS emulator, with its token in the environment."""
    import json
    import urllib.request

    endpoint = server_endpoint("CACHEX_GCS_ENDPOINT", "GCS")
    for k, v in GCS_ENV.items():
        monkeypatch.setenv(k, v)
    bucket = _fresh_name()
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=cachex-test",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 200, f"create bucket {bucket}: {answer.status}"
    return Gcs(endpoint, bucket, tmp_path)


# Not GCS: its emulator (fake-gcs-server) refuses object_store's uploads, the
# XML API's ``PUT /<bucket>/<object>`` (RELIABILITY.md); reads run there in
# ``test_every_store_published_elsewhere_is_read_on_gcs``.
@pytest.fixture(params=["s3", "azure"])
def remote(request) -> Remote:
    """A fresh root on each object-store test server in turn (S3, Azure)."""
    return request.getfixturevalue(request.param)
