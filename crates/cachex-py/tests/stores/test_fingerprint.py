"""cachex.compute_key / compute_fingerprint / stale_reason / validate."""

from __future__ import annotations

import os

import pytest

import cachex


def test_key_is_stable_and_ignores_dict_order():
    a = cachex.compute_key({"model": "resnet", "dim": 512, "aug": [1, 2]})
    b = cachex.compute_key({"aug": [1, 2], "dim": 512, "model": "resnet"})
    assert a == b and len(a) == 16 and int(a, 16) >= 0
    assert cachex.compute_key({"dim": 513, "model": "resnet", "aug": [1, 2]}) != a


def test_non_json_configs_are_refused():
    with pytest.raises(cachex.InvalidInputError):
        cachex.compute_key({"f": object()})
    with pytest.raises(cachex.InvalidInputError):
        cachex.compute_key(float("nan"))


def test_stale_reasons_name_the_field_and_the_file(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"1234")
    (tmp_path / "b.wav").write_bytes(b"xy")
    sources = [tmp_path / "a.wav", tmp_path / "b.wav"]
    old = cachex.compute_fingerprint({"sr": 16000}, sources, root=tmp_path, cache_version=1)
    assert [s["rel_path"] for s in old["sources"]] == ["a.wav", "b.wav"]
    assert cachex.stale_reason(old, old) is None
    cachex.validate(old, old)

    new_cfg = cachex.compute_fingerprint({"sr": 8000}, sources, root=tmp_path, cache_version=1)
    assert "sr" in cachex.stale_reason(old, new_cfg)

    (tmp_path / "a.wav").write_bytes(b"123456")
    os.utime(tmp_path / "a.wav", ns=(1, 1))
    changed = cachex.compute_fingerprint({"sr": 16000}, sources, root=tmp_path, cache_version=1)
    reason = cachex.stale_reason(old, changed)
    assert "a.wav" in reason and "b.wav" not in reason
    with pytest.raises(cachex.StaleError, match=r"a\.wav"):
        cachex.validate(old, changed)

    bumped = cachex.compute_fingerprint({"sr": 16000}, sources, root=tmp_path, cache_version=2)
    assert "version" in cachex.stale_reason(changed, bumped)


def test_check_dir_raises_stale_for_a_missing_fingerprint(tmp_path):
    fp = cachex.compute_fingerprint({"a": 1})
    with pytest.raises(cachex.StaleError, match=r"fingerprint\.json"):
        cachex.check_dir(tmp_path, fp)


def test_sources_outside_the_root_are_refused(tmp_path):
    with pytest.raises(cachex.CacheError):
        cachex.compute_fingerprint({}, ["/etc/hostname"], root=tmp_path)
