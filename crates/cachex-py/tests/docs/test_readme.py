"""The Python guide (``crates/cachex-py/README.md``, the wheel's long
description) runs as written; the root README names the two commands a
newcomer runs."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO

#: The Python guide, whose ```python blocks these tests run.
GUIDE = REPO / "crates" / "cachex-py" / "README.md"


def readme_python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.DOTALL)


def test_the_root_readme_gives_the_demo_and_the_test_suite_commands():
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```\w*\n(.*?)```", text, flags=re.DOTALL)
    commands = [line.strip() for b in blocks for line in b.splitlines() if line.strip()]
    assert commands == [
        "cargo run --release -p cachex-cli --bin cachex -- demo",
        "scripts/test",
    ]
    assert "crates/cachex-py/README.md" in text, "the root README lost its pointer to the guide"


#: The bucket the README's object-storage session names.
README_BUCKET = "s3://my-bucket/"


def local_blocks() -> list[str]:
    """The blocks that need no object store."""
    return [b for b in readme_python_blocks() if README_BUCKET not in b]


def test_readme_session_runs(tmp_path, monkeypatch):
    blocks = local_blocks()
    assert blocks, "the guide has no ```python block"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "feature-cache" / "segments").is_dir()
    assert len(blocks) >= 2, "the guide lost its cachex.torchcachex block"
    assert list((tmp_path / "tcx-cache" / "features_v1" / "segments").glob("*.arrow"))


def test_readme_loadit_block_runs(tmp_path, monkeypatch):
    blocks = [b for b in local_blocks() if "cachex.loadit" in b]
    assert len(blocks) == 1, "the guide has no cachex.loadit ```python block"
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], str(GUIDE), "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "squares-cache" / "shards" / "0.100.shard.pickle").is_file()


def test_readme_object_storage_session_runs(s3, tmp_path, monkeypatch):
    """The README's `s3://` session against the S3 test server: its bucket
    is the test's, its endpoint and credentials come from the environment
    as the README says (`s3` sets the credentials)."""
    blocks = [b for b in readme_python_blocks() if README_BUCKET in b]
    assert len(blocks) == 1, "the guide has no s3:// ```python block"
    monkeypatch.setenv("AWS_ENDPOINT", s3.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.chdir(tmp_path)
    block = blocks[0].replace(README_BUCKET, f"s3://{s3.bucket}/")
    exec(compile(block, str(GUIDE), "exec"), {"__name__": "__readme__"})
    assert (tmp_path / "tier-b" / "work").is_dir()


def readme_as_module() -> str:
    """The README's Python blocks as one module, each block the body of its
    own function (blocks reuse names for values of different types)."""
    parts = ["from __future__ import annotations\n"]
    for k, block in enumerate(readme_python_blocks()):
        body = "".join(f"    {line}\n" if line.strip() else "\n" for line in block.splitlines())
        parts.append(f"\ndef readme_block_{k}() -> None:\n{body}")
    return "".join(parts)


def test_readme_examples_type_check_strictly(tmp_path):
    """`mypy --strict` over the README's Python, against the package's
    stubs (`_cachex.pyi`) and annotations: an example that a stub change
    breaks fails here."""
    src = tmp_path / "readme_examples.py"
    src.write_text(readme_as_module())
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(src)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
