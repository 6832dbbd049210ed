"""``cachex.ray`` stays an extra: the core never imports Ray; without Ray it names the extra.

These run with or without Ray installed.
"""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_core_package_does_not_import_ray():
    done = run(
        "import sys, cachex, cachex.torch, cachex.facade, cachex.torchcachex, cachex.loadit\n"
        "assert 'ray' not in sys.modules, 'importing cachex imported ray'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_ray_cachex_ray_names_the_extra():
    done = run(
        "import sys\n"
        "sys.modules['ray'] = None  # as if Ray were not installed\n"
        "try:\n"
        "    import cachex.ray\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'cachex[ray]'" in done.stdout
