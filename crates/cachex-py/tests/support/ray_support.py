"""What the ``test_ray_*`` modules share: Ray itself, one local cluster per module.

Ray is an optional extra (``cachex[ray]``). Without it the Ray tests skip
with a message, except under ``CI=true``, where the test venv must have it
(scripts/test installs it) and a missing Ray fails them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Ray's single-node cluster on the loopback address: Ray binds to the
# machine's own network address otherwise, and these tests send traffic to
# 127.0.0.1 only. Read when Ray is imported, so set before that.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

REPO = Path(__file__).resolve().parents[4]


def require_ray():
    """``ray`` and ``cachex.ray``, or a skip (a failure under CI=true)."""
    try:
        import ray

        import cachex.ray  # noqa: F401
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"ray is not installed in the CI venv: {e}", pytrace=False)
        pytest.skip(
            f"ray is not installed (pip install 'cachex[ray]'): {e}", allow_module_level=True
        )
    return ray


def start_cluster(ray, module: str):
    """A local Ray of two CPUs for one test module; yields, then shuts it down.

    The module's functions (and this module's) go to Ray's workers by
    value: the workers cannot import a test module.
    """
    ray.cloudpickle.register_pickle_by_value(sys.modules[module])
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    try:
        yield ray
    finally:
        ray.shutdown()


def run_cachex_verify(path: Path) -> subprocess.CompletedProcess:
    """``cachex verify <path>``, run.

    The CLI is ``target/debug/cachex`` (``cargo build -p cachex-cli``;
    ``scripts/test`` builds it with the workspace's tests), or ``$CACHEX_BIN``.
    """
    binary = Path(os.environ.get("CACHEX_BIN", REPO / "target" / "debug" / "cachex"))
    if not binary.exists():
        pytest.fail(f"{binary} is missing: cargo build -p cachex-cli", pytrace=False)
    return subprocess.run([str(binary), "verify", str(path)], capture_output=True, text=True)


def cachex_verify(path: Path) -> str:
    """``cachex verify <path>``'s output; fails the test when it finds a problem."""
    run = run_cachex_verify(path)
    assert run.returncode == 0, f"cachex verify {path}:\n{run.stdout}{run.stderr}"
    return run.stdout


def keyed_rows(batch: dict) -> dict:
    """Rows ``k<id>`` → ``id + [0, 1, 2, 3]`` (float32): the commit tests' records."""
    import numpy as np

    ids = batch["id"]
    return {
        "key": np.array([f"k{i}" for i in ids], dtype=object),
        "value": (ids[:, None] + np.arange(4)[None, :]).astype(np.float32),
    }


def keyed_dataset(ray, n: int, start: int = 0, blocks: int = 4):
    """Rows ``start .. start + n`` of :func:`keyed_rows`, in ``blocks``
    blocks (one write task each)."""
    return ray.data.range(n, override_num_blocks=blocks).map_batches(
        lambda b: keyed_rows({"id": b["id"] + start})
    )
